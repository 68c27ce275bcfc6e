package qp_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// A process that was itself stalled past the local ACK timeout runs its
// timers before it reads what the peer sent meanwhile. The retransmit
// timer, found due far later than its deadline, waits an eighth of its
// timeout more, so the ACK already received completes the WRITE without a
// timeout; a WRITE that was really lost still times out, that much later.
func TestLateTimerAwaitsInput(t *testing.T) {
	n, a, b := slowRC(t, 0, 0, 4)
	rto := 4096 * time.Nanosecond << qptest.DefaultRC.Timeout
	src, dst := make([]byte, 64), make([]byte, 64)
	aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	var (
		held  [][]byte // B's packets, not yet read by A
		loseA bool
		wcs   [4]qp.WorkCompletion
	)
	n.Drop = func(from string, p []byte) bool {
		if from == "B" {
			held = append(held, append([]byte(nil), p...))
		}
		return from == "B" || loseA
	}
	post := func(id uint64) {
		wr := qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()}
		if err := a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	// stall moves the clock by d with nothing delivered, then runs A's
	// timers: the process wakes late.
	stall := func(d time.Duration) {
		n.Clock.T += d
		n.A.E.Advance(n.Clock.T)
		n.B.E.Advance(n.Clock.T)
	}
	read := func() { held = deliverToA(n, held) }
	post(1)
	for i := 0; i < 100 && len(held) == 0; i++ {
		n.Step()
		n.Clock.T += 10 * time.Microsecond
	}
	if len(held) == 0 {
		t.Fatal("B sent no ACK")
	}
	stall(rto + rto/2)
	if st := n.A.E.Stats(); st.Timeouts != 0 {
		t.Fatalf("a timer found late timed out at once (%d timeouts) with the ACK waiting to be read", st.Timeouts)
	}
	read()
	if k := a.SCQ.Poll(wcs[:]); k != 1 || wcs[0].Status != qp.WCSuccess {
		t.Fatalf("after the ACK: %d completions %+v", k, wcs[:k])
	}

	// A lost WRITE, found late: it still times out, an eighth later.
	loseA = true
	post(2)
	n.Step()
	stall(rto + rto/2)
	if st := n.A.E.Stats(); st.Timeouts != 0 {
		t.Fatalf("%d timeouts before the grace passed", st.Timeouts)
	}
	stall(rto / 8)
	if st := n.A.E.Stats(); st.Timeouts != 1 {
		t.Fatalf("%d timeouts after the grace: want 1", st.Timeouts)
	}
	loseA = false
	if err := n.Run(func() bool {
		read()
		return a.SCQ.Poll(wcs[:]) > 0
	}, time.Second); err != nil {
		t.Fatal(err)
	}
	if wcs[0].Status != qp.WCSuccess || wcs[0].WRID != 2 {
		t.Fatalf("the resent WRITE: %+v", wcs[0])
	}
}
