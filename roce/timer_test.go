package roce

import (
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// The timer goroutine sleeps until the engine's next deadline: it does not
// wake while nothing is outstanding, nor while the only pending timer is a
// retransmission seconds away. (A periodic tick would wake it hundreds of
// times in the windows below.)
func TestTimerSleepsUntilDeadline(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a, b := newEndpoint(t, da, RC, 4096), newEndpoint(t, db, RC, 4096)
	// Timeout 21: a retransmission timer of about 8.6 s.
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 21})
	write := func(id uint64) {
		t.Helper()
		if err := a.qp.PostSend(&SendWR{ID: id, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
			RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		write(uint64(i))
		wantOK(t, waitWC(t, a.scq, 5*time.Second), WCRDMAWrite)
	}
	// The last ACK may still leave one stale wake-up at the old deadline
	// (seconds away); allow a few rounds for kicks in flight.
	const window = 300 * time.Millisecond
	w0 := da.ctr.timerWakes.Load()
	time.Sleep(window)
	if n := da.ctr.timerWakes.Load() - w0; n > 3 {
		t.Errorf("idle device with a QP in RTS: timer goroutine woke %d times in %v", n, window)
	}
	// One packet the peer never acknowledges.
	db.Close()
	write(100)
	time.Sleep(10 * time.Millisecond)
	w0 = da.ctr.timerWakes.Load()
	time.Sleep(window)
	if n := da.ctr.timerWakes.Load() - w0; n > 3 {
		t.Errorf("one packet outstanding, retransmission seconds away: timer goroutine woke %d times in %v", n, window)
	}
}

// Arming a timer earlier than the timer goroutine's planned wake-up resets
// its runtime timer instead of waking it to do so: a ping-pong whose every
// message arms a probe while nothing else is pending wakes the goroutine
// about once per message (at the probe deadline, or not at all when the
// next message has moved it), not twice (a kick at once, then the
// deadline).
func TestTimerArmDoesNotWake(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a, b := newEndpoint(t, da, RC, 4096), newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 21})
	const n = 200
	var w0 uint64
	for i := range n {
		if i == 20 { // RTT samples taken: probes are armed from here on
			w0 = da.ctr.timerWakes.Load()
		}
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
			RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
		wantOK(t, waitWC(t, a.scq, 5*time.Second), WCRDMAWrite)
		// Let the probe deadline pass, so each message starts with no
		// timer pending: the case where a kick used to wake the goroutine.
		time.Sleep(time.Millisecond)
	}
	if w := da.ctr.timerWakes.Load() - w0; w > (n-20)*3/2 {
		t.Errorf("%d messages, each arming a probe: timer goroutine woke %d times (a wake to arm and one at the deadline would be about %d)", n-20, w, 2*(n-20))
	} else {
		t.Logf("%d messages: %d timer wake-ups", n-20, w)
	}
}
