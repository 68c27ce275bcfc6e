package qp

import (
	"testing"

	"github.com/goroce/goroce/ib"
)

// TestLookupQPReuse: the QP of the last received packet is tried first, but
// never once destroyed: a new QP given the same number gets the packets.
func TestLookupQPReuse(t *testing.T) {
	e, _ := New(Config{Clock: fixedClock{}})
	pd, _ := e.AllocPD()
	cq, _ := e.CreateCQ(16)
	create := func() *QP {
		t.Helper()
		q, err := pd.CreateQP(&QPInitAttr{Type: RC, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	old, other := create(), create()
	var p ib.Packet
	b := make([]byte, ib.BTHSize+ib.ICRCSize)
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: ib.RCSendOnly, PKey: 0xFFFF, DestQP: old.QPN()})
	if err := ib.ParseIB(b, &p); err != nil {
		t.Fatal(err)
	}
	e.Receive(&p, nil) // RESET: dropped, but the lookup is remembered
	if e.lookupQP(old.QPN()) != old || e.lookupQP(other.QPN()) != other || e.lookupQP(old.QPN()) != old {
		t.Fatal("lookup finds another QP")
	}
	qpn := old.QPN()
	if err := old.Destroy(); err != nil {
		t.Fatal(err)
	}
	if q := e.lookupQP(qpn); q != nil {
		t.Fatalf("destroyed QP %d still found", qpn)
	}
	if err := e.Receive(&p, nil); err != ErrUnknownQP {
		t.Fatalf("packet to a destroyed QP: %v, want ErrUnknownQP", err)
	}
	SetNextQPN(e, qpn)
	fresh := create()
	if fresh.QPN() != qpn {
		t.Fatalf("new QP numbered %d, want %d", fresh.QPN(), qpn)
	}
	if q := e.lookupQP(qpn); q != fresh {
		t.Fatal("a reused QPN finds the destroyed QP")
	}
	if err := e.Receive(&p, nil); err != ErrNotReady {
		t.Fatalf("packet to the new QP in RESET: %v, want ErrNotReady", err)
	}
}
