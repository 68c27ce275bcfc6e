package fpgacmd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// udpPair opens two devices on kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2 with kernel-chosen ports (no root, no clash with port 4791).
func udpPair(t *testing.T) (host, fdev *roce.Device) {
	t.Helper()
	lo, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	la, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(lo2, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Fatal(err)
	}
	if host, err = roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{lo}, Port: lb.LocalAddr().Port(), Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	if fdev, err = roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{lo2}, Port: la.LocalAddr().Port(), Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fdev.Close() })
	return host, fdev
}

func lastResult(t *testing.T, out string) Result {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line of %q: %v", out, err)
	}
	return r
}

// recv and send joined by two pipes, as a control script joins two
// processes: each reads the other's JSON line from its stdin.
func TestPipes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write bool
		hold  time.Duration
	}{{"send", false, 0}, {"write", true, 0}, {"slow-consumer", false, 2 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			host, fdev := udpPair(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Kernel pipes, buffered as between two processes.
			toSend, fromRecv := osPipe(t)
			toRecv, fromSend := osPipe(t)
			var recvOut, sendOut, frames bytes.Buffer
			const n = 300
			depth := 64
			if tc.hold > 0 {
				depth = 4
			}
			recvDone := make(chan error, 1)
			reg := prometheus.NewRegistry()
			go func() {
				_, err := Recv(ctx, host, RecvConfig{GIDIndex: -1, MaxPayload: 4096, Depth: depth, Count: n, Verify: true,
					Hold: tc.hold, Out: &frames, Write: tc.write, Metrics: reg}, toRecv, io.MultiWriter(&recvOut, fromRecv), quiet)
				recvDone <- err
			}()
			sr, err := Send(ctx, fdev, SendConfig{Count: n, Size: 1000, Channel: 3, Write: tc.write}, toSend, io.MultiWriter(&sendOut, fromSend))
			if err != nil {
				t.Fatalf("send: %v\n%s", err, sendOut.String())
			}
			if err := <-recvDone; err != nil {
				t.Fatalf("recv: %v\n%s", err, recvOut.String())
			}
			rr := lastResult(t, recvOut.String())
			// --metrics: the receive server's counters, as scraped.
			if got := gathered(t, reg, "fpga_server_frames_total"); got != n {
				t.Errorf("fpga_server_frames_total %v, want %d", got, n)
			}
			if rr.Frames != n || rr.Bytes != n*1000 || rr.Errors != 0 || rr.DataErrors != 0 || rr.Channels["3"] != n || frames.Len() != n*1000 {
				t.Fatalf("recv result %+v, %d bytes written", rr, frames.Len())
			}
			if sr.Frames != n || sr.Errors != 0 || lastResult(t, sendOut.String()).Frames != n {
				t.Fatalf("send result %+v", sr)
			}
			if tc.hold > 0 && (rr.RNRNAKs == 0 || sr.RNRNAKs == 0) {
				t.Fatalf("slow consumer: no RNR NAKs (recv %d, send %d)", rr.RNRNAKs, sr.RNRNAKs)
			}
			var hp Params
			json.Unmarshal([]byte(strings.SplitN(recvOut.String(), "\n", 2)[0]), &hp)
			if hp.Role != "host" || hp.QPN == 0 || hp.GID != "::ffff:127.0.0.1" || hp.MRRKey == 0 {
				t.Fatalf("host line %+v", hp)
			}
			t.Logf("recv %+v\nsend %+v", rr, sr)
		})
	}
}

// The command line: the FPGA's values from flags on the recv side, the
// host's JSON line on the send side's stdin.
func TestCommandLine(t *testing.T) {
	host, fdev := udpPair(t)
	devs := map[string]*roce.Device{"host0": host, "fpga0": fdev}
	saved := openFunc
	t.Cleanup(func() { openFunc = saved })
	openFunc = func(ctx context.Context, ifname string, kind netdev.LinkKind, log *slog.Logger) (*roce.Device, error) {
		return devs[ifname], nil
	}
	// The devices outlive the commands, which close them.
	hostLine := make(chan Params, 1)
	recvIn, recvInW := osPipe(t)
	var recvOut bytes.Buffer
	recvDone := make(chan int, 1)
	lw := &lineWatcher{ch: hostLine}
	go func() {
		recvDone <- run("recv", []string{"-i", "host0", "-count", "50", "-verify", "-depth", "16", "-max-payload", "4096", "-timeout", "20s"},
			recvIn, io.MultiWriter(&recvOut, lw), io.Discard)
	}()
	hp := <-hostLine
	hj, _ := json.Marshal(hp)
	var sendOut bytes.Buffer
	sendOutR, sendOutW := io.Pipe()
	go func() {
		// Relay the FPGA's values to recv as flags would: here through its stdin.
		b := make([]byte, 4096)
		n, _ := sendOutR.Read(b)
		recvInW.Write(b[:n])
		io.Copy(io.Discard, sendOutR)
	}()
	code := run("send", []string{"-i", "fpga0", "-count", "50", "-size", "64", "-timeout", "20s"},
		strings.NewReader(string(hj)+"\n"), io.MultiWriter(&sendOut, sendOutW), io.Discard)
	if code != 0 {
		t.Fatalf("send exit %d: %s", code, sendOut.String())
	}
	if code := <-recvDone; code != 0 {
		t.Fatalf("recv exit %d: %s", code, recvOut.String())
	}
	if r := lastResult(t, recvOut.String()); r.Frames != 50 || r.Bytes != 50*64 || r.DataErrors != 0 {
		t.Fatalf("recv %+v", r)
	}
	if code := run("send", []string{"-bogus"}, nil, io.Discard, io.Discard); code != 2 {
		t.Fatalf("bad flag: exit %d", code)
	}
}

// lineWatcher passes the first JSON line written to it on ch.
type lineWatcher struct {
	ch   chan Params
	buf  []byte
	done bool
}

func (w *lineWatcher) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	if i := bytes.IndexByte(w.buf, '\n'); i >= 0 {
		var p Params
		json.Unmarshal(w.buf[:i], &p)
		w.ch <- p
		w.done = true
	}
	return len(b), nil
}

func osPipe(t *testing.T) (*os.File, *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// gathered is the value of the metric name in reg (-1: absent).
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}
