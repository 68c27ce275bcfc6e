package qp

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The timer heap against a scan of every QP: after any mix of arms,
// stops, moves later and destroys, NextDeadline is the earliest deadline of
// any live QP, and Advance runs the timers of exactly the QPs due.
func TestTimerHeapMatchesScan(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		e := &Engine{}
		qs := make([]*QP, 1+rng.IntN(200))
		for i := range qs {
			// In RESET the timers run and stop without sending anything.
			qs[i] = &QP{e: e, qpn: uint32(firstQPN + i), rto: time.Microsecond}
		}
		now := time.Duration(0)
		for step := 0; step < 2000; step++ {
			q := qs[rng.IntN(len(qs))]
			at := now + time.Duration(rng.IntN(1000))
			switch op := rng.IntN(10); {
			case q.destroyed:
			case op < 3: // arm the retransmit timer
				q.comp.armed, q.comp.deadline = true, at
				q.watchTimers(at)
			case op < 5: // arm a probe
				q.comp.win.probeArmed, q.comp.win.probeAt = true, at
				q.watchTimers(at)
			case op < 6: // stop the retransmit timer without telling the heap
				q.comp.armed = false
			case op < 7: // move the probe later without telling the heap
				if q.comp.win.probeArmed {
					q.comp.win.probeAt += time.Duration(rng.IntN(500))
				}
			case op < 8 && rng.IntN(20) == 0:
				e.timers.release(q)
				q.destroyed = true
			default: // a timer event
				want, wantOK := scanDeadline(qs)
				got, ok := e.NextDeadline()
				if ok != wantOK || got != want {
					t.Fatalf("seed %d step %d: NextDeadline %v %v, scan %v %v", seed, step, got, ok, want, wantOK)
				}
				if ok {
					now = got + time.Duration(rng.IntN(3))
				}
				var due []*QP
				for _, x := range qs {
					if d, has := x.deadline(); has && !x.destroyed && d <= now {
						due = append(due, x)
					}
				}
				e.Advance(now)
				for _, x := range due {
					if d, has := x.deadline(); has && d <= now {
						t.Fatalf("seed %d step %d: QP %d due at %v still pending at %v", seed, step, x.qpn, d, now)
					}
				}
			}
			checkHeap(t, e, qs)
		}
	}
}

// scanDeadline is NextDeadline as it was: a scan of every QP.
func scanDeadline(qs []*QP) (time.Duration, bool) {
	var best time.Duration
	ok := false
	for _, q := range qs {
		if d, has := q.deadline(); has && !q.destroyed && (!ok || d < best) {
			best, ok = d, true
		}
	}
	return best, ok
}

// checkHeap checks the heap order, the QPs' indices, and that every live
// QP with a timer is in the heap with a key no later than its deadline.
func checkHeap(t *testing.T, e *Engine, qs []*QP) {
	t.Helper()
	h := &e.timers
	for i, x := range h.ents {
		if x.slot != x.q.timerSlot || h.index(x.q) != i {
			t.Fatalf("entry %d: slot %d, QP's slot %d at index %d", i, x.slot, x.q.timerSlot, h.index(x.q))
		}
		if p := (i - 1) / timerArity; i > 0 && h.ents[p].at > x.at {
			t.Fatalf("entry %d: key %v before its parent's %v", i, x.at, h.ents[p].at)
		}
	}
	for _, q := range qs {
		d, has := q.deadline()
		if !has || q.destroyed {
			continue
		}
		i := h.index(q)
		if i < 0 {
			t.Fatalf("QP %d has a timer at %v but is not in the heap", q.qpn, d)
		}
		if k := h.ents[i].at; k != q.timerKey || !q.timerIn {
			t.Fatalf("QP %d keyed at %v, its copy says %v (in the heap: %v)", q.qpn, k, q.timerKey, q.timerIn)
		}
		if k := h.ents[i].at; k > d {
			t.Fatalf("QP %d keyed at %v, after its deadline %v", q.qpn, k, d)
		}
	}
}

// A timer event costs no allocation once the heap has grown.
func TestTimerHeapAllocs(t *testing.T) {
	e := &Engine{}
	qs := make([]*QP, 1000)
	for i := range qs {
		qs[i] = &QP{e: e}
		qs[i].comp.win.probeArmed, qs[i].comp.win.probeAt = true, time.Duration(i)
		qs[i].watchTimers(time.Duration(i))
	}
	k := 0
	a := testing.AllocsPerRun(500, func() {
		now, ok := e.NextDeadline()
		if !ok {
			t.Fatal("no timer pending")
		}
		e.Advance(now)
		// Arm one again, later, as a probe or a retransmission does.
		q := qs[k%len(qs)]
		k++
		q.comp.win.probeArmed, q.comp.win.probeAt = true, now+time.Millisecond
		q.watchTimers(q.comp.win.probeAt)
	})
	if a != 0 {
		t.Fatalf("%v allocations per timer event", a)
	}
}
