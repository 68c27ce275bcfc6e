package qp_test

import (
	"testing"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// TakeArmed reports each newly armed timer once, no later than the
// engine's next deadline, so a driver can sleep until NextDeadline and be
// woken only by an earlier arm.
func TestTakeArmed(t *testing.T) {
	p := newPair(t, qp.RC, impairments()[0], qptest.DefaultRC, 16)
	e := p.net.A.E
	if _, ok := e.TakeArmed(); ok {
		t.Fatal("a timer armed before anything was sent")
	}
	aMR := p.regMR(p.a, make([]byte, 64), 0x1000, allAccess)
	bMR := p.regMR(p.b, make([]byte, 64), 0x7000_0000, allAccess)
	if err := p.a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()}); err != nil {
		t.Fatal(err)
	}
	slots := make([]qp.TxPacket, 4)
	for i := range slots {
		slots[i].Buf, slots[i].Headroom = make([]byte, 4096+256), 64
	}
	if n := e.Transmit(slots); n != 1 {
		t.Fatalf("transmitted %d packets, want 1", n)
	}
	at, ok := e.TakeArmed()
	next, okNext := e.NextDeadline()
	if !ok || !okNext || at != next || at <= p.net.Clock.T {
		t.Fatalf("after a send: TakeArmed %v %v, NextDeadline %v %v, now %v", at, ok, next, okNext, p.net.Clock.T)
	}
	if _, ok := e.TakeArmed(); ok {
		t.Fatal("TakeArmed reported the same arm twice")
	}
}
