package roce

import "time"

// Deferred transmit passes.
//
// A poller that reads the packet completing its caller's wait (a SEND that
// consumes the receive it waits for) has the engine's answer to it queued,
// typically an ACK. Sending that at once costs a system call on the path
// of the reply the caller is about to post: on AF_XDP the kernel delivers
// a frame to the peer within the sendto that kicks it, so the ACK's sendto
// ran through the peer's receive before the reply's own. The poller
// leaves the pass to its caller instead: the caller's next verb (a post,
// a poll, a wait) transmits, the ACK and the reply in one batch and one
// system call, the ACK first as the engine queues it. A timer bounds the
// delay for a caller that does neither, well below the peer's shortest
// probe timeout. Only with Options.AckWithReply, or for waiters of a CQ
// that asked for it (CQ.SetAckWithReply): by default the pass runs at
// once, as a hardware responder acknowledges at once.
//
// A post corks the same way (Options.TxCork): when the device's last
// transmit pass ended moments ago, the posts are a stream, and the caller
// is about to post again or to poll. Its packets wait for the caller's
// next poll or wait, or for a busy poller's next round, so that a stream
// of 64-byte SENDs goes in a few link writes instead of a system call
// each; the timer bounds the delay as above. A post after a pause finds
// no recent pass and transmits at once, so latency tests do not change.

// defaultTxCork is Options.TxCork's default: longer than the gap between
// the posts of a stream from one goroutine (under 1 µs), shorter than a
// round trip, so that a post answering a completion never waits.
const defaultTxCork = 2 * time.Microsecond

// deferMax bounds how long a deferred pass waits for its caller.
const deferMax = 20 * time.Microsecond

// flushOrDefer runs the transmit pass after a poll that found frames, or,
// if the poll completed the wait on cq, leaves it to the caller.
func (d *Device) flushOrDefer(cq *CQ) {
	if cq == nil || cq.avail.Load() <= 0 || !(d.ackWithReply.Load() || cq.ackWithReply.Load()) {
		d.flush()
		return
	}
	d.deferred.Store(true)
	d.deferT.Reset(deferMax)
}

// flushPosted runs the transmit pass of a post, or leaves it to the
// caller's next poll or wait when a pass ended moments ago
// (Options.TxCork). Only the goroutine that raises deferred arms the
// timer, and undefer does not stop it: a timer stopped after another
// poster armed it would leave that post waiting for its caller alone. A
// timer that fires with nothing deferred does nothing.
func (d *Device) flushPosted() {
	if d.corkNs > 0 && d.nowNs()-d.lastTx.Load() < d.corkNs {
		d.ctr.corked.Add(1)
		if !d.deferred.Swap(true) {
			d.deferT.Reset(deferMax)
		}
		return
	}
	d.flush()
}

// flushDeferred runs a deferred pass, if there is one.
func (d *Device) flushDeferred() {
	if d.deferred.Load() {
		d.flush()
	}
}

// undefer notes that a transmit pass is about to run: whatever was
// deferred goes with it.
func (d *Device) undefer() {
	if d.deferred.Load() {
		d.deferred.Store(false)
	}
}

// deferLoop runs the pass for a caller that did not come back. It is a
// goroutine of its own, not a time.AfterFunc: an AfterFunc starts a
// goroutine each time it fires, an allocation on the data path.
func (d *Device) deferLoop() {
	defer d.wg.Done()
	for {
		select {
		case <-d.deferT.C:
			if d.deferred.Load() && !d.closed.Load() {
				d.flush()
			}
		case <-d.ctx.Done():
			d.deferT.Stop()
			return
		}
	}
}
