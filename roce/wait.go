package roce

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// errRepark is park's answer when the context's Done channel closed but its
// Err is nil: the wait goes on.
var errRepark = errors.New("roce: park again")

// waiter is one parked goroutine. Entries are recycled through a free list,
// so a wait allocates nothing once the list has warmed up.
type waiter struct {
	// ch receives one token when a waker dequeues the entry. The token is
	// sent under the queue's lock into an empty one-slot buffer, so a waker
	// never blocks and a wake-up is never lost.
	ch    chan struct{}
	timer *time.Timer // deadline timer, made on first use and reused
	next  *waiter
	prev  *waiter
	in    *waitQueue // the queue the entry is on, nil when dequeued
}

var waiterFree struct {
	mu   sync.Mutex
	list *waiter
}

func getWaiter() *waiter {
	waiterFree.mu.Lock()
	w := waiterFree.list
	if w != nil {
		waiterFree.list = w.next
		w.next = nil
	}
	waiterFree.mu.Unlock()
	if w == nil {
		w = &waiter{ch: make(chan struct{}, 1)}
	}
	return w
}

func putWaiter(w *waiter) {
	waiterFree.mu.Lock()
	w.next = waiterFree.list
	waiterFree.list = w
	waiterFree.mu.Unlock()
}

// waitQueue is a FIFO of parked goroutines, in the style of gVisor's
// waiter.Queue: a waker dequeues entries and hands each a token. Waking one
// entry per event (not all of them) keeps many waiters on one queue from
// stampeding: only as many wake as there is work for.
type waitQueue struct {
	mu         sync.Mutex
	head, tail *waiter
	n          atomic.Int32 // queued entries: the waker's lock-free fast path
}

func (q *waitQueue) enqueue(w *waiter) {
	q.mu.Lock()
	w.in, w.prev, w.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n.Add(1)
	q.mu.Unlock()
}

func (q *waitQueue) unlink(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.in, w.prev, w.next = nil, nil, nil
	q.n.Add(-1)
}

// remove takes w off the queue. When a waker dequeued it first, the token it
// sent is consumed, so the entry goes back to the free list clean; the
// result says whether that happened.
func (q *waitQueue) remove(w *waiter) (woken bool) {
	q.mu.Lock()
	if w.in == q {
		q.unlink(w)
		q.mu.Unlock()
		return false
	}
	q.mu.Unlock()
	<-w.ch // sent under q.mu before w.in was cleared: already there
	return true
}

// wakeOne wakes the longest waiting entry, if any. It never blocks, so it
// may run under the device lock on the data path.
func (q *waitQueue) wakeOne() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	if w := q.head; w != nil {
		q.unlink(w)
		w.ch <- struct{}{}
	}
	q.mu.Unlock()
}

// wakeAll wakes every entry (the object closed).
func (q *waitQueue) wakeAll() {
	q.mu.Lock()
	for w := q.head; w != nil; w = q.head {
		q.unlink(w)
		w.ch <- struct{}{}
	}
	q.mu.Unlock()
}

// park blocks the calling goroutine until w is woken (nil), ctx ends (its
// error), the deadline passes (os.ErrDeadlineExceeded) or the device closes
// (ErrClosed). A zero deadline does not bound the wait.
//
// This is the one place where a goroutine waits for the device to make
// progress on an object it cares about; the caller has queued w on that
// object's waitQueue and checked for progress after queueing, so a wake-up
// between the check and the park is kept in w.ch. A run-to-completion data
// path has run before: the waiting goroutine read the link, ran the engine
// and transmitted for a bounded busy-poll window (Device.busyPoll); here it
// tells the receive goroutine that a parked goroutine needs the link read.
func (d *Device) park(ctx context.Context, w *waiter, deadline time.Time) error {
	if d.rxPoll != nil {
		d.parking()
		defer d.parked.Add(-1)
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		dur := time.Until(deadline)
		if dur <= 0 {
			return os.ErrDeadlineExceeded
		}
		if w.timer == nil {
			w.timer = time.NewTimer(dur)
		} else {
			w.timer.Reset(dur)
		}
		// Since Go 1.23 a stopped timer delivers no stale value, so the
		// entry's timer is reusable after Stop.
		defer w.timer.Stop()
		timeout = w.timer.C
	}
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		if err := ctx.Err(); err != nil {
			return err
		}
		// Done closed while Err says the context goes on: a context
		// whose Done channel is replaced when its deadline is reset (as
		// net.Pipe's deadlines are) ends this park, not the wait. The
		// entry is still queued, so the caller must take it off.
		return errRepark
	case <-timeout:
		return os.ErrDeadlineExceeded
	case <-d.ctx.Done():
		return ErrClosed
	}
}
