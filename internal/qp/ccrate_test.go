package qp_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// ccPair is two engines with one RC QP each, moved by hand so that a test
// chooses each packet's ECN field.
type ccPair struct {
	clk        *qptest.Clock
	a, b       *qp.Engine
	qa, qb     *qptest.Endpoint
	gidA, gidB ib.GID
	slots      []qp.TxPacket
	pkt        ib.Packet
	mr, src    *qp.MR
	buf        []byte
	sgl        []qp.SGE
}

func newCCPair(t testing.TB, cc qp.CCConfig) *ccPair {
	t.Helper()
	c := &ccPair{clk: &qptest.Clock{},
		gidA: ib.GIDFromAddr(netip.MustParseAddr("10.0.0.1")),
		gidB: ib.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}
	var err error
	if c.a, err = qp.New(qp.Config{Clock: c.clk, CC: cc}); err != nil {
		t.Fatal(err)
	}
	if c.b, err = qp.New(qp.Config{Clock: c.clk, CC: cc}); err != nil {
		t.Fatal(err)
	}
	if c.qa, err = qptest.NewEndpoint(c.a, qp.RC, 64); err != nil {
		t.Fatal(err)
	}
	if c.qb, err = qptest.NewEndpoint(c.b, qp.RC, 64); err != nil {
		t.Fatal(err)
	}
	p := qptest.DefaultRC
	if err := qptest.BringUp(c.qa.QP, c.qb.QP.QPN(), p, 0, 0, c.gidA, c.gidB); err != nil {
		t.Fatal(err)
	}
	if err := qptest.BringUp(c.qb.QP, c.qa.QP.QPN(), p, 0, 0, c.gidB, c.gidA); err != nil {
		t.Fatal(err)
	}
	c.buf = make([]byte, 1<<20)
	if c.mr, err = c.qb.PD.RegMR(c.buf, 0x10000, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if c.src, err = c.qa.PD.RegMR(make([]byte, 1<<20), 0x20000, qp.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	c.sgl = []qp.SGE{{Addr: 0x20000, LKey: c.src.LKey()}}
	c.slots = make([]qp.TxPacket, 8)
	for i := range c.slots {
		c.slots[i] = qp.TxPacket{Buf: make([]byte, 64+4096+192), Headroom: 64}
	}
	return c
}

// write posts an RDMA WRITE of n bytes from A to B.
func (c *ccPair) write(t testing.TB, n int) {
	t.Helper()
	c.sgl[0].Length = uint32(n)
	wr := qp.SendWR{Opcode: qp.WRRDMAWrite, RemoteAddr: c.mr.IOVA(), RKey: c.mr.RKey(), SGL: c.sgl}
	if err := c.qa.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
}

// move transmits one slot's worth from e and hands each packet to dst with
// the ECN field ecn (or the packet's own with ecn < 0). It returns the
// packets' traffic classes and opcodes.
func (c *ccPair) move(t testing.TB, from, to *qp.Engine, ecn int, sgid, dgid ib.GID) (tcs []uint8, ops []ib.Opcode) {
	t.Helper()
	n := from.Transmit(c.slots)
	for i := range n {
		s := &c.slots[i]
		tc := s.AV.TrafficClass
		tcs = append(tcs, tc)
		if ecn >= 0 {
			tc = tc&^3 | uint8(ecn)
		}
		if err := ib.ParseDCIB(s.Payload(), &c.pkt); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, c.pkt.BTH.Opcode())
		src := qp.Source{SGID: sgid, DGID: dgid, TrafficClass: tc}
		if err := to.Receive(&c.pkt, &src); err != nil {
			t.Fatalf("receive %v: %v", c.pkt.BTH.Opcode(), err)
		}
	}
	return tcs, ops
}

func (c *ccPair) aToB(t testing.TB, ecn int) ([]uint8, []ib.Opcode) {
	return c.move(t, c.a, c.b, ecn, c.gidA, c.gidB)
}

func (c *ccPair) bToA(t testing.TB) ([]uint8, []ib.Opcode) {
	return c.move(t, c.b, c.a, -1, c.gidB, c.gidA)
}

func TestCCOffSendsNotECT(t *testing.T) {
	c := newCCPair(t, qp.CCConfig{})
	c.write(t, 100)
	tcs, _ := c.aToB(t, 3) // CE marks are not acted on
	if len(tcs) != 1 || tcs[0]&3 != 0 {
		t.Fatalf("traffic classes %v, want one Not-ECT", tcs)
	}
	_, ops := c.bToA(t)
	for _, op := range ops {
		if op == ib.CNP {
			t.Fatal("CNP sent with congestion control off")
		}
	}
	if s := c.b.CCStats(); s != (qp.CCStats{}) {
		t.Fatalf("stats %+v", s)
	}
	// A CNP from the peer is taken and ignored, not dropped.
	if err := c.a.Receive(cnpFor(t, c.qa.QP.QPN()), &qp.Source{SGID: c.gidB, DGID: c.gidA}); err != nil {
		t.Fatal(err)
	}
	if s := c.a.CCStats(); s.RPCNPIgnored != 1 || c.a.Stats().RxDropped != 0 {
		t.Fatalf("stats %+v, dropped %d", s, c.a.Stats().RxDropped)
	}
}

// cnpFor builds a CNP to qpn as a peer would.
func cnpFor(t testing.TB, qpn uint32) *ib.Packet {
	b := make([]byte, ib.BTHSize+ib.CNPReservedSize+ib.ICRCSize)
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: ib.CNP, PKey: 0xFFFF, BECN: true, DestQP: qpn})
	var p ib.Packet
	if err := ib.ParseDCIB(b, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestCCNotificationPoint(t *testing.T) {
	c := newCCPair(t, qp.CCConfig{DCQCN: true})
	c.write(t, 100)
	tcs, _ := c.aToB(t, 3) // the switch marked it CE
	if len(tcs) != 1 || tcs[0]&3 != 2 {
		t.Fatalf("traffic classes %v, want one ECT(0)", tcs)
	}
	// B answers with the CNP first, then the ACK.
	n := c.b.Transmit(c.slots)
	if n != 2 {
		t.Fatalf("B sent %d packets, want CNP and ACK", n)
	}
	s := &c.slots[0]
	b := s.Payload()
	if len(b) != 32 {
		t.Fatalf("CNP of %d bytes, want 32", len(b))
	}
	bth := ib.BTH(b[:ib.BTHSize])
	if bth.Opcode() != ib.CNP || !bth.BECN() || bth.FECN() || bth.DestQP() != c.qa.QP.QPN() || bth.PKey() != 0xFFFF || bth.PSN() != 0 {
		t.Fatalf("CNP header %+v", bth.Fields())
	}
	for _, x := range b[ib.BTHSize : ib.BTHSize+ib.CNPReservedSize] {
		if x != 0 {
			t.Fatalf("reserved bytes % x", b[ib.BTHSize:])
		}
	}
	// mlx5's cnp_dscp default: DSCP 48, Not-ECT.
	if s.AV.TrafficClass != 48<<2 || s.SrcQPN != c.qb.QP.QPN() || s.AV.DGID != c.gidA {
		t.Fatalf("CNP sent with TC %#x from QP %d to %v", s.AV.TrafficClass, s.SrcQPN, s.AV.DGID)
	}
	if c.slots[1].AV.TrafficClass&3 != 2 {
		t.Fatalf("ACK not ECT(0): %#x", c.slots[1].AV.TrafficClass)
	}

	// A second mark within min_time_between_cnps sends none; one after does.
	steps := []struct {
		after time.Duration
		cnp   bool
	}{{time.Microsecond, false}, {4 * time.Microsecond, true}}
	for _, st := range steps {
		c.clk.T += st.after
		c.write(t, 100)
		c.aToB(t, 3)
		_, ops := c.bToA(t)
		got := len(ops) > 0 && ops[0] == ib.CNP
		if got != st.cnp {
			t.Fatalf("after %v: ops %v, want CNP %v", st.after, ops, st.cnp)
		}
	}
	st := c.b.CCStats()
	if st.NPECNMarked != 3 || st.NPCNPSent != 2 || st.NPCNPCoalesce != 1 {
		t.Fatalf("NP stats %+v", st)
	}
	// The first CNP was only looked at; the second reached A.
	if st := c.a.CCStats(); st.RPCNPHandled != 1 || st.RPCNPIgnored != 0 {
		t.Fatalf("RP stats %+v", st)
	}
	if r, lim := c.qa.QP.CCRate(); !lim || r >= 10e9 {
		t.Fatalf("A's rate %d limited %v after CNPs", r, lim)
	}
}

func TestCCReactionPointPaces(t *testing.T) {
	const rate = 100e6 // 100 Mb/s after the cut: 12.5 bytes/µs
	c := newCCPair(t, qp.CCConfig{DCQCN: true, Params: qp.DCQCNParams{RateOnFirstCNP: 2 * rate, TimeReset: time.Second, ByteReset: 1 << 40}})
	if err := c.a.Receive(cnpFor(t, c.qa.QP.QPN()), &qp.Source{SGID: c.gidB, DGID: c.gidA}); err != nil {
		t.Fatal(err)
	}
	if r, lim := c.qa.QP.CCRate(); !lim || r != rate {
		t.Fatalf("rate %d limited %v, want %d", r, lim, int64(rate))
	}
	// 64 KiB at MTU 1024 in 64 packets of 1024 bytes and headers: the
	// bucket lets two go at once, then one per 1024 B / 12.5 B/µs ≈ 82 µs.
	c.write(t, 64<<10)
	sent := 0
	var last time.Duration
	for c.clk.T < time.Second {
		tcs, _ := c.aToB(t, -1)
		if len(tcs) > 0 {
			sent += len(tcs)
			last = c.clk.T
		}
		c.bToA(t)
		d, ok := c.a.NextDeadline()
		if !ok {
			break
		}
		if d <= c.clk.T {
			t.Fatalf("deadline %v not after now %v", d, c.clk.T)
		}
		c.clk.T = d
		c.a.Advance(c.clk.T)
	}
	if sent != 64 {
		t.Fatalf("sent %d packets, want 64", sent)
	}
	// 62 packets after the burst at 1024+28+4 bytes each: 5.2 ms.
	if lo, hi := 5*time.Millisecond, 6*time.Millisecond; last < lo || last > hi {
		t.Fatalf("last packet left at %v, want %v..%v", last, lo, hi)
	}
	if w := c.a.CCStats().RPPacedWaits; w < 60 {
		t.Fatalf("only %d paced waits", w)
	}
}

func TestCCReadResponsesPaced(t *testing.T) {
	// A CNP cuts the responder's QP (B) to 100 Mb/s; A's 64 KiB READ then
	// comes back at that rate: 62 response packets after the bucket's two,
	// about 5.2 ms, while A's request itself is not held.
	const rate = 100e6
	c := newCCPair(t, qp.CCConfig{DCQCN: true, Params: qp.DCQCNParams{RateOnFirstCNP: 2 * rate, TimeReset: time.Second, ByteReset: 1 << 40}})
	if err := c.b.Receive(cnpFor(t, c.qb.QP.QPN()), &qp.Source{SGID: c.gidA, DGID: c.gidB}); err != nil {
		t.Fatal(err)
	}
	c.sgl[0].Length = 64 << 10
	wr := qp.SendWR{Opcode: qp.WRRDMARead, RemoteAddr: c.mr.IOVA(), RKey: c.mr.RKey(), SGL: c.sgl, Flags: qp.SendSignaled}
	if err := c.qa.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wc := make([]qp.WorkCompletion, 1)
	var done time.Duration
	resp := 0
	for c.clk.T < time.Second && done == 0 {
		c.aToB(t, -1)
		_, ops := c.bToA(t)
		resp += len(ops)
		if c.qa.SCQ.Poll(wc) == 1 {
			if wc[0].Status != qp.WCSuccess {
				t.Fatal(wc[0].Status)
			}
			done = c.clk.T
			break
		}
		d, ok := c.b.NextDeadline()
		if !ok {
			t.Fatal("no pacing timer on the responder")
		}
		c.clk.T = max(d, c.clk.T+1)
		c.b.Advance(c.clk.T)
	}
	if resp != 64 {
		t.Fatalf("%d READ responses, want 64", resp)
	}
	if lo, hi := 5*time.Millisecond, 6*time.Millisecond; done < lo || done > hi {
		t.Fatalf("READ completed at %v, want %v..%v", done, lo, hi)
	}
}

func TestCCPacingRate(t *testing.T) {
	// Over a long run the pacer holds the QP to its rate: packets sent in
	// 20 ms at 100 Mb/s are at most the rate's worth plus the burst.
	const rate = 100e6
	c := newCCPair(t, qp.CCConfig{DCQCN: true, Params: qp.DCQCNParams{RateOnFirstCNP: 2 * rate, TimeReset: time.Second, ByteReset: 1 << 40}})
	if err := c.a.Receive(cnpFor(t, c.qa.QP.QPN()), &qp.Source{SGID: c.gidB, DGID: c.gidA}); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		c.write(t, 64<<10)
	}
	bytes := 0
	const span = 20 * time.Millisecond
	for c.clk.T < span {
		n := c.a.Transmit(c.slots)
		for i := range n {
			bytes += c.slots[i].Len
			// Hand it to B and B's ACK back, so the window stays open.
			if err := ib.ParseDCIB(c.slots[i].Payload(), &c.pkt); err != nil {
				t.Fatal(err)
			}
			src := qp.Source{SGID: c.gidA, DGID: c.gidB}
			if err := c.b.Receive(&c.pkt, &src); err != nil {
				t.Fatal(err)
			}
		}
		c.bToA(t)
		d, ok := c.a.NextDeadline()
		if !ok {
			break
		}
		c.clk.T = max(d, c.clk.T+time.Microsecond)
		c.a.Advance(c.clk.T)
	}
	max := int(rate/8*span.Seconds()) + 2*1100
	min := max * 9 / 10
	if bytes > max || bytes < min {
		t.Fatalf("sent %d bytes in %v at %v b/s, want %d..%d", bytes, span, rate, min, max)
	}
}

func TestCCNoAllocs(t *testing.T) {
	c := newCCPair(t, qp.CCConfig{DCQCN: true})
	cnp := cnpFor(t, c.qa.QP.QPN())
	c.sgl[0].Length = 100
	wr := qp.SendWR{Opcode: qp.WRRDMAWrite, RemoteAddr: c.mr.IOVA(), RKey: c.mr.RKey(), SGL: c.sgl}
	src := qp.Source{SGID: c.gidA, DGID: c.gidB, TrafficClass: 3}
	srcB := qp.Source{SGID: c.gidB, DGID: c.gidA}
	wc := make([]qp.WorkCompletion, 16)
	n := testing.AllocsPerRun(200, func() {
		c.clk.T += 5 * time.Millisecond // 1 Mb/s (MinRate) lets a small packet go
		if err := c.qa.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		c.a.Advance(c.clk.T)
		k := c.a.Transmit(c.slots)
		for i := range k {
			if ib.ParseDCIB(c.slots[i].Payload(), &c.pkt) == nil {
				_ = c.b.Receive(&c.pkt, &src)
			}
		}
		k = c.b.Transmit(c.slots)
		for i := range k {
			if ib.ParseDCIB(c.slots[i].Payload(), &c.pkt) == nil {
				_ = c.a.Receive(&c.pkt, &srcB)
			}
		}
		_ = c.a.Receive(cnp, &srcB)
		c.qa.SCQ.Poll(wc)
	})
	if n != 0 {
		t.Fatalf("%v allocations per round", n)
	}
	if c.b.CCStats().NPCNPSent == 0 || c.a.CCStats().RPCNPHandled == 0 {
		t.Fatalf("the guard ran no CNP: %+v %+v", c.b.CCStats(), c.a.CCStats())
	}
}

// TestCNPDSCP: CNPs leave with DCQCNParams.CNPDSCP (mlx5's cnp_dscp, 48
// by default) and ECN Not-ECT, or with NoCNPDSCP the QP's own traffic
// class without its ECN bits.
func TestCNPDSCP(t *testing.T) {
	for _, c := range []struct {
		dscp int
		want uint8
	}{{0, 48 << 2}, {26, 26 << 2}, {qp.NoCNPDSCP, 0}} {
		p := newCCPair(t, qp.CCConfig{DCQCN: true, Params: qp.DCQCNParams{CNPDSCP: c.dscp}})
		p.write(t, 100)
		p.aToB(t, 3)
		if n := p.b.Transmit(p.slots); n != 2 {
			t.Fatalf("B sent %d packets, want CNP and ACK", n)
		}
		s := &p.slots[0]
		if ib.BTH(s.Payload()).Opcode() != ib.CNP || s.AV.TrafficClass != c.want {
			t.Errorf("CNPDSCP %d: %v with traffic class %#x, want CNP with %#x", c.dscp, ib.BTH(s.Payload()).Opcode(), s.AV.TrafficClass, c.want)
		}
	}
}
