package roce

import (
	"context"

	"github.com/goroce/goroce/ib"
	"testing"

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
