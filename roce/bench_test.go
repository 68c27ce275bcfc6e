//go:build linux

package roce

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/goroce/goroce/ib"

	"github.com/goroce/goroce/internal/netnstest"
)

// benchWrite streams RDMA WRITEs of size bytes, depth outstanding.
func benchWrite(b *testing.B, x, y *endpoint, size, depth int) {
	ctx := context.Background()
	wr := SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, size)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
	var wc [32]WorkCompletion
	b.ReportAllocs()
	b.SetBytes(int64(size))
	out := 0
	for b.Loop() {
		for out >= depth {
			n := x.scq.Poll(wc[:])
			if n == 0 {
				x.scq.Wait(ctx)
			}
			for _, c := range wc[:n] {
				if c.Status != WCSuccess {
					b.Fatal(c.Status)
				}
			}
			out -= n
		}
		if err := x.qp.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
		out++
	}
	for out > 0 {
		n := x.scq.Poll(wc[:])
		if n == 0 {
			x.scq.Wait(ctx)
		}
		out -= n
	}
}

func BenchmarkWriteUDPLoopback(b *testing.B) {
	da, db := udpPair(b)
	x := newEndpoint(b, da, RC, 1<<16)
	y := newEndpoint(b, db, RC, 1<<16)
	connect(b, x, y, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
	benchWrite(b, x, y, 65536, 16)
	c := da.Counters()
	b.Logf("timeouts %d, go-back-N %d, seq NAKs %d", c.Timeouts, c.CompleterRetryErr, c.RcvdSeqErr)
}

func BenchmarkWriteXDPVeth(b *testing.B) {
	p := netnstest.NewPair(b, 9000)
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5e9); err != nil {
			b.Fatal(err)
		}
	}
	da := openIn(b, p.VethA, xdpLink, Options{})
	db := openIn(b, p.VethB, xdpLink, Options{})
	x := newEndpoint(b, da, RC, 1<<16)
	y := newEndpoint(b, db, RC, 1<<16)
	connect(b, x, y, p.VethA.Addr.Addr(), p.VethB.Addr.Addr(), ConnectAttr{})
	benchWrite(b, x, y, 65536, 16)
}

// writeN streams n RDMA WRITEs of size bytes from x to y, depth
// outstanding, and waits for the last completion.
func writeN(x, y *endpoint, size, depth, n int) error {
	ctx := context.Background()
	wr := SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, size)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
	var wc [32]WorkCompletion
	out := 0
	reap := func() error {
		n := x.scq.Poll(wc[:])
		if n == 0 {
			if err := x.scq.Wait(ctx); err != nil {
				return err
			}
		}
		for _, c := range wc[:n] {
			if c.Status != WCSuccess {
				return fmt.Errorf("completion %v", c.Status)
			}
		}
		out -= n
		return nil
	}
	for i := 0; i < n; i++ {
		for out >= depth {
			if err := reap(); err != nil {
				return err
			}
		}
		if err := x.qp.PostSend(&wr); err != nil {
			return err
		}
		out++
	}
	for out > 0 {
		if err := reap(); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkWriteUDPPairs streams RDMA WRITEs over 1 and 2 QP pairs of the
// same two devices (kernel UDP link on loopback), each pair driven by its
// own goroutine; b.N writes in all, split between the pairs, so MB/s is
// the aggregate. The ratio of pairs=2 to pairs=1 is how far two QPs of a
// device progress in parallel (1 when the device serializes them).
func BenchmarkWriteUDPPairs(b *testing.B) {
	for _, size := range []int{4096, 65536} {
		for _, pairs := range []int{1, 2} {
			b.Run(fmt.Sprintf("size=%d/pairs=%d", size, pairs), func(b *testing.B) {
				da, db := udpPair(b)
				xs := make([]*endpoint, pairs)
				ys := make([]*endpoint, pairs)
				for i := range xs {
					xs[i] = newEndpoint(b, da, RC, 1<<16)
					ys[i] = newEndpoint(b, db, RC, 1<<16)
					connect(b, xs[i], ys[i], loA, loB, ConnectAttr{PathMTU: ib.MTU4096})
				}
				b.ReportAllocs()
				b.SetBytes(int64(size))
				b.ResetTimer()
				var wg sync.WaitGroup
				errs := make([]error, pairs)
				for i := range xs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[i] = writeN(xs[i], ys[i], size, 16, b.N/pairs+1)
					}()
				}
				wg.Wait()
				b.StopTimer()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
