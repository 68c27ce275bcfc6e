// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// TestLoopbackAll runs every test through Loopback: both roles, the real
// out-of-band script, and the receiving side's data checked.
func TestLoopbackAll(t *testing.T) {
	for name, tc := range PerfTests {
		for _, rdmaCM := range []bool{false, true} {
			if rdmaCM {
				name += "/rdma_cm"
			}
			testLoopback(t, name, tc.Verb, tc.Latency, rdmaCM)
		}
	}
}

// testLoopback runs one test both ends in this process, connected by TCP
// or (-R) by rdma_cm.
func testLoopback(t *testing.T, name string, verb perftest.Verb, latency bool, rdmaCM bool) {
	tc := struct {
		Verb    perftest.Verb
		Latency bool
	}{verb, latency}
	{
		t.Run(name, func(t *testing.T) {
			if raceEnabled && tc.Verb == perftest.Write && tc.Latency {
				// perftest's write latency test spins on buffer memory the
				// peer's RDMA WRITEs fill; the device writes it from its own
				// goroutine with no synchronization the detector can see.
				t.Skip("write latency polls memory written by the device; not race-detector clean by design")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := PerfConfig{Verb: tc.Verb, Latency: tc.Latency, Iters: 50, GIDIndex: -1, RDMACM: rdmaCM}
			if !tc.Latency && tc.Verb != perftest.Atomic {
				cfg.Size = 8192
			}
			var out bytes.Buffer
			client, server, err := Loopback(ctx, cfg, &out, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if len(client) != 1 {
				t.Fatalf("client results %+v", client)
			}
			r := client[0]
			if r.Iters != 50 || r.Role != "client" || r.Test != testName(tc.Verb, tc.Latency) {
				t.Errorf("client result %+v", r)
			}
			if tc.Latency {
				if r.Lat == nil || r.Lat.Typical <= 0 || r.Lat.Min > r.Lat.Typical || r.Lat.Typical > r.Lat.Max {
					t.Errorf("latency %+v", r.Lat)
				}
			} else if r.BW == nil || r.BW.BWAvg <= 0 || r.BW.MsgRate <= 0 {
				t.Errorf("bandwidth %+v", r.BW)
			}
			// The passive server of write/read/atomic BW prints the
			// client's report: the same numbers.
			if !tc.Latency && tc.Verb != perftest.Send {
				if len(server) != 1 || server[0].BW == nil || *server[0].BW != *r.BW {
					t.Errorf("server results %+v, client %+v", server, r.BW)
				}
			}
			wants := []string{perftest.Line, " local address: ", " remote address: ", "Test\n", " rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n"}
			if rdmaCM {
				wants[len(wants)-1] = " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n"
			}
			for _, want := range wants {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestLoopbackJSON(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if _, _, err := Loopback(ctx, PerfConfig{Verb: perftest.Write, Size: 4096, Iters: 20, GIDIndex: -1, Gbits: true}, &out, true); err != nil {
		t.Fatal(err)
	}
	var r PerfResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if r.Test != "ib_write_bw" || r.Size != 4096 || r.Iters != 20 || r.BW == nil || r.BW.BWAvg <= 0 {
		t.Errorf("%+v", r)
	}
}

// TestLoopbackRunAll covers -a: every power of two from 2 bytes.
func TestLoopbackRunAll(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 23 sizes up to 8 MiB")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, _, err := Loopback(ctx, PerfConfig{Verb: perftest.Write, Iters: 5, GIDIndex: -1, RunAll: true}, io.Discard, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(client) != 23 || client[0].Size != 2 || client[22].Size != 1<<23 {
		t.Fatalf("%d results, first %d, last %d", len(client), client[0].Size, client[len(client)-1].Size)
	}
}

// udpPair opens two devices on kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2.
func udpPair(t *testing.T) (*roce.Device, *roce.Device) {
	t.Helper()
	lo, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	la, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(lo2, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.2: %v", err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{lo}, Port: lb.LocalAddr().Port(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{lo2}, Port: la.LocalAddr().Port(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// TestPingpongUDP runs both pingpong roles against each other: the
// exchange, the tools' lines and, since neither side echoes, no message
// comes back as the receiver's own pattern.
func TestPingpongUDP(t *testing.T) {
	for _, typ := range []roce.QPType{roce.RC, roce.UD} {
		for _, events := range []bool{false, true} {
			t.Run(typ.String()+map[bool]string{false: "", true: "/events"}[events], func(t *testing.T) {
				da, db := udpPair(t)
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cfg := PingpongConfig{Type: typ, Size: 1000, Iters: 20, Events: events, GIDIndex: -1}
				type res struct {
					r   *PingpongResult
					out string
					err error
				}
				ch := make(chan res, 1)
				go func() {
					var out bytes.Buffer
					r, err := Pingpong(ctx, db, OOB{Listener: ln}, cfg, &out)
					if err != nil {
						cancel()
					}
					ch <- res{r, out.String(), err}
				}()
				var out bytes.Buffer
				cr, err := Pingpong(ctx, da, OOB{Dial: DialRetry(ln.Addr().String(), time.Second)}, cfg, &out)
				s := <-ch
				if err != nil || s.err != nil {
					t.Fatalf("client %v, server %v\n%s\n%s", err, s.err, out.String(), s.out)
				}
				if cr.Remote != s.r.Local || s.r.Remote != cr.Local {
					t.Errorf("addresses: client %+v/%+v server %+v/%+v", cr.Local, cr.Remote, s.r.Local, s.r.Remote)
				}
				if cr.Received != 20 || s.r.Received != 20 {
					t.Errorf("received %d and %d", cr.Received, s.r.Received)
				}
				// Both send the same pattern, so each receives "its own".
				if cr.Echoed != 20 || s.r.Echoed != 20 {
					t.Errorf("pattern matched %d and %d times", cr.Echoed, s.r.Echoed)
				}
				for _, o := range []string{out.String(), s.out} {
					if !strings.Contains(o, "20 iters in ") || !strings.Contains(o, "  local address:  LID 0x0000, QPN ") {
						t.Errorf("output %q", o)
					}
				}
			})
		}
	}
}

func TestPerfFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "write-bw"},
		{nil, 2, "usage"},
		{[]string{"frob-bw"}, 2, "unknown test"},
		{[]string{"write-bw", "-R", "--loopback", "-n", "20", "-s", "1024"}, 0, "Data ex. method : rdma_cm"},
		{[]string{"write-bw", "-m", "1000", "--loopback"}, 2, "invalid MTU"},
		{[]string{"atomic-bw", "-s", "16", "--loopback"}, 2, "cannot be changed"},
		{[]string{"send-bw", "-a", "--loopback"}, 2, "not supported"},
		{[]string{"write-bw", "--loopback", "10.0.0.1"}, 2, "no server address"},
		{[]string{"write-bw", "a", "b"}, 2, "usage"},
		{[]string{"write-bw", "10.0.0.1"}, 1, "-d <interface> is required"},
		{[]string{"write-bw", "-n", "20", "-s", "1024", "--loopback", "--report_gbits", "-F"}, 0, "BW peak[Gb/sec]"},
	} {
		out.Reset()
		errOut.Reset()
		code := RunPerf(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("perf %q: exit %d, want %d and %q\nstdout %s\nstderr %s", c.args, code, c.code, c.want, out.String(), errOut.String())
		}
	}
}

// --cpuprofile profiles the main job too (--loopback runs apart from the
// path that opens a device).
func TestLoopbackCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	var out, errOut bytes.Buffer
	if code := RunPerf([]string{"write-bw", "-n", "20", "-s", "1024", "--loopback", "--cpuprofile", path}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out.String(), errOut.String())
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("no profile written: %v", err)
	}
}

func TestResolveIPv4(t *testing.T) {
	ctx := context.Background()
	for in, want := range map[string]string{"10.1.2.3": "10.1.2.3", "::ffff:10.1.2.3": "10.1.2.3", "localhost": "127.0.0.1"} {
		if a, err := resolveIPv4(ctx, in); err != nil || a.String() != want {
			t.Errorf("resolveIPv4(%q) = %v, %v; want %s", in, a, err, want)
		}
	}
	if a, err := resolveIPv4(ctx, "fd77::2"); err == nil {
		t.Errorf("resolveIPv4(fd77::2) = %v: perftest's rdma_cm mode is IPv4 only", a)
	}
}

func TestPingpongFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, "ibv_rc_pingpong"},
		{nil, 2, "usage"},
		{[]string{"xx"}, 2, "usage"},
		{[]string{"rc", "-m", "100"}, 2, "invalid MTU"},
		{[]string{"rc", "--link", "foo", "-d", "lo"}, 1, "unknown link"},
		{[]string{"ud", "-d", ""}, 1, "-d <interface> is required"},
	} {
		out.Reset()
		errOut.Reset()
		code := RunPingpong(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("pingpong %q: exit %d, want %d and %q\nstdout %s\nstderr %s", c.args, code, c.code, c.want, out.String(), errOut.String())
		}
	}
}

func TestParseInterspersed(t *testing.T) {
	f := newPerfFlags(io.Discard)
	pos, err := parseInterspersed(f.fs, []string{"-s", "10", "host", "-n", "3"})
	if err != nil || len(pos) != 1 || pos[0] != "host" || *f.size != 10 || *f.iters != 3 {
		t.Errorf("pos %q err %v size %d iters %d", pos, err, *f.size, *f.iters)
	}
}

func TestDefaults(t *testing.T) {
	c := PerfConfig{Verb: perftest.Send, Iters: 5}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	// perftest: TX depth and RX depth capped at the iterations, CQ
	// moderation at the TX depth, and 1 above 8 KiB messages.
	if c.TxDepth != 5 || c.RxDepth != 5 || c.CQMod != 1 || c.Size != 65536 {
		t.Errorf("%+v", c)
	}
	c = PerfConfig{Verb: perftest.Write, Size: 4096, Iters: 5000}
	c.defaults()
	if c.TxDepth != 128 || c.CQMod != 100 {
		t.Errorf("%+v", c)
	}
	c = PerfConfig{Verb: perftest.Read, Latency: true}
	c.defaults()
	if c.Size != 2 || c.TxDepth != 1 || c.Iters != 1000 {
		t.Errorf("%+v", c)
	}
}

func TestByteAt(t *testing.T) {
	b := make([]byte, 64)
	for i := range b {
		b[i] = byte(i)
	}
	for i := range b {
		if got := byteAt(b, i); got != byte(i) {
			t.Fatalf("byteAt(%d) = %d", i, got)
		}
	}
}

func BenchmarkLoopbackWriteBW(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if _, _, err := Loopback(ctx, PerfConfig{Verb: perftest.Write, Size: 65536, Iters: 200, GIDIndex: -1}, io.Discard, false); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}
