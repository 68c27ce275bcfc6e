//go:build linux

package roce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
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
		db.rxq[0].fn(frames)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/pkt")
	after := db.Counters()
	if got := after.RDMARecvs - before.RDMARecvs; got != uint64(b.N*batch) {
		b.Fatalf("%d requests taken of %d", got, b.N*batch)
	}
}

// Frames that repeat the headers of the one before share its source and
// GID check; a frame from another sender, a GID table that changed between
// batches, and a frame that failed to parse must each be judged afresh.
func TestReceiveBatchSourceCache(t *testing.T) {
	da, db := udpPair(t)
	x := newEndpoint(t, da, RC, 1<<16)
	y := newEndpoint(t, db, RC, 1<<16)
	connect(t, x, y, loA, loB, ConnectAttr{})
	psn := ib.PSN(100)
	next := func(n int) [][]byte {
		fs := rxFrames(t, x, y, n, 64, psn)
		psn += ib.PSN(n)
		return fs
	}
	var rx rxState
	check := func(what string, frames [][]byte, recvs, badDGID, badAddr, badFrame uint64) {
		t.Helper()
		before := db.Counters()
		db.receiveBatch(frames, &rx)
		c := db.Counters()
		if got := [4]uint64{c.RDMARecvs - before.RDMARecvs, c.BadDGID - before.BadDGID, c.BadAddr - before.BadAddr,
			c.BadFrame - before.BadFrame}; got != [4]uint64{recvs, badDGID, badAddr, badFrame} {
			t.Fatalf("%s: requests, bad DGID, bad address, bad frame %v, want %v", what, got,
				[4]uint64{recvs, badDGID, badAddr, badFrame})
		}
	}
	check("one sender", next(8), 8, 0, 0, 0)

	// Another source address: the QP's peer check must see it.
	fs := next(3)
	other := rxFrames(t, x, y, 1, 64, psn-2)[0]
	copy(other[link.EthernetSize+12:], []byte{127, 0, 0, 3})
	ib.IPv4(other[link.EthernetSize : link.EthernetSize+link.IPv4Size]).UpdateChecksum()
	check("a stranger between", [][]byte{fs[0], other, fs[1], fs[2]}, 3, 0, 1, 0)

	// A frame cut short between two good ones.
	fs = next(2)
	check("a bad frame between", [][]byte{fs[0], fs[0][:30], fs[1]}, 2, 0, 0, 1)

	// Our address leaves the GID table, then comes back.
	gt := db.gids.Load()
	db.gids.Store(buildGIDTable(nil, db.mac, []netip.Addr{netip.MustParseAddr("127.0.0.5")}))
	check("address removed", rxFrames(t, x, y, 4, 64, psn), 0, 4, 0, 0)
	db.gids.Store(gt)
	check("address back", next(4), 4, 0, 0, 0)
}

// Receiving allocates nothing per batch.
func TestReceiveBatchAllocs(t *testing.T) {
	da, db := udpPair(t)
	x := newEndpoint(t, da, RC, 1<<16)
	y := newEndpoint(t, db, RC, 1<<16)
	connect(t, x, y, loA, loB, ConnectAttr{})
	frames := rxFrames(t, x, y, 16, 64, 100)
	psn := ib.PSN(100)
	var rx rxState
	round := func() {
		for _, f := range frames {
			setPSN(f, psn)
			psn++
		}
		db.receiveBatch(frames, &rx)
	}
	round()
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
	if c := db.Counters(); c.RDMARecvs != 102*16 {
		t.Fatalf("%d requests taken of %d", c.RDMARecvs, 102*16)
	}
}
