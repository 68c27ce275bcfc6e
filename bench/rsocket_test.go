//go:build linux

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
	"github.com/goroce/goroce/xdp"
)

var (
	rsLong   = flag.Bool("rsbench.long", os.Getenv("GOROCE_RSBENCH_LONG") != "", "rsocket table: 5 s per case instead of 1 s")
	rsRounds = flag.Int("rsbench.rounds", envInt("GOROCE_RSBENCH_ROUNDS", 1),
		"rsocket table: rounds per case (rsocket and TCP alternate; the table shows medians)")
	rsBusyPoll = flag.Duration("rsbench.busypoll", 0, "rsocket table: roce.Options.BusyPoll (0: the default)")
	rsBuffer   = flag.Int("rsbench.buffer", 0, "rsocket table: SO_SNDBUF and SO_RCVBUF of both ends (0: librdmacm's defaults, 128 KiB buffers)")
	rsCases    = flag.String("rsbench.cases", "throughput,latency", "rsocket table: cases to run")
)

// rsPair is a stream connection between the two namespaces of a veth
// pair: client in A, server in B.
type rsPair struct{ c, s net.Conn }

// rsocketPair opens goroce (AF_XDP) in both namespaces and connects an
// rsocket from A to B.
func rsocketPair(t *testing.T, p *netnstest.Pair) rsPair {
	t.Helper()
	open := func(v *netnstest.Veth) *roce.Device {
		var d *roce.Device
		err := v.NS.Do(func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err = netdev.Open(ctx, v.Name, netdev.Options{Link: netdev.LinkXDP, Device: roce.Options{BusyPoll: *rsBusyPoll}})
			return err
		})
		if errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	da, db := open(p.VethA), open(p.VethB)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := rsocket.Options{SendBuffer: *rsBuffer, ReceiveBuffer: *rsBuffer}
	lc := rsocket.ListenConfig{Options: o}
	l, err := lc.Listen(ctx, db, "tcp", ":7471")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.AcceptRsocket(ctx)
		acc <- c
	}()
	dl := rsocket.Dialer{Options: o}
	c, err := dl.Dial(ctx, da, "tcp", netip.AddrPortFrom(p.VethB.Addr.Addr(), 7471).String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return rsPair{c, s}
}

// tcpPair connects kernel TCP from A to B over the same kind of veth.
func tcpPair(t *testing.T, p *netnstest.Pair) rsPair {
	t.Helper()
	var l net.Listener
	if err := p.B.Do(func() (err error) {
		l, err = net.Listen("tcp4", ":7472")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	var c net.Conn
	if err := p.A.Do(func() (err error) {
		c, err = net.Dial("tcp4", netip.AddrPortFrom(p.VethB.Addr.Addr(), 7472).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return rsPair{c, s}
}

// stream writes 64 KiB writes from c for d and returns the receiver's Gb/s.
func stream(t *testing.T, cp rsPair, d time.Duration) float64 {
	buf := make([]byte, 64<<10)
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, cp.s)
		got <- n
	}()
	start := time.Now()
	for time.Since(start) < d {
		if _, err := cp.c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	cp.c.(interface{ CloseWrite() error }).CloseWrite()
	n := <-got
	return float64(n*8) / time.Since(start).Seconds() / 1e9
}

// pingPong runs 64-byte request/response rounds for d and returns the
// median and mean one-way latency in µs (half the round trip).
func pingPong(t *testing.T, cp rsPair, d time.Duration) (median, mean float64) {
	go func() {
		b := make([]byte, 64)
		for {
			if _, err := io.ReadFull(cp.s, b); err != nil {
				return
			}
			if _, err := cp.s.Write(b); err != nil {
				return
			}
		}
	}()
	b := make([]byte, 64)
	var rtts []float64
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if _, err := cp.c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(cp.c, b); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, float64(time.Since(t0).Nanoseconds())/2000)
	}
	slices.Sort(rtts)
	var sum float64
	for _, r := range rtts {
		sum += r
	}
	return rtts[len(rtts)/2], sum / float64(len(rtts))
}

// TestRsocketTable measures an rsocket (goroce over AF_XDP) against kernel
// TCP between two namespaces on veth (MTU 9000), side by side in one run:
// stream throughput with 64 KiB writes and 64-byte ping-pong latency. With
// several rounds each round measures both, one after the other, on fresh
// connections, and the table shows the median of each figure and of the
// ratios.
func TestRsocketTable(t *testing.T) {
	d := time.Second
	if *rsLong {
		d = 5 * time.Second
	}
	rounds := max(*rsRounds, 1)
	type row struct {
		name          string
		rs, tc, ratio []float64
	}
	var rows []*row
	add := func(i int, name string, rs, tc float64) {
		if i == len(rows) {
			rows = append(rows, &row{name: name})
		}
		r := rows[i]
		r.rs, r.tc, r.ratio = append(r.rs, rs), append(r.tc, tc), append(r.ratio, rs/tc)
	}
	for round := 0; round < rounds; round++ {
		i := 0
		for _, kind := range strings.Split(*rsCases, ",") {
			// A subtest, so that the namespaces and devices of a case are
			// gone before the next.
			t.Run(fmt.Sprintf("%s/%d", kind, round), func(t *testing.T) {
				p := netnstest.NewPair(t, 9000)
				rs, tc := rsocketPair(t, p), tcpPair(t, p)
				switch kind {
				case "throughput":
					a, b := stream(t, rs, d), stream(t, tc, d)
					add(i, "stream 64 KiB writes (Gb/s)", a, b)
					i++
				case "latency":
					am, aa := pingPong(t, rs, d)
					bm, ba := pingPong(t, tc, d)
					add(i, "ping-pong 64 B, one-way median (us)", am, bm)
					add(i+1, "ping-pong 64 B, one-way mean (us)", aa, ba)
					i += 2
				default:
					t.Fatalf("unknown case %q", kind)
				}
			})
		}
	}
	var out string
	out += fmt.Sprintf("rsocket (goroce, AF_XDP) vs kernel TCP, two namespaces on veth MTU 9000, %v per case, %d round(s), load %s\n",
		d, rounds, loadAvg())
	out += fmt.Sprintf("%-38s %10s %10s %7s\n", "metric", "rsocket", "TCP", "ratio")
	for _, r := range rows {
		rs, tc := median(r.rs), median(r.tc)
		if rs <= 0 || tc <= 0 {
			t.Errorf("%s: no figure (%v, %v)", r.name, rs, tc)
		}
		out += fmt.Sprintf("%-38s %10.2f %10.2f %7.2f\n", r.name, rs, tc, median(r.ratio))
	}
	if rounds > 1 {
		out += "ratios per round:\n"
		for _, r := range rows {
			out += fmt.Sprintf("%-38s", r.name)
			for _, x := range r.ratio {
				out += fmt.Sprintf(" %.2f", x)
			}
			out += "\n"
		}
	}
	t.Log("\n" + out)
}
