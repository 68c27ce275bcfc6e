package qp_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

// A burst of requests that arrives in one receive batch is acknowledged by
// one ACK, and the ACKs folded into it are counted (ack_deferred); the ACK
// still leaves with the next transmit pass.
func TestAckCoalescedPerBatch(t *testing.T) {
	const n = 8
	p := newPair(t, qp.RC, impairment{name: "clean", ab: faultnet.Config{}, ba: faultnet.Config{}}, qptest.DefaultRC, 16)
	aMR := p.regMR(p.a, make([]byte, 64*n), 0x1000, allAccess)
	bMR := p.regMR(p.b, make([]byte, 64*n), 0x7000_0000, allAccess)
	for i := range n {
		if err := p.a.QP.PostSend(&qp.SendWR{ID: uint64(i), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL:        []qp.SGE{{Addr: 0x1000 + 64*uint64(i), Length: 64, LKey: aMR.LKey()}},
			RemoteAddr: 0x7000_0000 + 64*uint64(i), RKey: bMR.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	// One step: A sends the burst, B receives it as one batch.
	p.net.Step()
	before := p.net.B.E.Stats()
	if before.RxPackets != n {
		t.Fatalf("B received %d packets in the first step, want %d", before.RxPackets, n)
	}
	var wcs []qp.WorkCompletion
	if err := p.net.Run(func() bool { wcs = pollAll(p.a.SCQ, wcs); return len(wcs) == n }, time.Second); err != nil {
		t.Fatal(err)
	}
	s := p.net.B.E.Stats()
	if s.TxPackets != 1 || s.AcksCoalesced != n-1 {
		t.Errorf("B sent %d packets with %d ACKs coalesced, want 1 and %d", s.TxPackets, s.AcksCoalesced, n-1)
	}
	for _, wc := range wcs {
		if wc.Status != qp.WCSuccess {
			t.Errorf("completion %+v", wc)
		}
	}
}

// An ACK queued by a receive leaves before a request the application posted
// after that receive, even when it is the requests' turn: a peer whose reply
// overtakes the ACK of the message it answers sees the reply completed
// before its own message (the NAAICE C host treats that as an error).
func TestAckLeavesBeforeLaterRequest(t *testing.T) {
	p := newPair(t, qp.RC, impairment{name: "clean", ab: faultnet.Config{}, ba: faultnet.Config{}}, qptest.DefaultRC, 16)
	aMR := p.regMR(p.a, make([]byte, 256), 0x1000, allAccess)
	bMR := p.regMR(p.b, make([]byte, 256), 0x7000_0000, allAccess)
	write := func(ep *qptest.Endpoint, id uint64, lkey, rkey uint32, local, remote uint64) {
		t.Helper()
		if err := ep.QP.PostSend(&qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: local, Length: 64, LKey: lkey}}, RemoteAddr: remote, RKey: rkey}); err != nil {
			t.Fatal(err)
		}
	}
	// B answers one message of A, so its next transmit would be a request's
	// turn if requests and responses simply alternated.
	write(p.a, 1, aMR.LKey(), bMR.RKey(), 0x1000, 0x7000_0000)
	var wcs []qp.WorkCompletion
	if err := p.net.Run(func() bool { wcs = pollAll(p.a.SCQ, wcs); return len(wcs) == 1 }, time.Second); err != nil {
		t.Fatal(err)
	}
	write(p.a, 2, aMR.LKey(), bMR.RKey(), 0x1000, 0x7000_0040)
	p.net.Step() // A sends; B receives and queues its ACK, but has not transmitted
	var order []ib.Opcode
	p.net.Tap = func(from string, b []byte) {
		if from == "B" {
			order = append(order, ib.BTH(b).Opcode())
		}
	}
	write(p.b, 3, bMR.LKey(), aMR.RKey(), 0x7000_0000, 0x1000+128)
	p.net.Step()
	if len(order) < 2 || order[0] != ib.RCAck {
		t.Fatalf("B sent %v after receiving A's WRITE and posting its own, want the ACK first", order)
	}
}
