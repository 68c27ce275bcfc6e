package interop

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// The Rogue RoCEv2 formats against rdma_rxe: interop/fpgaverbs (a small
// ibverbs program, built here against the host's libibverbs-dev and copied
// into the guest's share) plays the FPGA sending to the goroce server on
// rxeh0 over AF_XDP, and plays Rogue's server receiving from the Go
// emulator. Frame i has fpgaverbs' size and payload (fvSize, fvPattern).

func fvSize(i, mtu int) int {
	if i%50 == 49 {
		return mtu
	}
	return 1 + (i*997)%mtu
}

func fvPattern(b []byte, i int) []byte {
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(i))
	copy(b, n[:])
	return b
}

// fpgaLab builds fpgaverbs into the guest's share and opens the goroce
// device on rxeh0 (AF_XDP).
func fpgaLab(t *testing.T) (*rxelab.Lab, *rxelab.Guest, string, *roce.Device) {
	return fpgaLabLoss(t, 0)
}

// fpgaLabLoss is fpgaLab with a device that drops a fraction loss of the
// frames it receives and of those it sends (the lab's kernel has no netem).
func fpgaLabLoss(t *testing.T, loss float64) (*rxelab.Lab, *rxelab.Guest, string, *roce.Device) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("needs libibverbs-dev on the host to build interop/fpgaverbs")
	}
	out, err := exec.Command("lab/rxe-lab", "share", g.Name).Output()
	if err != nil {
		t.Fatalf("rxe-lab share: %v", err)
	}
	files := filepath.Join(strings.TrimSpace(string(out)), "files")
	if b, err := exec.Command("cc", "-O2", "-o", filepath.Join(files, "fpgaverbs"), "fpgaverbs/fpgaverbs.c", "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("building fpgaverbs: %v\n%s", err, b)
	}
	var dev *roce.Device
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	err = lab.InPeerNS(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if loss == 0 {
			dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Link: netdev.LinkXDP, Device: roce.Options{Logger: quiet}})
			return err
		}
		l, err := xdplink.Open(lab.PeerIf, xdplink.Options{Multibuffer: lab.MTU > 3000})
		if err != nil {
			return err
		}
		dev, err = netdev.OpenLink(&lossyLink{Link: l, loss: loss, rng: rand.New(rand.NewPCG(1, 2))},
			lab.PeerIf, roce.Options{Logger: quiet})
		return err
	})
	if err != nil {
		t.Fatalf("open %s: %v", lab.PeerIf, err)
	}
	t.Cleanup(func() { dev.Close() })
	return lab, g, files, dev
}

// lossyLink drops frames at random in both directions.
type lossyLink struct {
	link.Link
	loss float64
	mu   sync.Mutex
	rng  *rand.Rand
	keep [][]byte
}

func (l *lossyLink) drop() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64() < l.loss
}

func (l *lossyLink) ReadBatch(ctx context.Context, fn func([][]byte)) (int, error) {
	return l.Link.ReadBatch(ctx, func(frames [][]byte) {
		kept := frames[:0:0]
		for _, f := range frames {
			if !l.drop() {
				kept = append(kept, f)
			}
		}
		if len(kept) > 0 {
			fn(kept)
		}
	})
}

func (l *lossyLink) WriteBatch(frames [][]byte) (int, error) {
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if !l.drop() {
			kept = append(kept, f)
		}
	}
	if _, err := l.Link.WriteBatch(kept); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// readFields waits for a file the guest writes and returns its fields.
func readFields(t *testing.T, ctx context.Context, path string, min int) []string {
	for {
		if b, err := os.ReadFile(path); err == nil {
			if f := strings.Fields(string(b)); len(f) >= min {
				return f
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s from the guest", filepath.Base(path))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func atou(t *testing.T, s string) uint32 {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

// An rxe RC sender in the firmware's format (SEND WITH IMMEDIATE, or RDMA
// WRITE WITH IMMEDIATE into the slab) into the goroce server: every frame
// once, in order, byte-exact, with its channel, sizes 1 byte to the PMTU;
// a consumer holding frames makes RNR NAKs and loses nothing.
func TestFPGAServerFromRXE(t *testing.T) {
	testFPGAServerFromRXE(t, 0)
}

// The same with 1 % and 5 % of the frames lost on the path (both ways).
func TestFPGAServerFromRXELoss(t *testing.T) {
	for _, loss := range []float64{0.01, 0.05} {
		t.Run(fmt.Sprintf("%.0f%%", loss*100), func(t *testing.T) { testFPGAServerFromRXE(t, loss) })
	}
}

func testFPGAServerFromRXE(t *testing.T, loss float64) {
	lab, g, files, dev := fpgaLabLoss(t, loss)
	gidx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest has no GID for %v", g.Addr)
	}
	mtu := g.ActiveMTU
	pmtu, _ := ib.MTUFromBytes(mtu)
	for _, tc := range []struct {
		name  string
		write bool
		depth int
		hold  time.Duration
		n     int
	}{{"send", false, 64, 0, 2000}, {"write", true, 64, 0, 1000}, {"slow-consumer", false, 8, 2 * time.Millisecond, 300}} {
		if loss > 0 && tc.name != "send" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			s, err := fpga.NewServer(dev, 1, -1, mtu, tc.depth)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			if err := s.SetFPGAGID(ib.GIDFromAddr(g.Addr)); err != nil {
				t.Fatal(err)
			}
			if s.Addr() != lab.PeerAddr {
				t.Fatalf("server picked %v, want %v", s.Addr(), lab.PeerAddr)
			}
			tag := strconv.FormatInt(time.Now().UnixNano(), 36)
			host, fpgaF, gof := "host-"+tag, "fpga-"+tag, "go-"+tag
			// PyRogue programs the FPGA's send PSN with the host's SqPSN.
			err = os.WriteFile(filepath.Join(files, host+".tmp"), []byte(fmt.Sprintf("%d %d %s %d %d %d %d\n",
				s.QPN(), s.SqPSN(), s.GID(), s.MRAddr(), s.MRRKey(), s.MaxPayload(), s.Depth())), 0o644)
			if err == nil {
				err = os.Rename(filepath.Join(files, host+".tmp"), filepath.Join(files, host))
			}
			if err != nil {
				t.Fatal(err)
			}
			args := []string{"/mnt/lab/files/fpgaverbs", "send", "-d", "rxe0", "-g", strconv.Itoa(gidx), "-n", strconv.Itoa(tc.n),
				"-s", "0", "-m", strconv.Itoa(mtu), "-c", "1", "-o", "/mnt/lab/files/" + fpgaF, "-i", "/mnt/lab/files/" + host,
				"-G", "/mnt/lab/files/" + gof}
			if tc.write {
				args = append(args, "-w")
			}
			job := g.Start(ctx, args...)
			f := readFields(t, ctx, filepath.Join(files, fpgaF), 4)
			if err := s.CompleteConnection(ctx, atou(t, f[0]), s.SqPSN(), pmtu, 1); err != nil {
				t.Fatal(err)
			}
			var (
				mu   sync.Mutex
				next int
				bad  error
				held []fpga.Frame
				got  = make(chan struct{})
			)
			buf := make([]byte, mtu)
			base := dev.Counters()
			stop := make(chan struct{})
			defer close(stop)
			if tc.hold > 0 {
				go func() {
					for {
						select {
						case <-stop:
							return
						case <-time.After(tc.hold):
						}
						mu.Lock()
						h := held
						held = nil
						mu.Unlock()
						for _, f := range h {
							f.Release()
						}
					}
				}()
			}
			go s.Serve(ctx, func(fr fpga.Frame) {
				mu.Lock()
				defer mu.Unlock()
				i := next
				next++
				want := fvPattern(buf[:fvSize(i, mtu)], i)
				if bad == nil && (fr.Channel() != 1 || string(fr.Data()) != string(want)) {
					bad = fmt.Errorf("frame %d: channel %d, %d bytes (want %d) differ", i, fr.Channel(), fr.Len(), len(want))
				}
				if tc.hold > 0 {
					fr.Retain()
					held = append(held, fr)
				}
				if next == tc.n {
					close(got)
				}
			})
			if err := os.WriteFile(filepath.Join(files, gof), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			select {
			case <-got:
			case <-job.Done():
			case <-ctx.Done():
			}
			stdout, stderr, code, err := job.Wait()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || code != 0 || next != tc.n || bad != nil {
				t.Fatalf("sender exit %d (%v): %s%s; server got %d of %d frames (%v), stats %+v, err %v",
					code, err, stdout, stderr, next, tc.n, bad, s.Stats(), s.Err())
			}
			c := dev.Counters()
			if tc.hold > 0 && c.SendRNRErr == base.SendRNRErr {
				t.Fatalf("no RNR NAKs with a slow consumer: %v", c.Map())
			}
			t.Logf("%s: %d frames, %d bytes, RNR NAKs sent %d, out-of-sequence %d, duplicates %d; sender: %s", tc.name,
				s.FrameCount(), s.ByteCount(), c.SendRNRErr-base.SendRNRErr, c.OutOfSeqRequest-base.OutOfSeqRequest,
				c.DuplicateRequest-base.DuplicateRequest, strings.TrimSpace(string(stdout)))
		})
	}
}

// The Go emulator's frames are accepted by a real rxe receiver in Rogue's
// setup (receives posted before RTR, RQ PSN = the PSN the FPGA was told).
func TestFPGAEmulatorToRXE(t *testing.T) {
	_, g, files, dev := fpgaLab(t)
	gidx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest has no GID for %v", g.Addr)
	}
	mtu := g.ActiveMTU
	pmtu, _ := ib.MTUFromBytes(mtu)
	for _, write := range []bool{false, true} {
		t.Run(map[bool]string{false: "send", true: "write"}[write], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			const n, depth = 1000, 32
			tag := strconv.FormatInt(time.Now().UnixNano(), 36)
			recvF, emuF := "grecv-"+tag, "emu-"+tag
			args := []string{"/mnt/lab/files/fpgaverbs", "recv", "-d", "rxe0", "-g", strconv.Itoa(gidx), "-n", strconv.Itoa(n),
				"-s", "0", "-m", strconv.Itoa(mtu), "-c", "1", "-D", strconv.Itoa(depth), "-S", strconv.Itoa(mtu),
				"-o", "/mnt/lab/files/" + recvF, "-i", "/mnt/lab/files/" + emuF}
			if write {
				args = append(args, "-w")
			}
			job := g.Start(ctx, args...)
			f := readFields(t, ctx, filepath.Join(files, recvF), 6)
			ha, err := netip.ParseAddr(f[3])
			if err != nil {
				t.Fatal(err)
			}
			hg := ib.GIDFromAddr(ha)
			e, err := emulator.New(dev, emulator.Config{PMTU: pmtu, Write: write, RetryCnt: 7})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			mrAddr, _ := strconv.ParseUint(f[4], 10, 64)
			p, err := e.Connect(ctx, emulator.HostParams{QPN: atou(t, f[0]), GID: hg, RqPSN: atou(t, f[1]), SqPSN: atou(t, f[2]),
				MRAddr: mrAddr, MRRKey: atou(t, f[5]), MaxPayload: mtu, Depth: depth})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(files, emuF), []byte(fmt.Sprintf("%d %d %s\n", p.QPN, p.SqPSN, p.GID)), 0o644); err != nil {
				t.Fatal(err)
			}
			// The firmware's retry budget (3) is short: start once the
			// receiver is in RTS, as PyRogue enables the FPGA's data last.
			readFields(t, ctx, filepath.Join(files, recvF+".ready"), 0)
			buf := make([]byte, mtu)
			for i := 0; i < n; i++ {
				if err := e.Send(ctx, 1, fvPattern(buf[:fvSize(i, mtu)], i)); err != nil {
					t.Fatalf("frame %d: %v (emulator %+v)", i, err, e.Stats())
				}
			}
			if err := e.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, code, err := job.Wait()
			if err != nil || code != 0 || !strings.Contains(string(stdout), fmt.Sprintf("frames=%d ", n)) {
				t.Fatalf("rxe receiver exit %d (%v): %s%s; emulator %+v", code, err, stdout, stderr, e.Stats())
			}
			t.Logf("rxe receiver: %s; emulator %+v", strings.TrimSpace(string(stdout)), e.Stats())
		})
	}
}

// A reconnect: the server is stopped and a new one connects to an rxe
// sender that goes on at its old PSNs (an FPGA that was not reset). The new
// server must report it, not silently take nothing.
func TestFPGAStalePSNFromRXE(t *testing.T) {
	_, g, files, dev := fpgaLab(t)
	gidx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest has no GID for %v", g.Addr)
	}
	mtu := g.ActiveMTU
	pmtu, _ := ib.MTUFromBytes(mtu)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	newServer := func() *fpga.Server {
		s, err := fpga.NewServer(dev, 1, -1, mtu, 64)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		if err := s.SetFPGAGID(ib.GIDFromAddr(g.Addr)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	put := func(name, content string) {
		if err := os.WriteFile(filepath.Join(files, name+".tmp"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(files, name+".tmp"), filepath.Join(files, name)); err != nil {
			t.Fatal(err)
		}
	}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	host, host2, fpgaF, gof := "host-"+tag, "host2-"+tag, "fpga-"+tag, "go-"+tag
	s := newServer()
	put(host, fmt.Sprintf("%d %d %s\n", s.QPN(), s.SqPSN(), s.GID()))
	const n = 100
	jctx, stopJob := context.WithCancel(ctx)
	defer stopJob()
	job := g.Start(jctx, "/mnt/lab/files/fpgaverbs", "send", "-d", "rxe0", "-g", strconv.Itoa(gidx), "-n", strconv.Itoa(n),
		"-s", "64", "-m", strconv.Itoa(mtu), "-c", "1", "-o", "/mnt/lab/files/"+fpgaF, "-i", "/mnt/lab/files/"+host,
		"-G", "/mnt/lab/files/"+gof, "-R", "/mnt/lab/files/"+host2, "-N", "20")
	f := readFields(t, ctx, filepath.Join(files, fpgaF), 4)
	fpgaQPN := atou(t, f[0])
	if err := s.CompleteConnection(ctx, fpgaQPN, s.SqPSN(), pmtu, 1); err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	done := make(chan struct{})
	go s.Serve(ctx, func(fpga.Frame) {
		if got.Add(1) == n {
			close(done)
		}
	})
	put(gof, "")
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("first connection: %d of %d frames", got.Load(), n)
	}
	s.Stop()

	s2 := newServer()
	if err := s2.CompleteConnection(ctx, fpgaQPN, s2.SqPSN(), pmtu, 1); err != nil {
		t.Fatal(err)
	}
	var got2 atomic.Int32
	serr := make(chan error, 1)
	go func() { serr <- s2.Serve(ctx, func(fpga.Frame) { got2.Add(1) }) }()
	// PyRogue would program the FPGA with s2.SqPSN(); this one ignores it.
	put(host2, fmt.Sprintf("%d %d %s\n", s2.QPN(), s2.SqPSN(), s2.GID()))
	// rxe sends its window once at the stale PSNs and waits: Err reports
	// the mismatch (suspected; Serve ends only if the refusals go on).
	for !errors.Is(s2.Err(), fpga.ErrPSNMismatch) {
		select {
		case err := <-serr:
			if !errors.Is(err, fpga.ErrPSNMismatch) {
				t.Fatalf("Serve: %v, want ErrPSNMismatch", err)
			}
		case <-ctx.Done():
			t.Fatalf("a stale sender was not reported; counters %v", dev.Counters().Map())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Logf("reported: %v", s2.Err())
	if got2.Load() != 0 {
		t.Fatalf("%d frames from a sender at the wrong PSNs", got2.Load())
	}
	stopJob()
	stdout, stderr, _, _ := job.Wait()
	t.Logf("sender: %s%s", stdout, stderr)
}
