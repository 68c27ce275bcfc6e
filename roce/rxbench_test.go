package roce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce/link"
)

// rxFrames builds n RDMA WRITE ONLY frames of size bytes from x to y as the
// kernel UDP link hands them to y's device, PSNs from psn on.
func rxFrames(t testing.TB, x, y *endpoint, n, size int, psn ib.PSN) [][]byte {
	t.Helper()
	la, lb := x.d.Link().(interface{ LocalAddr() netip.AddrPort }), y.d.Link().(interface{ LocalAddr() netip.AddrPort })
	frames := make([][]byte, n)
	for i := range frames {
		s := ib.FrameSpec{
			Src: la.LocalAddr().Addr(), Dst: lb.LocalAddr().Addr(), HopLimit: 64, DontFragment: true,
			SrcPort: la.LocalAddr().Port(), DstPort: lb.LocalAddr().Port(),
			BTH: ib.BTHFields{Opcode: ib.RCWriteOnly, PKey: 0xFFFF, DestQP: y.qp.QPN(),
				PSN: (psn + ib.PSN(i)) & ib.PSNMask},
			RETH:    &ib.RETHFields{VA: y.mr.Addr(), RKey: y.mr.RKey(), DMALen: uint32(size)},
			Payload: make([]byte, size),
		}
		frames[i] = make([]byte, s.Len())
		if _, err := ib.Build(frames[i], &s); err != nil {
			t.Fatal(err)
		}
	}
	return frames
}

// setPSN rewrites the PSN of a frame built by rxFrames (the UDP link's
// frames are not checked against their ICRC).
func setPSN(f []byte, psn ib.PSN) {
	fr, err := link.ParseFrame(f)
	if err != nil {
		panic(err)
	}
	ib.BTH(f[fr.Payload:]).SetPSN(psn & ib.PSNMask)
}

// BenchmarkReceiveBatch is the device's share of receiving: batches of 64
// small RDMA WRITEs of one connection, from the link's frames to the
// engine's responder (which copies 64 bytes each and coalesces the ACKs).
func BenchmarkReceiveBatch(b *testing.B) {
	da, db := udpPair(b)
	x := newEndpoint(b, da, RC, 1<<16)
	y := newEndpoint(b, db, RC, 1<<16)
	connect(b, x, y, loA, loB, ConnectAttr{})
	const batch = 64
	frames := rxFrames(b, x, y, batch, 64, 100)
	psn := ib.PSN(100)
	before := db.Counters()
	b.ReportAllocs()
	for b.Loop() {
		for _, f := range frames {
			setPSN(f, psn)
			psn++
		}
		db.rxFn(frames)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/pkt")
	after := db.Counters()
	if got := after.RDMARecvs - before.RDMARecvs; got != uint64(b.N*batch) {
		b.Fatalf("%d requests taken of %d", got, b.N*batch)
	}
}
