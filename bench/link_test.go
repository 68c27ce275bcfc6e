//go:build linux

package bench

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
)

var (
	duration = flag.Duration("linkbench.duration", 200*time.Millisecond,
		"how long each TestLinkTable case sends (use a few seconds for real figures)")
	kinds = flag.String("linkbench.kinds", "afxdp,udp", "links to measure")
)

func TestMain(m *testing.M) {
	if args := os.Getenv(envRocectl); args != "" {
		rocectlMain(args)
	}
	if cfg := os.Getenv(envPingpong); cfg != "" {
		pingpongMain(cfg)
	}
	if addr := os.Getenv(envUDPEcho); addr != "" {
		udpEchoMain(addr)
	}
	if cfg := os.Getenv(envUDPPing); cfg != "" {
		udpPingMain(cfg)
	}
	if role := os.Getenv(envRole); role != "" {
		roleMain(role)
	}
	if cfg := os.Getenv(envStream); cfg != "" {
		streamMain(cfg)
	}
	os.Exit(m.Run())
}

var sizes = []int{64, 1024, 2048, 4096}

// vethMTU fits a 4 KiB frame (and a 4096-MTU RoCE frame) on every case so
// that all sizes and both links see the same device configuration.
const vethMTU = 9000

func sizeName(n int) string {
	if n >= 1024 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

type row struct {
	kind, size, mode string
	tx, rx           result
	note             string
}

// roleEnv is the environment of a role process on one side of the pair.
func roleEnv(kind string, v *netnstest.Veth, peer *netnstest.Veth, size int, d time.Duration) []string {
	return []string{
		envKind + "=" + kind, envIf + "=" + v.Name, envLocal + "=" + v.Addr.Addr().String(),
		envRemote + "=" + peer.Addr.Addr().String(), envDstMAC + "=" + peer.HardwareAddr.String(),
		envSize + "=" + fmt.Sprint(size), envDuration + "=" + d.String(),
	}
}

// side is where a role process runs and the environment it gets.
type side struct {
	start func(*exec.Cmd) error
	env   []string
}

// measure runs one sender process in A and one receiver process in B of a
// fresh veth pair.
func measure(t *testing.T, kind string, size int, d time.Duration) row {
	return measureOn(t, netnstest.NewPair(t, vethMTU), kind, size, d)
}

// measureOn is measure on a given pair, so that a goroce figure can be
// taken on the same veth right after (each process detaches its link, and
// with it any XDP program, when it exits).
func measureOn(t *testing.T, p *netnstest.Pair, kind string, size int, d time.Duration) row {
	return measureSides(t, kind, size,
		side{p.A.Start, roleEnv(kind, p.VethA, p.VethB, size, d)},
		side{p.B.Start, roleEnv(kind, p.VethB, p.VethA, size, d)})
}

// measureLo runs a UDP-link sender on 127.0.0.1 and a receiver on
// 127.0.0.2, both in ns: the loopback's own frame ceiling.
func measureLo(t *testing.T, ns *netnstest.NS, size int, d time.Duration) row {
	env := func(local, remote string) []string {
		return []string{envKind + "=" + link.KindUDP, envIf + "=lo", envLocal + "=" + local, envRemote + "=" + remote,
			envDstMAC + "=00:00:00:00:00:00", envSize + "=" + fmt.Sprint(size), envDuration + "=" + d.String()}
	}
	return measureSides(t, link.KindUDP, size, side{ns.Start, env("127.0.0.1", "127.0.0.2")}, side{ns.Start, env("127.0.0.2", "127.0.0.1")})
}

// measureSides runs a receiver process, then a sender, and collects both
// results.
func measureSides(t *testing.T, kind string, size int, tx, rx side) row {
	r := row{kind: kind, size: sizeName(size)}
	recv, err := startRole(rx.start, "recv", rx.env...)
	if err != nil {
		r.note = err.Error()
		return r
	}
	sender, err := startRole(tx.start, "send", tx.env...)
	if err != nil {
		recv.finish()
		r.note = err.Error()
		return r
	}
	fmt.Fprintln(sender.stdin, "go")
	r.tx, err = sender.result()
	if err != nil {
		t.Errorf("sender: %v", err)
	}
	time.Sleep(200 * time.Millisecond) // let the receiver drain
	r.rx, err = recv.finish()
	if err != nil {
		t.Errorf("receiver: %v", err)
	}
	r.mode = r.tx.Mode
	return r
}

func rate(frames uint64, size int, d time.Duration) (pps, gbps float64) {
	if d <= 0 {
		return 0, 0
	}
	pps = float64(frames) / d.Seconds()
	return pps, pps * float64(size) * 8 / 1e9
}

// TestLinkTable measures every link at every frame size and prints a table.
// With the default duration it is a quick end-to-end check that both links
// move frames between namespaces; for figures use
// -args -linkbench.duration=3s (see README.md).
func TestLinkTable(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.SkipUnlessNetns(t)
	var rows []row
	for _, kind := range strings.Split(*kinds, ",") {
		for _, size := range sizes {
			t.Run(kind+"/"+sizeName(size), func(t *testing.T) {
				r := measure(t, kind, size, *duration)
				rows = append(rows, r)
				switch {
				case r.note != "" && kind == link.KindAFXDP:
					t.Skipf("AF_XDP link unavailable here: %s", r.note)
				case r.note != "":
					t.Fatal(r.note)
				case r.tx.Frames == 0 || r.rx.Frames == 0:
					t.Fatalf("sent %d, received %d frames (tx err %q, rx err %q)", r.tx.Frames, r.rx.Frames, r.tx.Err, r.rx.Err)
				case r.rx.Frames > r.tx.Frames:
					t.Fatalf("received %d frames, more than the %d sent", r.rx.Frames, r.tx.Frames)
				}
			})
		}
	}
	printTable(rows, *duration)
}

func printTable(rows []row, d time.Duration) {
	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("\nveth pair between two network namespaces, MTU %d, %v per case, %d CPUs, kernel %s\n",
		vethMTU, d, runtime.NumCPU(), unix.ByteSliceToString(u.Release[:]))
	fmt.Println("sender and receiver are separate processes; Gb/s counts whole Ethernet frames (no FCS, preamble or gap)")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "link\tframe\tsent pkt/s\tsent Gb/s\trecv pkt/s\trecv Gb/s\tloss\t")
	for _, r := range rows {
		if r.note != "" {
			fmt.Fprintf(w, "%s\t%s\tn/a\t\t\t\t\t %s\n", r.kind, r.size, r.note)
			continue
		}
		size := int(r.tx.Bytes / max(r.tx.Frames, 1))
		tp, tg := rate(r.tx.Frames, size, r.tx.Elapsed)
		// Received frames over the sender's interval: the receiver was
		// waiting before the first frame and drained after the last.
		rp, rg := rate(r.rx.Frames, size, r.tx.Elapsed)
		loss := 0.0
		if r.tx.Frames > 0 {
			loss = 100 * (1 - float64(r.rx.Frames)/float64(r.tx.Frames))
		}
		fmt.Fprintf(w, "%s\t%s\t%.0f\t%.2f\t%.0f\t%.2f\t%.1f%%\t\n", r.kind, r.size, tp, tg, rp, rg, loss)
	}
	w.Flush()
	for _, r := range rows {
		if r.mode != "" && r.size == sizeName(sizes[0]) {
			fmt.Printf("%s: %s\n", r.kind, r.mode)
		}
	}
}

// BenchmarkLink sends from the benchmark goroutine (its link opened inside
// namespace A) to a receiver process in namespace B. One op is one
// WriteBatch of 64 frames; the custom metrics give the frame rates.
func BenchmarkLink(b *testing.B) {
	netnstest.RequireRoot(b)
	netnstest.SkipUnlessNetns(b)
	for _, kind := range strings.Split(*kinds, ",") {
		for _, size := range sizes {
			b.Run(kind+"/"+sizeName(size), func(b *testing.B) { benchLink(b, kind, size) })
		}
	}
}

func benchLink(b *testing.B, kind string, size int) {
	p := netnstest.NewPair(b, vethMTU)
	recv, err := startRole(p.B.Start, "recv", roleEnv(kind, p.VethB, p.VethA, size, 0)...)
	if err != nil {
		b.Skipf("receiver: %v", err)
	}
	var l link.Link
	err = p.A.Do(func() (err error) {
		l, _, err = openLink(kind, p.VethA.Name, p.VethA.Addr.Addr())
		return err
	})
	if err != nil {
		recv.finish()
		b.Skipf("sender: %v", err)
	}
	defer l.Close()
	frames, err := buildFrames(size, l.HardwareAddr(), p.VethB.HardwareAddr, p.VethA.Addr.Addr(), p.VethB.Addr.Addr())
	if err != nil {
		b.Fatal(err)
	}
	var sent uint64
	b.ReportAllocs()
	b.SetBytes(int64(size * len(frames)))
	start := time.Now()
	for b.Loop() {
		n, _ := l.WriteBatch(frames)
		sent += uint64(n)
	}
	elapsed := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	rx, err := recv.finish()
	if err != nil {
		b.Fatalf("receiver: %v", err)
	}
	tp, tg := rate(sent, size, elapsed)
	rp, rg := rate(rx.Frames, size, elapsed)
	b.ReportMetric(tp, "sent-pkt/s")
	b.ReportMetric(tg, "sent-Gb/s")
	b.ReportMetric(rp, "recv-pkt/s")
	b.ReportMetric(rg, "recv-Gb/s")
}
