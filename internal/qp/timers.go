package qp

import "time"

// timerHeap holds the QPs that may have a timer running, ordered by a key
// that is never later than the QP's earliest deadline (QP.deadline), so
// that NextDeadline and Advance cost O(log n) per timer event instead of a
// scan of every QP with a timer.
//
// Keys are lazy: arming a timer earlier lowers the QP's key (watchTimers),
// but stopping a timer or moving it later leaves the key as it was, since
// those happen per packet and are many. A QP whose key turns out early is
// fixed when it reaches the top: NextDeadline re-keys or drops it, Advance
// runs it (finding nothing due) and re-keys it. Each such fix is paid for
// by the arm that made the key.
type timerHeap struct {
	ents []timerEnt
	// pos gives, per timer slot, 1 + the slot's QP's index in ents (0: not
	// in the heap). A QP takes a slot when it first arms a timer and keeps
	// it until destroyed. The heap's moves write here, in a dense array,
	// and not into the QPs, which with 100,000 of them are out of cache.
	pos  []int32
	free []int32 // slots of destroyed QPs, for reuse
	// due holds the QPs Advance has run in the current pass, so that a QP
	// whose timer is re-armed at or before now by the pass runs at most once
	// per call, as it did with a scan.
	due  []*QP
	pass uint32
}

type timerEnt struct {
	at   time.Duration
	slot int32
	q    *QP
}

func (h *timerHeap) len() int { return len(h.ents) }

// index returns q's index in ents, or -1 if q is not in the heap.
func (h *timerHeap) index(q *QP) int {
	if q.timerSlot == 0 {
		return -1
	}
	return int(h.pos[q.timerSlot]) - 1
}

// arm makes q's key at most at, inserting q if it is not in the heap.
func (h *timerHeap) arm(q *QP, at time.Duration) {
	if q.timerIn && at >= q.timerKey {
		// The common case, a timer pushed later on each packet sent: the
		// QP's own copy of its key answers without touching the heap.
		return
	}
	q.timerIn, q.timerKey = true, at
	if q.timerSlot == 0 {
		if n := len(h.free); n > 0 {
			q.timerSlot = h.free[n-1]
			h.free = h.free[:n-1]
		} else {
			if len(h.pos) == 0 {
				h.pos = append(h.pos, 0) // slot 0 means none
			}
			q.timerSlot = int32(len(h.pos))
			h.pos = append(h.pos, 0)
		}
	}
	i := h.index(q)
	if i < 0 {
		h.ents = append(h.ents, timerEnt{at, q.timerSlot, q})
		h.pos[q.timerSlot] = int32(len(h.ents))
		h.up(len(h.ents) - 1)
		return
	}
	if at < h.ents[i].at {
		h.ents[i].at = at
		h.up(i)
	}
}

// rekey sets the key of the entry at i to at exactly.
func (h *timerHeap) rekey(i int, at time.Duration) {
	old := h.ents[i].at
	h.ents[i].at = at
	h.ents[i].q.timerKey = at
	if at < old {
		h.up(i)
	} else {
		h.down(i)
	}
}

// remove takes q out of the heap if it is in it.
func (h *timerHeap) remove(q *QP) {
	i := h.index(q)
	if i < 0 {
		return
	}
	last := len(h.ents) - 1
	if i != last {
		h.swap(i, last)
	}
	h.ents[last] = timerEnt{}
	h.ents = h.ents[:last]
	h.pos[q.timerSlot] = 0
	q.timerIn = false
	if i != last {
		h.down(i)
		h.up(i)
	}
}

// release takes a destroyed QP out of the heap and frees its slot.
func (h *timerHeap) release(q *QP) {
	if q.timerSlot == 0 {
		return
	}
	h.remove(q)
	h.free = append(h.free, q.timerSlot)
	q.timerSlot = 0
}

func (h *timerHeap) swap(i, j int) {
	h.ents[i], h.ents[j] = h.ents[j], h.ents[i]
	h.pos[h.ents[i].slot] = int32(i + 1)
	h.pos[h.ents[j].slot] = int32(j + 1)
}

// The heap is 4-ary: half the levels of a binary heap, and so half the
// moves; the four children it compares sit side by side in ents.
const timerArity = 4

func (h *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / timerArity
		if h.ents[p].at <= h.ents[i].at {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap) down(i int) {
	n := len(h.ents)
	for {
		first := timerArity*i + 1
		if first >= n {
			return
		}
		c := first
		for k := first + 1; k < first+timerArity && k < n; k++ {
			if h.ents[k].at < h.ents[c].at {
				c = k
			}
		}
		if h.ents[i].at <= h.ents[c].at {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// next returns the earliest deadline of any QP in the heap, first
// dropping QPs with no timer left and re-keying those whose key is early.
func (h *timerHeap) next() (time.Duration, bool) {
	for len(h.ents) > 0 {
		top := h.ents[0]
		d, ok := top.q.deadline()
		if !ok || top.q.destroyed {
			h.remove(top.q)
			continue
		}
		if d == top.at {
			return d, true
		}
		h.rekey(0, d)
	}
	return 0, false
}

// advance runs the timers of every QP whose key is at or before now.
func (h *timerHeap) advance(now time.Duration) {
	h.pass++
	for len(h.ents) > 0 && h.ents[0].at <= now {
		q := h.ents[0].q
		h.remove(q)
		if q.destroyed {
			continue
		}
		if q.timerPass == h.pass {
			// Re-armed by this pass at or before now: next call.
			h.due = append(h.due, q)
			continue
		}
		q.timerPass = h.pass
		q.advance(now)
		q.publishHead()
		if d, ok := q.deadline(); ok {
			h.arm(q, d)
		}
	}
	for i, q := range h.due {
		if d, ok := q.deadline(); ok && !q.destroyed {
			h.arm(q, d)
		}
		h.due[i] = nil
	}
	h.due = h.due[:0]
}
