// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/tools/perftest"
)

// -q runs the bandwidth tests on several QPs at once: every QP's record is
// exchanged and printed, each moves -n messages, and the report covers
// them all.
func TestLoopbackMultiQP(t *testing.T) {
	for _, verb := range []perftest.Verb{perftest.Write, perftest.Send, perftest.Read, perftest.Atomic} {
		t.Run(verb.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := PerfConfig{Verb: verb, Iters: 40, NumQPs: 3, GIDIndex: -1}
			if verb != perftest.Atomic {
				cfg.Size = 2048
			}
			var out bytes.Buffer
			client, server, err := Loopback(ctx, cfg, &out, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			o := out.String()
			if !strings.Contains(o, " Number of qps   : 3\t") || strings.Count(o, " local address:") != 3 ||
				strings.Count(o, " remote address:") != 3 {
				t.Errorf("header or addresses:\n%s", o)
			}
			if len(client) == 0 || client[0].BW == nil || client[0].Iters != 120 || client[0].BW.BWAvg <= 0 {
				t.Fatalf("client %+v", client)
			}
			if verb == perftest.Send && (len(server) == 0 || server[0].Iters != 120) {
				t.Errorf("server %+v", server)
			}
			if !strings.Contains(o, " 120        ") {
				t.Errorf("no row of 120 messages:\n%s", o)
			}
		})
	}
}

// -D bounds the run by time: the report counts the messages of its middle
// half and has no peak, on the sending and the receiving side.
func TestLoopbackDuration(t *testing.T) {
	for _, verb := range []perftest.Verb{perftest.Write, perftest.Send} {
		t.Run(verb.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// The measured middle half must see completions even when a
			// busy machine stalls the run for a few hundred milliseconds
			// (a resend timeout, a descheduled poster): 400 ms once left
			// it empty.
			cfg := PerfConfig{Verb: verb, Size: 1024, NumQPs: 2, Duration: 2 * time.Second, GIDIndex: -1}
			var out bytes.Buffer
			client, server, err := Loopback(ctx, cfg, &out, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if len(client) != 1 || client[0].BW == nil || client[0].Iters == 0 || client[0].BW.BWPeak != 0 || client[0].BW.BWAvg <= 0 {
				t.Fatalf("client %+v", client)
			}
			if verb == perftest.Send && (len(server) != 1 || server[0].Iters == 0) {
				t.Errorf("server %+v", server)
			}
		})
	}
}

// rowWatch is an io.Writer that reports on rows when a bandwidth row has
// been written.
type rowWatch struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	rows chan struct{}
}

func (w *rowWatch) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.HasPrefix(b, []byte(" 4096 ")) {
		select {
		case w.rows <- struct{}{}:
		default:
		}
	}
	return w.buf.Write(b)
}

func (w *rowWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// --run_infinitely prints a row every period until interrupted, then
// closes the test with the peer as usual.
func TestLoopbackRunInfinitely(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &rowWatch{rows: make(chan struct{}, 1)}
	cfg := PerfConfig{Verb: perftest.Write, Size: 4096, RunInfinitely: true, Duration: 100 * time.Millisecond, GIDIndex: -1}
	done := make(chan error, 1)
	go func() {
		_, _, err := Loopback(ctx, cfg, w, false)
		done <- err
	}()
	for range 2 {
		select {
		case <-w.rows:
		case err := <-done:
			t.Fatalf("ended before it was interrupted: %v\n%s", err, w.String())
		case <-time.After(time.Minute):
			t.Fatalf("no row:\n%s", w.String())
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%v\n%s", err, w.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("did not end when interrupted")
	}
	if n := strings.Count(w.String(), "\n 4096 "); n < 2 {
		t.Errorf("%d rows:\n%s", n, w.String())
	}
}

// -b runs both directions at once; each side prints the sum.
func TestLoopbackDuplex(t *testing.T) {
	for _, verb := range []perftest.Verb{perftest.Write, perftest.Read} {
		t.Run(verb.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			client, server, err := Loopback(ctx, PerfConfig{Verb: verb, Size: 4096, Iters: 50, Duplex: true, GIDIndex: -1}, &out, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if !strings.Contains(out.String(), "Bidirectional BW Test") {
				t.Errorf("header:\n%s", out.String())
			}
			// Own run, then the sum of both.
			for _, r := range [][]PerfResult{client, server} {
				if len(r) != 2 || r[0].BW == nil || r[1].BW == nil || r[1].BW.BWAvg <= r[0].BW.BWAvg {
					t.Fatalf("results %+v", r)
				}
			}
		})
	}
}

// -l posts lists, -I inline payloads, -u and -T reach the QP: the run
// completes and moves the right data (Loopback checks it).
func TestLoopbackPostListInline(t *testing.T) {
	for _, cfg := range []PerfConfig{
		{Verb: perftest.Write, Size: 64, Iters: 40, PostList: 4, Inline: 64},
		{Verb: perftest.Send, Size: 200, Iters: 40, PostList: 8, Inline: 256, NumQPs: 2},
		{Verb: perftest.Write, Size: 4096, Iters: 40, QPTimeout: 20, TOS: 0x28, HasTOS: true},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cfg.GIDIndex = -1
		var out bytes.Buffer
		client, _, err := Loopback(ctx, cfg, &out, false)
		cancel()
		if err != nil {
			t.Fatalf("%+v: %v\n%s", cfg, err, out.String())
		}
		if client[0].Iters != uint64(40*max(cfg.NumQPs, 1)) {
			t.Errorf("%+v: %+v", cfg, client[0])
		}
		if cfg.PostList > 1 && !strings.Contains(out.String(), "Post List BW Test") {
			t.Errorf("header:\n%s", out.String())
		}
	}
}

// -T sets the traffic class of the test QP's packets, over the Ethernet
// exchange, over rdma_cm (-R, where perftest takes it) and from a DCI:
// every frame of the test QP that the peer's device sees carries it.
func TestPerfTOSOnTheWire(t *testing.T) {
	for _, mode := range []string{"ethernet", "rdma_cm", "dc"} {
		t.Run(mode, func(t *testing.T) {
			da, db := udpPair(t)
			var capture bytes.Buffer
			if err := db.SetCapture(&capture); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			oobs := pairOOB(t)
			if mode == "rdma_cm" {
				oobs[0] = OOB{RDMACM: &RDMACM{Listen: netip.AddrPortFrom(netip.IPv4Unspecified(), DefaultPort), listening: make(chan struct{})}}
				oobs[1] = OOB{RDMACM: &RDMACM{Peer: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), DefaultPort)}}
			}
			const iters = 20
			cfg := PerfConfig{Verb: perftest.Write, Size: 1024, Iters: iters, GIDIndex: -1, TOS: 0x28, HasTOS: true, DC: mode == "dc"}
			errs := make(chan error, 1)
			go func() {
				_, err := Perf(ctx, db, oobs[0], cfg, &bytes.Buffer{}, false)
				if err != nil {
					cancel()
				}
				errs <- err
			}()
			if oobs[0].RDMACM != nil {
				<-oobs[0].RDMACM.listening
			}
			if _, err := Perf(ctx, da, oobs[1], cfg, &bytes.Buffer{}, false); err != nil {
				t.Fatal(err)
			}
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			db.SetCapture(nil)
			tos := map[byte]int{}
			b := capture.Bytes()
			for off := 24; off+16 <= len(b); {
				n := int(binary.LittleEndian.Uint32(b[off+8:]))
				f := b[off+16 : min(off+16+n, len(b))]
				off += 16 + n
				if len(f) >= 16 && f[12] == 0x08 && f[13] == 0x00 {
					tos[f[15]>>2]++
				}
			}
			// Over rdma_cm the CM's MADs and the control channel's SENDs
			// keep TOS 0; everything else is the test QP's.
			if tos[0x28>>2] < iters || mode != "rdma_cm" && len(tos) != 1 {
				t.Errorf("frames by DSCP: %v, want %d or more with %d", tos, iters, 0x28>>2)
			}
		})
	}
}

// pairOOB returns a server's and a client's OOB over loopback TCP.
func pairOOB(t *testing.T) [2]OOB {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return [2]OOB{{Listener: ln}, {Dial: DialRetry(ln.Addr().String(), time.Second)}}
}
