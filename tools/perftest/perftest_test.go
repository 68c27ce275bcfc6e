// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
)

func TestPingpongResult(t *testing.T) {
	// ibv_rc_pingpong -s 4096 -n 2 in the oob capture: 41984 us.
	got := PingpongResult(4096, 2, 41984*time.Microsecond)
	want := "16384 bytes in 0.04 seconds = 3.12 Mbit/sec\n2 iters in 0.04 seconds = 20992.00 usec/iter\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// ud_pingpong client: 4098.50 usec/iter shows the float division.
	got = PingpongResult(512, 2, 8197*time.Microsecond)
	if !strings.Contains(got, "= 4098.50 usec/iter") || !strings.Contains(got, "2048 bytes in 0.01 seconds = 2.00 Mbit/sec") {
		t.Errorf("got %q", got)
	}
}

func TestPingpongAddrLines(t *testing.T) {
	d := PingpongDest{QPN: 0x12, PSN: 0xcc47fe, GID: ib.GIDFromAddr(netipMust("10.77.0.2"))}
	if got, want := PingpongAddrLine(false, true, d), "  local address:  LID 0x0000, QPN 0x000012, PSN 0xcc47fe: GID ::ffff:10.77.0.2\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := PingpongAddrLine(true, false, d), "  remote address: LID 0x0000, QPN 0x000012, PSN 0xcc47fe, GID ::ffff:10.77.0.2\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestBenchOutputs checks the formatting against every result file the lab
// recorded: the pingpong lines and each perftest row, parsed and printed
// again, must come out byte for byte.
func TestBenchOutputs(t *testing.T) {
	for _, mtu := range []string{"bench-mtu1500", "bench-mtu9000"} {
		dir := labDir(t, "results", mtu)
		files, _ := filepath.Glob(filepath.Join(dir, "*.txt"))
		n := 0
		for _, f := range files {
			if strings.HasSuffix(f, "summary.txt") || strings.Contains(f, "rping") {
				continue
			}
			text, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.SplitAfter(string(text), "\n")
			for i, l := range lines {
				switch {
				case strings.Contains(l, " bytes in ") && i+1 < len(lines):
					var bytesN, iters int
					var sec, mbit, sec2, usec float64
					if _, err := fmt.Sscanf(l+lines[i+1], "%d bytes in %f seconds = %f Mbit/sec\n%d iters in %f seconds = %f usec/iter\n",
						&bytesN, &sec, &mbit, &iters, &sec2, &usec); err != nil {
						t.Fatalf("%s: %v", f, err)
					}
					// The elapsed time is whole microseconds: recover it
					// from usec/iter.
					el := time.Duration(usec*float64(iters)+0.5) * time.Microsecond
					if got := PingpongResult(bytesN/iters/2, iters, el); got != l+lines[i+1] {
						t.Errorf("%s: got %q, want %q", f, got, l+lines[i+1])
					}
					n++
				case strings.HasPrefix(l, " #bytes"):
					row := lines[i+1]
					p := &Params{ReportGbits: strings.Contains(l, "Gb/sec"), Latency: strings.Contains(l, "t_min")}
					if p.Latency {
						var s LatencyStats
						if _, err := fmt.Sscan(row, &s.Size, &s.Iters, &s.Min, &s.Max, &s.Typical, &s.Avg, &s.Dev, &s.P99, &s.P999); err != nil {
							t.Fatalf("%s: %v", f, err)
						}
						if got := s.Format(); got != row {
							t.Errorf("%s: got %q, want %q", f, got, row)
						}
					} else if got := reformatBW(t, p, row); got != row {
						t.Errorf("%s: got %q, want %q", f, got, row)
					}
					if got := ResultColumns(p); got != lines[i-1]+l {
						t.Errorf("%s: columns %q, want %q", f, got, lines[i-1]+l)
					}
					n++
				}
			}
		}
		if n < 20 {
			t.Errorf("%s: only %d result blocks checked", mtu, n)
		}
	}
}

func TestLatencyFrom(t *testing.T) {
	// 101 posts 10 us apart but two slow ones: those are the dropped tail.
	var posted []time.Duration
	var at time.Duration
	for i := 0; i < 101; i++ {
		posted = append(posted, at)
		switch i {
		case 10, 20:
			at += 1000 * time.Microsecond
		default:
			at += 10 * time.Microsecond
		}
	}
	s, err := LatencyFrom(2, posted, 2)
	if err != nil {
		t.Fatal(err)
	}
	// t_max and the percentiles land on the first dropped sample, as in
	// perftest (delta[measure_cnt]).
	if s.Min != 5 || s.Max != 500 || s.Typical != 5 || s.Avg != 5 || s.Dev != 0 || s.Samples != 98 || s.P99 != 500 {
		t.Errorf("%+v", s)
	}
	if _, err := LatencyFrom(2, posted[:3], 2); err == nil {
		t.Error("3 iterations accepted")
	}
}

func TestBWReportFrom(t *testing.T) {
	// 4 messages of 1 MiB, one every ms, completions signaled every 2.
	tm := BWTimes{}
	for i := 0; i < 4; i++ {
		tm.Posted = append(tm.Posted, time.Duration(i)*time.Millisecond)
		tm.Completed = append(tm.Completed, time.Duration(i+1)*time.Millisecond)
	}
	r := BWReportFrom(1<<20, 2, tm, false)
	if r.Iters != 4 || r.Size != 1<<20 {
		t.Errorf("%+v", r)
	}
	if d := r.BWAvg - 1000; d > 1e-6 || d < -1e-6 {
		t.Errorf("average %v MB/s, want 1000", r.BWAvg)
	}
	if r.BWPeak < r.BWAvg {
		t.Errorf("peak %v below average %v", r.BWPeak, r.BWAvg)
	}
	if d := r.MsgRate - 0.001; d > 1e-9 || d < -1e-9 {
		t.Errorf("message rate %v Mpps", r.MsgRate)
	}
}

func TestHeaderVariants(t *testing.T) {
	p := &Params{Verb: Send, Latency: false, Role: Server, Device: "eth0", NumQPs: 1, Conn: "RC", Transport: "IB",
		PCIeRelax: "OFF", UseEvent: true, RxDepth: 500, CQMod: 100, MTU: 4096, LinkType: "Ethernet", GIDIndex: -1}
	h := Header(p)
	for _, want := range []string{" Test with events. Using eth0_comp0\n", " RX depth        : 500\n", " Max inline data : 0[B]\n"} {
		if !strings.Contains(h, want) {
			t.Errorf("header lacks %q:\n%s", want, h)
		}
	}
	if strings.Contains(h, "GID index") || strings.Contains(h, "TX depth") {
		t.Errorf("header has lines it should not:\n%s", h)
	}
	if got := AddrLines(p, false, Dest{QPN: 0x11, PSN: 1}); got != " local address: LID 0000 QPN 0x0011 PSN 0x0001\n" {
		t.Errorf("address %q", got)
	}
	if Preamble(&Params{Verb: Read, Role: Client}) != Line {
		t.Error("read client preamble")
	}
}

func TestDestRoundTrip(t *testing.T) {
	d := Dest{LID: 1, OutReads: 0x80, QPN: 0xABCDEF, PSN: 0x123456, RKey: 0xdeadbeef, VAddr: 0x7fff00001000,
		GID: ib.GIDFromAddr(netipMust("fd77::3")), SRQN: 7}
	b := d.Marshal()
	if len(b) != DestSize {
		t.Fatalf("%d bytes", len(b))
	}
	got, err := ParseDest(b)
	if err != nil || got != d {
		t.Fatalf("got %+v, %v", got, err)
	}
	p := PingpongDest{LID: 2, QPN: 0x11, PSN: 0xFFFFFF, GID: d.GID}
	pb := p.Marshal()
	if len(pb) != PingpongMsgSize {
		t.Fatalf("%d bytes", len(pb))
	}
	if got, err := ParsePingpongDest(pb); err != nil || got != p {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, bad := range [][]byte{nil, b[:107], append(bytes.Clone(b[:107]), 'x'), bytes.Replace(b, []byte("abcdef"), []byte("abcdeg"), 1)} {
		if _, err := ParseDest(bad); !errors.Is(err, ErrBadRecord) {
			t.Errorf("ParseDest(%q): %v", bad, err)
		}
	}
}

func TestVersionTooOld(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		var v [16]byte
		copy(v[:], "5.60")
		b.Write(v[:])
		b.Read(v[:])
	}()
	c := NewConn(a, Server)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ExchangeVersions(ctx); !errors.Is(err, ErrVersion) {
		t.Errorf("got %v, want ErrVersion", err)
	}
}

func TestExchangeHonoursContext(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := NewConn(a, Server)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := c.HandShake(ctx, Dest{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Error("handshake outlived its context")
	}
}

func FuzzParseDest(f *testing.F) {
	f.Add(Dest{QPN: 0x13, PSN: 0x70b5a2, RKey: 0x451, VAddr: 0x561e4c602000, OutReads: 1}.Marshal())
	f.Add([]byte("0000:0080:000014:b7d11b:000005ed:0000564b8ebec000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\x00"))
	f.Add(make([]byte, DestSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDest(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// What parses must print back to something that parses the same.
		d2, err := ParseDest(d.Marshal())
		if err != nil || d2 != d {
			t.Fatalf("round trip: %+v → %+v, %v", d, d2, err)
		}
	})
}

func FuzzParsePingpongDest(f *testing.F) {
	f.Add([]byte("0000:000011:5fe11e:00000000000000000000ffff0a4d0003\x00"))
	f.Add(make([]byte, PingpongMsgSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePingpongDest(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		d2, err := ParsePingpongDest(d.Marshal())
		if err != nil || d2 != d {
			t.Fatalf("round trip: %+v → %+v, %v", d, d2, err)
		}
	})
}
