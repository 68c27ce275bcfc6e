//go:build linux

package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

var naaiceDur = flag.Duration("naaicebench.duration", 300*time.Millisecond, "time per NAAICE benchmark case")

// naaicePair opens a goroce device on each end of a veth pair (AF_XDP,
// MTU 3000: path MTU 2048 and every frame in one AF_XDP chunk), host on A,
// NAA on B, in one process.
func naaicePair(t *testing.T) (host, naa *roce.Device, naaAddr netip.Addr) {
	t.Helper()
	p := netnstest.NewPair(t, 3000) // skips unless root with netns support
	p.Resolve(t)
	return openXDP(t, p.VethA), openXDP(t, p.VethB), p.VethB.Addr.Addr()
}

type naaiceFig struct {
	name  string
	value float64
	unit  string
}

// TestNAAICETable measures, on one veth pair and in one run: an RPC round
// trip with 64-byte parameters against an RC SEND ping-pong of 64 bytes,
// and RPC throughput with a 4 MiB input against RC WRITEs of 4 MiB, each
// waited for one at a time as an RPC is; and the allocations per RPC.
//
//	go test ./bench -run TestNAAICETable -count=1 -v -args -naaicebench.duration=3s
func TestNAAICETable(t *testing.T) {
	host, naa, naaAddr := naaicePair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	srv := naaice.NewServer(naa, naaice.ServerOptions{})
	naaice.ExampleRoutines(srv)
	go srv.ListenAndServe(ctx, netip.AddrPortFrom(netip.IPv4Unspecified(), mrsp.ServerPort))
	remote := netip.AddrPortFrom(naaAddr, mrsp.ServerPort)
	time.Sleep(100 * time.Millisecond)

	var figs []naaiceFig
	// RPC round trip: one 64-byte region, input and output, function 3.
	small := make([]byte, 64)
	c := naaiceContext(t, ctx, host, remote, [][]byte{small}, func(c *naaice.Context) { c.SetInput(0); c.SetOutput(0) })
	rpcLat := timeOps(t, func() error { return c.DoRPC(ctx) })
	allocs := steadyAllocs(200, func() { _ = c.DoRPC(ctx) })
	c.Close()
	sendLat := sendPingPong(t, ctx, host, naa, naaAddr, 64)
	figs = append(figs, naaiceFig{"RPC round trip, 64 B in and out", rpcLat.Seconds() * 1e6, "µs"},
		naaiceFig{"RC SEND ping-pong, 64 B", sendLat.Seconds() * 1e6, "µs"},
		naaiceFig{"ratio RPC / ping-pong (goal ≤ 1.3)", rpcLat.Seconds() / sendLat.Seconds(), "×"})

	// Throughput: a 4 MiB input and a 64-byte output.
	big := bytes.Repeat([]byte{1}, 4<<20)
	c = naaiceContext(t, ctx, host, remote, [][]byte{big, small}, func(c *naaice.Context) { c.SetInput(0); c.SetInput(1); c.SetOutput(1) })
	rpcBig := timeOps(t, func() error { return c.DoRPC(ctx) })
	c.Close()
	writeBig := writeLoop(t, ctx, host, naa, naaAddr, 4<<20)
	gbps := func(d time.Duration) float64 { return float64(4<<20) * 8 / d.Seconds() / 1e9 }
	figs = append(figs, naaiceFig{"RPC throughput, 4 MiB input", gbps(rpcBig), "Gb/s"},
		naaiceFig{"RC WRITE 4 MiB, one at a time", gbps(writeBig), "Gb/s"},
		naaiceFig{"ratio RPC / WRITE (goal ≥ 0.9)", writeBig.Seconds() / rpcBig.Seconds(), "×"},
		naaiceFig{"allocations per RPC (whole process)", allocs, ""})
	fmt.Fprintf(os.Stdout, "\nNAAICE over AF_XDP on veth (MTU 3000, one process, %v per case)\n", *naaiceDur)
	for _, f := range figs {
		fmt.Fprintf(os.Stdout, "  %-40s %10.3f %s\n", f.name, f.value, f.unit)
	}
	if allocs != 0 {
		t.Errorf("%v allocations per RPC", allocs)
	}
	if ctr := srv.Counters(); ctr.RPCErrors+ctr.CompletionErrors+ctr.OutOfOrder != 0 {
		t.Errorf("server counters %+v", ctr)
	}
}

func naaiceContext(t *testing.T, ctx context.Context, dev *roce.Device, remote netip.AddrPort, params [][]byte, set func(*naaice.Context)) *naaice.Context {
	t.Helper()
	c, err := naaice.NewContext(dev, remote, params, nil, 3, naaice.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set(c)
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// timeOps runs op for the case duration (after a warm-up) and returns the
// time per op.
func timeOps(t *testing.T, op func() error) time.Duration {
	t.Helper()
	return timeOpsFor(t, *naaiceDur, op)
}

// timeOpsFor is timeOps for d.
func timeOpsFor(t *testing.T, d time.Duration, op func() error) time.Duration {
	t.Helper()
	for i := 0; i < 20; i++ {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if err := op(); err != nil {
			t.Fatal(err)
		}
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// rcPair connects an RC QP on each device through the CM, each with its
// own PD and CQs.
func rcPair(t *testing.T, ctx context.Context, host, naa *roce.Device, naaAddr netip.Addr, port uint16, prep func(*cm.Conn) error) (*cm.Conn, *cm.Conn) {
	t.Helper()
	l, err := cm.Listen(ctx, naa, netip.AddrPortFrom(netip.IPv4Unspecified(), port), cm.ListenOptions{QP: cm.QPOptions{Prepare: prep}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	acc := make(chan *cm.Conn, 1)
	go func() {
		s, err := l.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		acc <- s
	}()
	cc, err := cm.Dial(ctx, host, netip.AddrPortFrom(naaAddr, port), cm.DialOptions{QP: cm.QPOptions{Prepare: prep}})
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	t.Cleanup(func() { cc.Close(); sc.Close() })
	return cc, sc
}

// waitOne takes one completion, waiting the way package naaice does (a
// short spin with Gosched, then parking on CQ.Ready), so that both sides
// of each comparison wait alike.
func waitOne(ctx context.Context, cq *roce.CQ) error {
	var wc [1]roce.WorkCompletion
	for i := 0; ; i++ {
		if cq.Poll(wc[:]) == 1 {
			if wc[0].Status != roce.WCSuccess {
				return fmt.Errorf("completion %v", wc[0].Status)
			}
			return nil
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		select {
		case <-cq.Ready():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendPingPong is an RC SEND ping-pong of size bytes: the client sends,
// the server echoes; time per round trip.
func sendPingPong(t *testing.T, ctx context.Context, host, naa *roce.Device, naaAddr netip.Addr, size int) time.Duration {
	type side struct {
		buf []byte
		mr  *roce.MR
	}
	bufs := map[*cm.Conn]*side{}
	prep := func(c *cm.Conn) error {
		s := &side{buf: make([]byte, size)}
		var err error
		if s.mr, err = c.PD().RegisterMR(s.buf, roce.AccessLocalWrite); err != nil {
			return err
		}
		bufs[c] = s
		return c.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{s.mr.SGE(0, size)}})
	}
	cc, sc := rcPair(t, ctx, host, naa, naaAddr, 7001, prep)
	stop := make(chan struct{})
	defer close(stop)
	srv, cli := bufs[sc], bufs[cc]
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if waitOne(ctx, sc.RecvCQ()) != nil {
				return
			}
			sc.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{srv.mr.SGE(0, size)}})
			sc.QP().PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{srv.mr.SGE(0, size)}})
			if waitOne(ctx, sc.SendCQ()) != nil {
				return
			}
		}
	}()
	sgl := []roce.SGE{cli.mr.SGE(0, size)}
	return timeOps(t, func() error {
		if err := cc.QP().PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: sgl}); err != nil {
			return err
		}
		if err := waitOne(ctx, cc.SendCQ()); err != nil {
			return err
		}
		if err := waitOne(ctx, cc.RecvCQ()); err != nil {
			return err
		}
		return cc.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: sgl})
	})
}

// writeLoop times RC WRITEs of size bytes, one at a time.
func writeLoop(t *testing.T, ctx context.Context, host, naa *roce.Device, naaAddr netip.Addr, size int) time.Duration {
	return rdmaLoop(t, ctx, host, naa, naaAddr, 7002, size, roce.WRRDMAWrite, *naaiceDur)
}

// rdmaLoop times RC WRITEs or READs (op) of size bytes from host into or
// out of naa's memory, one at a time, for d.
func rdmaLoop(t *testing.T, ctx context.Context, host, naa *roce.Device, naaAddr netip.Addr, port uint16, size int, op roce.WROpcode, d time.Duration) time.Duration {
	cc, sc := rcPair(t, ctx, host, naa, naaAddr, port, nil)
	src := make([]byte, size)
	dst := make([]byte, size)
	smr, err := cc.PD().RegisterMR(src, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dmr, err := sc.PD().RegisterMR(dst, roce.AccessLocalWrite|roce.AccessRemoteWrite|roce.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sgl := []roce.SGE{smr.SGE(0, size)}
	return timeOpsFor(t, d, func() error {
		if err := cc.QP().PostSend(&roce.SendWR{Opcode: op, Flags: roce.SendSignaled, SGL: sgl,
			RemoteAddr: dmr.Addr(), RKey: dmr.RKey()}); err != nil {
			return err
		}
		return waitOne(ctx, cc.SendCQ())
	})
}

// steadyAllocs is testing.AllocsPerRun over the whole process, taken three
// times, keeping the lowest. The process also runs the devices' netlink
// watchers, which allocate when the kernel reports a neighbour or address
// change (a neighbour refresh on a busy machine can land in any window); an
// allocation on the data path shows in every measurement.
func steadyAllocs(runs int, f func()) float64 {
	best := testing.AllocsPerRun(runs, f)
	for i := 0; i < 2 && best > 0; i++ {
		best = min(best, testing.AllocsPerRun(runs, f))
	}
	return best
}
