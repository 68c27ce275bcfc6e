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

// flushDeferred runs a deferred pass, if there is one.
func (d *Device) flushDeferred() {
	if d.deferred.Load() {
		d.flush()
	}
}

// undefer notes that a transmit pass is about to run: whatever was
// deferred goes with it.
func (d *Device) undefer() {
	if d.deferred.Load() && d.deferred.CompareAndSwap(true, false) {
		d.deferT.Stop()
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
