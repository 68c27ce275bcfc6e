package roce

import (
	"context"
	"runtime"
	"time"
)

// Run to completion.
//
// On a link that can be read without blocking (link.Poller), the goroutine
// that waits for a completion does the device's work itself: it takes the
// poller role, and until its CQ holds a completion or the busy-poll window
// passes, it reads the link, runs the engine on what arrived and transmits
// what that produced. A ping-pong then costs no goroutine wake-up at all:
// the packet that completes the wait is received by the waiter.
//
// Exactly one goroutine polls a link at a time: the role is a flag taken
// by compare-and-swap, and the links serialize their readers. A waiter that
// finds the role taken parks at once; the poller runs the engine for every
// QP of the device, so the completions of others wake them as before (one
// wake per completion, from the CQ's waiter queue).
//
// The receive goroutine remains for progress that nobody waits on. On such
// a link it sleeps in WaitReadable, which holds nothing a reader needs, and
// reads with PollBatch, so a waiter can always take the link from it. It
// stands by (parked, not watching the link) while a waiter polls, and for
// a linger after a poll that found work, so that the next wait of a
// ping-pong finds the link to itself and nothing else wakes for its
// packets. It watches the link again when
//   - a poller leaves without its completion (it is about to park, and its
//     wake-up must come from somewhere),
//   - goroutines are parked and nobody polls (a goroutine that parks while
//     nobody polls wakes it, and so does a poller that leaves while
//     goroutines are parked),
//   - the busy-poll window is closed (see missed), or
//   - the linger passes without a poll that found work.
// A goroutine that parks while another polls is served by that poller
// until it leaves, then by the receive goroutine.

// defaultBusyPoll is the busy-poll window when Options.BusyPoll is 0: a few
// round trips of a kernel UDP ping-pong on a loaded host.
const defaultBusyPoll = 50 * time.Microsecond

// The receive goroutine stands by for 4 busy-poll windows after a poll that
// found work, within these bounds: long enough to span the gap between two
// waits of a ping-pong, short enough that progress nobody waits on is
// hardly delayed.
const (
	minRxLinger = 200 * time.Microsecond
	maxRxLinger = 2 * time.Millisecond
)

// nowNs is the device clock in nanoseconds.
func (d *Device) nowNs() int64 { return int64(time.Since(d.start)) }

// sleepWaiter is implemented by links whose readiness the receive
// goroutine can wait for in a system call that blocks its thread, instead
// of parking in the runtime's network poller (the kernel UDP link). A
// goroutine parked in the poller becomes runnable only when a thread polls
// the network: the scheduler does so only when it finds no goroutine to
// run, sysmon every 10 ms. While every P runs goroutines that spin and
// yield (a QP per goroutine, each polling its CQ), the receive goroutine
// of a device nobody waits on (the target of RDMA WRITEs) then woke up to
// 10 ms late, and its peer timed out and resent. A thread blocked in the
// kernel wakes with the datagram, and its goroutine joins the run queue
// that the spinning goroutines yield to.
type sleepWaiter interface {
	// SleepReadable blocks the calling thread until frames may be
	// queued or the link is closed (ErrClosed); it takes nothing.
	SleepReadable() error
}

// waitReadable is a receive goroutine's wait for its queue.
func (q *rxQueue) waitReadable() error {
	if q.sleep != nil {
		return q.sleep.SleepReadable()
	}
	return q.poll.WaitReadable(context.Background())
}

// kickRx asks the receive goroutines to read the link. It never blocks.
func (d *Device) kickRx() {
	for _, q := range d.rxq {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
}

// rxStandBy holds the receive goroutine of q back while waiters poll the
// link, and for the linger after a poll that found work. It returns false
// when the device closes.
func (d *Device) rxStandBy(q *rxQueue) bool {
	kicked := false
	for {
		if d.ctx.Err() != nil {
			return false
		}
		var wait time.Duration
		if d.polling.Load() {
			// The poller's kick, if it parks, is the one that counts.
			kicked = false
			wait = d.rxLinger
		} else {
			// A goroutine parked with nobody polling waits for this
			// one: the linger is for the next wait of a ping-pong, not
			// for waits already parked.
			// With the window closed (see missed) no waiter reads the
			// link, CQ.Poll included: nothing to stand by for.
			idle := time.Duration(d.nowNs() - d.pollAt.Load())
			if kicked || d.parked.Load() > 0 || idle >= d.rxLinger || d.window.Load() <= 0 {
				return true
			}
			wait = d.rxLinger - idle
		}
		q.timer.Reset(wait)
		select {
		case <-q.kick:
			kicked = true
		case <-q.timer.C:
		case <-d.ctx.Done():
			q.timer.Stop()
			return false
		}
		q.timer.Stop()
	}
}

// busyPoll is the run-to-completion part of a wait on cq: it takes the
// poller role if it is free and polls until cq holds a completion, the
// window passes, ctx ends or the deadline passes. It reports whether cq
// holds a completion; without the role it returns false at once.
func (d *Device) busyPoll(cq *CQ, ctx context.Context, deadline time.Time) bool {
	window := time.Duration(d.window.Load())
	if window <= 0 || !d.polling.CompareAndSwap(false, true) {
		return false
	}
	end := time.Now().Add(window)
	if !deadline.IsZero() && deadline.Before(end) {
		end = deadline
	}
	got := false
	d.flushDeferred()
	for i := 0; ; i++ {
		// Posts of other goroutines that corked (Options.TxCork) leave
		// with this poller's next pass.
		d.flushDeferred()
		n, err := d.pollQueues()
		if n > 0 {
			d.flushOrDefer(cq)
		}
		if cq.avail.Load() > 0 {
			got = true
			break
		}
		if err != nil || cq.closed.Load() || d.closed.Load() {
			break
		}
		if n > 0 {
			continue
		}
		if i&15 == 15 && ctx.Err() != nil {
			break
		}
		if !time.Now().Before(end) {
			break
		}
		// Let other goroutines of the process (the one that produces the
		// next request, a second device's poller) have this CPU now and
		// then; the link is read again right after.
		if i&3 == 3 {
			runtime.Gosched()
		}
	}
	if !got {
		d.missed()
	}
	d.releasePoll(got, !got)
	return got
}

// Progress does the device's work once in the calling goroutine, as a
// CQ.Poll that finds its CQ empty does: one non-blocking read of the
// link, the engine run on what arrived and a transmit pass. It is for a
// goroutine that waits by spinning on memory a peer writes (an RDMA WRITE
// into a registered buffer, with no completion to poll): called now and
// then in the spin, it takes in the WRITE itself rather than wait for the
// device's receive goroutine, which spinners holding every CPU of the
// process keep from running (perftest's write-lat, both ends in one
// process on two CPUs: 212 µs typical against 5 µs). It does nothing
// when another goroutine polls the link, and on links that cannot be
// polled.
func (d *Device) Progress() {
	d.pollOnce(nil)
}

// pollOnce is CQ.Poll's share of the work when the CQ is empty: one
// non-blocking read of the link, with the engine run and a transmit pass
// on what it found. It does nothing when another goroutine polls or the
// busy-poll window is closed (see missed): a caller that spins on Poll
// then spins on the completion count only, as without busy polling.
func (d *Device) pollOnce(cq *CQ) {
	d.flushDeferred()
	if d.rxPoll == nil || d.window.Load() <= 0 || !d.polling.CompareAndSwap(false, true) {
		return
	}
	n, _ := d.pollQueues()
	if n > 0 {
		d.flushOrDefer(cq)
	}
	// The caller does not park: it may poll again or go on with other
	// work, so an empty poll leaves the receive goroutine as it is.
	d.releasePoll(n > 0, false)
	// A caller that spins on Poll (perftest's loop spins thousands of
	// times before it waits) would otherwise hold its P through a
	// syscall per call, and the goroutines that produce what it waits for
	// (the peer's half of a loopback run, a receive goroutine woken by
	// the network) could not run: that made the tail on a loaded host.
	// Yield now and then, as busyPoll does.
	if n == 0 && d.pollEmpty.Add(1)&3 == 0 {
		runtime.Gosched()
	}
}

// The busy-poll window adapts to how long completions take. A window that
// passes without its completion halves the next one, down to nothing, so a
// host too busy to answer within the window (other processes on every
// CPU, a slow peer) does not pay for polling that does not pay off: its
// waiters park at once, as without busy polling. A parked waiter whose
// completion the receive goroutine read within the configured window
// (Options.BusyPoll) of the wait's start shows that polling would have
// caught it, and restores the window.

// missed notes a busy-poll window that passed without its completion.
func (d *Device) missed() {
	w := d.window.Load() / 2
	if w < int64(d.busyPollWindow)/16 {
		w = 0
	}
	d.window.Store(w)
}

// parkedFor notes that a waiter which started waiting at start (nowNs)
// parked and got its completion.
func (d *Device) parkedFor(start int64) {
	if d.window.Load() < int64(d.busyPollWindow) && d.rxAt.Load()-start <= int64(d.busyPollWindow) {
		d.window.Store(int64(d.busyPollWindow))
	}
}

// releasePoll gives the poller role back. A poll that found work keeps the
// receive goroutine standing by for the linger, unless goroutines parked
// meanwhile: their completions may come after this poller leaves, and
// waiting for the linger (or for the next poller) to read them is what made
// the tail. A poller that is about to park hands the link over too.
//
// parking (the parked side) raises parked before it looks at polling, and
// this stores polling before it looks at parked, so one of the two kicks.
func (d *Device) releasePoll(found, parking bool) {
	if found {
		d.pollAt.Store(d.nowNs())
	}
	d.polling.Store(false)
	if parking || d.parked.Load() > 0 {
		d.kickRx()
	}
}

// parking notes a goroutine about to park (undone by parked.Add(-1)). If nobody
// polls the link, the receive goroutine must read it (see releasePoll for
// the other side).
func (d *Device) parking() {
	d.parked.Add(1)
	if !d.polling.Load() {
		d.kickRx()
	}
}
