package qp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// TestRequesterWireRules watches the requester's packets: AckReq on the last
// packet of each message and on the 66th packet without one (rxe's rule), at
// most 128 unacknowledged PSNs, READ requests consuming one PSN per response
// packet, and no more than max_rd_atomic READ/atomic requests unanswered.
func TestRequesterWireRules(t *testing.T) {
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU256
	prm.RdAtomic = 2
	prm.PSNA = 0xFFFFF0
	p := newPair(t, qp.RC, cleanNet, prm, 64)
	const big = 300 * 256 // 300 packets
	aMR := p.regMR(p.a, make([]byte, big), 0, qp.AccessLocalWrite)
	bMR := p.regMR(p.b, make([]byte, big), 0, allAccess)

	var sinceAck, maxSince int
	var lastPSN ib.PSN
	outstanding := map[ib.PSN]bool{} // last PSN of each unanswered READ/atomic
	maxRd := 0
	var maxSpan int32
	ackedPSN := ib.PSN(prm.PSNA) // first unacknowledged, as seen on the wire
	var pkt ib.Packet
	p.net.Tap = func(from string, b []byte) {
		if err := ib.ParseIB(b, &pkt); err != nil {
			t.Fatal(err)
		}
		op := pkt.BTH.Opcode()
		if from == "B" {
			if op == ib.RCReadResponseLast || op == ib.RCReadResponseOnly || op == ib.RCAtomicAck {
				delete(outstanding, pkt.BTH.PSN())
			}
			if pkt.AETH != nil && pkt.AETH.Syndrome().Type() == ib.SyndromeACK {
				ackedPSN = pkt.BTH.PSN().Next()
			}
			return
		}
		psn := pkt.BTH.PSN()
		if d := ib.PSNDiff(psn, ackedPSN); d > maxSpan {
			maxSpan = d
		}
		lastPSN = psn
		switch op {
		case ib.RCReadRequest:
			outstanding[psn.Add((pkt.RETH.DMALen()+255)/256-1)] = true
		case ib.RCFetchAdd, ib.RCCompareSwap:
			outstanding[psn] = true
		}
		maxRd = max(maxRd, len(outstanding))
		last := op == ib.RCWriteLast || op == ib.RCWriteOnly || op == ib.RCReadRequest || op == ib.RCFetchAdd || op == ib.RCSendOnly
		if pkt.BTH.AckReq() {
			if !last && sinceAck != 65 {
				t.Fatalf("AckReq on a middle packet after %d packets without one", sinceAck)
			}
			sinceAck = 0
		} else {
			if last {
				t.Fatalf("%v without AckReq", op)
			}
			sinceAck++
			maxSince = max(maxSince, sinceAck)
		}
	}
	// One long WRITE, then several READs and atomics.
	post := func(wr qp.SendWR) {
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	post(qp.SendWR{ID: 1, Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Addr: 0, Length: big, LKey: aMR.LKey()}}, RemoteAddr: 0, RKey: bMR.RKey()})
	for i := 0; i < 6; i++ {
		post(qp.SendWR{ID: uint64(2 + i), Opcode: qp.WRRDMARead, SGL: []qp.SGE{{Addr: 0, Length: 1000, LKey: aMR.LKey()}}, RemoteAddr: 0, RKey: bMR.RKey()})
		post(qp.SendWR{ID: uint64(20 + i), Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{{Addr: 8, Length: 8, LKey: aMR.LKey()}}, RemoteAddr: 16, RKey: bMR.RKey(), CompareAdd: 1})
	}
	post(qp.SendWR{ID: 99, Opcode: qp.WRSend, Flags: qp.SendSignaled})
	p.b.QP.PostRecv(&qp.RecvWR{ID: 1})
	waitWC(t, p, p.a.SCQ, 1, time.Second)
	if maxSince != 65 {
		t.Fatalf("longest run without AckReq %d, want 65", maxSince)
	}
	if maxSpan > 128 {
		t.Fatalf("%d PSNs in flight beyond the last ACK, window is 128", maxSpan)
	}
	if maxRd != 2 {
		t.Fatalf("%d READ/atomic requests outstanding at once, want max_rd_atomic = 2", maxRd)
	}
	// 300 WRITE PSNs + 6 READs of 4 PSNs + 6 atomics + 1 SEND.
	if got, want := p.a.QP.Attr().SQPSN, prm.PSNA; got != want {
		t.Fatalf("SQPSN attr changed: %#x", got)
	}
	if want := ib.PSN(prm.PSNA).Add(300 + 6*4 + 6 + 1); lastPSN.Next() != want {
		t.Fatalf("next PSN %#x, want %#x", lastPSN.Next(), want)
	}
}

func TestSRQ(t *testing.T) {
	n, err := qptest.NewNet(qptest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := n.B.E.AllocPD()
	srq, err := pd.CreateSRQ(qp.SRQAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := n.B.E.CreateCQ(64)
	buf := make([]byte, 16*100)
	mr, _ := pd.RegMR(buf, 0, qp.AccessLocalWrite)
	for i := 0; i < 16; i++ {
		if err := srq.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: uint64(i * 100), Length: 100, LKey: mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Two senders share B's SRQ through two QPs.
	var senders []*qptest.Endpoint
	for i := 0; i < 2; i++ {
		a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 16)
		bq, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qp.QPCap{MaxSendWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Connect(a.QP, bq, qptest.DefaultRC); err != nil {
			t.Fatal(err)
		}
		if err := bq.PostRecv(&qp.RecvWR{}); err == nil {
			t.Fatal("PostRecv on an SRQ QP accepted")
		}
		senders = append(senders, a)
	}
	for k := 0; k < 5; k++ {
		for i, a := range senders {
			if err := a.QP.PostSend(&qp.SendWR{ID: uint64(k), Opcode: qp.WRSend, Flags: qp.SendSignaled | qp.SendInline,
				Inline: []byte{byte(i), byte(k)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wcs []qp.WorkCompletion
	if err := n.Run(func() bool { wcs = pollAll(cq, wcs); return len(wcs) == 10 }, time.Second); err != nil {
		t.Fatal(err)
	}
	for i, wc := range wcs {
		if wc.WRID != uint64(i) || wc.ByteLen != 2 || wc.Status != qp.WCSuccess {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if srq.Len() != 6 {
		t.Fatalf("%d receives left in the SRQ, want 6", srq.Len())
	}
}

func TestGSI(t *testing.T) {
	n, err := qptest.NewNet(qptest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var eps [2]*qptest.Endpoint
	for i, e := range []*qp.Engine{n.A.E, n.B.E} {
		pd, _ := e.AllocPD()
		cq, _ := e.CreateCQ(16)
		q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.GSI, SendCQ: cq, RecvCQ: cq, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 256}})
		if err != nil {
			t.Fatal(err)
		}
		if q.QPN() != 1 || q.Type() != qp.GSI {
			t.Fatalf("GSI QP is %d %v", q.QPN(), q.Type())
		}
		if _, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.GSI, SendCQ: cq, RecvCQ: cq, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 4}}); err == nil {
			t.Fatal("second GSI QP created")
		}
		eps[i] = &qptest.Endpoint{PD: pd, SCQ: cq, RCQ: cq, QP: q}
	}
	if err := n.Connect(eps[0].QP, eps[1].QP, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	rb := make([]byte, 40+256)
	mr, _ := eps[1].PD.RegMR(rb, 0, qp.AccessLocalWrite)
	eps[1].QP.PostRecv(&qp.RecvWR{ID: 5, SGL: []qp.SGE{{Length: uint32(len(rb)), LKey: mr.LKey()}}})
	ah, _ := eps[0].PD.CreateAH(qp.AddressVector{DGID: n.B.GID})
	var qkey uint32
	var pkt ib.Packet
	n.Tap = func(from string, b []byte) {
		if ib.ParseIB(b, &pkt) == nil && pkt.DETH != nil {
			qkey = pkt.DETH.QKey()
		}
	}
	mad := []byte("a management datagram")
	if err := eps[0].QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendInline, Inline: mad, AH: ah, RemoteQPN: 1, RemoteQKey: 0}); err != nil {
		t.Fatal(err)
	}
	var wcs []qp.WorkCompletion
	if err := n.Run(func() bool { wcs = pollAll(eps[1].RCQ, wcs); return len(wcs) > 0 }, time.Second); err != nil {
		t.Fatal(err)
	}
	if qkey != qp.GSIQKey || wcs[0].SrcQP != 1 || string(rb[40:40+len(mad)]) != string(mad) {
		t.Fatalf("Q_Key %#x, completion %+v", qkey, wcs[0])
	}
}

func TestTransmitShortBuffer(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 4)
	if err := p.a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RKey: 0}); err != nil {
		t.Fatal(err)
	}
	small := []qp.TxPacket{{Buf: make([]byte, 500), Headroom: 64}}
	if n := p.net.A.E.Transmit(small); n != 0 || p.net.A.E.Stats().ShortTxBuffer != 1 {
		t.Fatalf("Transmit into a short slot: %d packets, stats %+v", n, p.net.A.E.Stats())
	}
	if !p.net.A.E.HasWork() {
		t.Fatal("work lost after a short slot")
	}
	big := []qp.TxPacket{{Buf: make([]byte, 2048), Headroom: 64}}
	if n := p.net.A.E.Transmit(big); n != 1 {
		t.Fatalf("Transmit into a good slot: %d packets", n)
	}
}

func TestSignaling(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 8)
	aMR := p.regMR(p.a, make([]byte, 64), 0, qp.AccessLocalWrite)
	bMR := p.regMR(p.b, make([]byte, 64), 0, allAccess)
	wr := qp.SendWR{Opcode: qp.WRRDMAWrite, SGL: []qp.SGE{{Length: 8, LKey: aMR.LKey()}}, RKey: bMR.RKey()}
	for id := uint64(1); id <= 4; id++ {
		wr.ID = id
		wr.Flags = 0
		if id == 3 {
			wr.Flags = qp.SendSignaled
		}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	// A failing unsignaled WR still reports its error.
	wr.ID, wr.Flags, wr.RKey = 5, 0, bMR.RKey()^0xFF00
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, p, p.a.SCQ, 2, time.Second)
	expectStatus(t, wcs[0], 3, qp.WCSuccess)
	expectStatus(t, wcs[1], 5, qp.WCRemAccessErr)
	if extra := pollAll(p.a.SCQ, nil); len(extra) != 0 {
		t.Fatalf("unexpected completions %+v", extra)
	}
	// SigAll: every WR completes.
	n, _ := qptest.NewNet(qptest.Options{})
	e := n.A.E
	pd, _ := e.AllocPD()
	cq, _ := e.CreateCQ(8)
	q, _ := pd.CreateQP(&qp.QPInitAttr{Type: qp.UD, SendCQ: cq, RecvCQ: cq, SigAll: true, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 1}})
	peer, _ := qptest.NewEndpoint(n.B.E, qp.UD, 4)
	if err := n.Connect(q, peer.QP, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	ah, _ := pd.CreateAH(qp.AddressVector{DGID: n.B.GID})
	for i := 0; i < 3; i++ {
		if err := q.PostSend(&qp.SendWR{ID: uint64(i), Opcode: qp.WRSend, AH: ah, RemoteQPN: peer.QP.QPN(), RemoteQKey: qptest.UDQKey}); err != nil {
			t.Fatal(err)
		}
	}
	var got []qp.WorkCompletion
	_ = n.Run(func() bool { got = pollAll(cq, got); return len(got) == 3 }, time.Second)
	if len(got) != 3 {
		t.Fatalf("SigAll QP: %d completions", len(got))
	}
}

func TestSQD(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 8)
	aMR := p.regMR(p.a, make([]byte, 1<<16), 0, qp.AccessLocalWrite)
	bMR := p.regMR(p.b, make([]byte, 1<<16), 0, allAccess)
	for id := uint64(1); id <= 3; id++ {
		if err := p.a.QP.PostSend(&qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Length: 1 << 14, LKey: aMR.LKey()}}, RKey: bMR.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	// Send a few packets of the first WRITE, then drain the send queue.
	slots := make([]qp.TxPacket, 3)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 2048)}
	}
	if n := p.net.A.E.Transmit(slots); n != 3 {
		t.Fatalf("sent %d", n)
	}
	if err := p.a.QP.Modify(&qp.QPAttr{State: qp.StateSQD}, qp.AttrState); err != nil {
		t.Fatal(err)
	}

	// The first WRITE (16 packets) completes; the others wait.
	wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
	expectStatus(t, wcs[0], 1, qp.WCSuccess)
	_ = p.net.Run(func() bool { return false }, 10*time.Millisecond)
	if extra := pollAll(p.a.SCQ, nil); len(extra) != 0 {
		t.Fatalf("a new WR ran in SQD: %+v", extra)
	}
	if err := p.a.QP.Modify(&qp.QPAttr{State: qp.StateRTS}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	wcs = waitWC(t, p, p.a.SCQ, 2, time.Second)
	expectStatus(t, wcs[1], 3, qp.WCSuccess)
}

// TestScatterGather sends from three local regions into a receive spread over
// two, and READs back into a scatter list.
func TestScatterGather(t *testing.T) {
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU256
	p := newPair(t, qp.RC, cleanNet, prm, 8)
	a1, a2, a3 := make([]byte, 300), make([]byte, 5), make([]byte, 700)
	fill(a1, 1)
	fill(a2, 2)
	fill(a3, 3)
	m1 := p.regMR(p.a, a1, 0x1000, qp.AccessLocalWrite)
	m2 := p.regMR(p.a, a2, 0x2000, qp.AccessLocalWrite)
	m3 := p.regMR(p.a, a3, 0x3000, qp.AccessLocalWrite)
	b1, b2 := make([]byte, 500), make([]byte, 600)
	n1 := p.regMR(p.b, b1, 0x1000, allAccess)
	n2 := p.regMR(p.b, b2, 0x5000, allAccess)
	if err := p.b.QP.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{Addr: 0x1000, Length: 500, LKey: n1.LKey()}, {Addr: 0x5000 + 100, Length: 500, LKey: n2.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	sgl := []qp.SGE{{Addr: 0x1000, Length: 300, LKey: m1.LKey()}, {Addr: 0x2000, Length: 5, LKey: m2.LKey()}, {Addr: 0x3000 + 50, Length: 650, LKey: m3.LKey()}}
	if err := p.a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: sgl}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, p, p.a.SCQ, 1, time.Second)
	want := append(append(append([]byte{}, a1...), a2...), a3[50:]...)
	got := append(append([]byte{}, b1...), b2[100:100+455]...)
	if !bytes.Equal(got, want) {
		t.Fatal("gathered SEND scattered wrongly")
	}
	// READ the 955 bytes back into a three-piece scatter list.
	r1, r2, r3 := make([]byte, 10), make([]byte, 400), make([]byte, 545)
	k1 := p.regMR(p.a, r1, 0x10000, qp.AccessLocalWrite)
	k2 := p.regMR(p.a, r2, 0x20000, qp.AccessLocalWrite)
	k3 := p.regMR(p.a, r3, 0x30000, qp.AccessLocalWrite)
	copy(b1, want[:500]) // B's two regions are not contiguous; read the first
	if err := p.a.QP.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled, RemoteAddr: 0x1000, RKey: n1.RKey(),
		SGL: []qp.SGE{{Addr: 0x10000, Length: 10, LKey: k1.LKey()}, {Addr: 0x20000, Length: 400, LKey: k2.LKey()}, {Addr: 0x30000, Length: 90, LKey: k3.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, p, p.a.SCQ, 1, time.Second)[0], 2, qp.WCSuccess)
	if !bytes.Equal(append(append(append([]byte{}, r1...), r2...), r3[:90]...), b1) || r3[90] != 0 {
		t.Fatal("READ scattered wrongly")
	}
}
