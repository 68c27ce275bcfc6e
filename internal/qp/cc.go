package qp

import (
	"time"

	"github.com/goroce/goroce/ib"
)

// sendWindow bounds what an RC requester has in flight when loss appears,
// and recovers from a lost retransmission, NAK or tail packet sooner than
// the local ACK timeout.
//
// Go-back-N makes every loss cost what is in flight behind the lost packet:
// the responder drops it all and it is sent again, so a window fuller than
// the path (a standing queue) is resent whole. When a sequence-error NAK or
// a response gap starts a go-back-N episode, the window falls to what the
// path holds without a queue, window × minRTT/sRTT (half the window before
// the first round-trip sample), never below minWindow; it grows by one per
// window of acknowledged PSNs (additive increase, multiplicative decrease,
// in the spirit of TCP and DCQCN). A timeout or probe drops it to one PSN,
// from which it grows back by what each ACK covers (slow start) to where the
// loss left it. Without loss it stays at the full requester window
// (RXE_MAX_UNACKED_PSNS), so a lossless stream sends exactly what it sent
// without it. The PSN sequence stays go-back-N: new PSNs leave in order and
// a resend starts at the first unacknowledged one, as an rxe responder
// expects; READ and atomic credits (max_rd_atomic) are counted as before.
//
// A responder NAKs a gap once, so a lost NAK, a lost first resend or a lost
// last packet leaves nothing to provoke another: the requester would wait
// for the local ACK timeout (67 ms at the usual 14). The probe timer, a few
// smoothed round trips, resends the first unacknowledged PSN (with AckReq)
// instead: the responder either accepts it, or, holding it already, ACKs
// again everything it has. Probes back off, never count as retries and never
// move the local ACK timeout, which keeps its IB meaning (retry_cnt).
//
// A probe must not fire while the path may still answer: rxe and NICs
// resend only after the local ACK timeout, and a guest or process that is
// descheduled for milliseconds under load answers late, not never. A probe
// that finds nothing lost is answered by an ACK of what the responder holds,
// but so is one sent after a lost ACK, and the timing of that ACK does not
// tell them apart: after a wait the answer to a single packet may come
// sooner than a streaming round trip or later than one (TCP's Eifel
// detection, RFC 4015, uses timestamps). On a lossy path only the
// responder's second ACK of the same PSN shows a stall: it ACKs the probe, a duplicate, again
// (C9-105), so two ACKs of a PSN mean that the original's ACK and the
// probe's both came (RFC 3708 does the same with D-SACK). After a lost ACK
// only the probe's comes. A goroce responder that reads a backlog at once
// sends a single ACK for both, though, so on a path that lost nothing in
// the last peakHold, where a lost ACK is unlikely, an ACK that came too
// soon after the probe to answer it or later than a round trip after it
// counts as well. So does a first ACK after the probe that leaves part of
// what was sent before the probe unacknowledged, once the rest is
// acknowledged without a resend: on a path that delivers in order the
// responder sent it before it reached the probe, whatever its timing, and
// the wait from the last progress to it was a stall. QPs that share a path
// see this after every stall (the responder reads the backlog of all their
// windows in several batches, so each QP's first ACK covers only part of
// its window); without it each stall cost each QP a probe and a
// go-back-N. The wait to the first ACK, from the round-trip
// sample under way when the probe fired, is then a stall of the path; the
// probe timeout is at least 1.25 times the longest stall of the last
// peakHold (up to half the probe span, so that a lost tail is still
// probed), and a path that stalls now and then costs a spurious probe when
// a stall is longer than those before, not one per stall. A stall raises
// only this floor, never sRTT, which sizes the window after a loss. Taking
// a lost ACK for a stall would raise the floor by the probe's own wait, and
// each later lost ACK by a quarter more: on a lossy path the floor would
// climb to its cap and every lost ACK would idle the path for milliseconds.
// A probe that finds a loss (the responder takes the probed PSN while more
// was in flight) halves the floor: on a path that loses packets each
// probe's wait idles it, while a probe during a stall costs one packet.
//
// No probe is sent while a READ is outstanding. Its responses stream at the
// responder's pace, not one per round trip, so a gap between them says
// nothing of loss; and resending a READ request, or anything the probe's
// go-back-N reaches behind it, makes the responder stream the rest of the
// READ again (rxe replays a duplicate READ from its PSN). That costs the whole
// READ, not one packet, and the replay outlives the READ's completion: an
// application that deregisters or reuses the region once the READ completes
// turns the replay into a remote access error that moves the responder's
// QP to the error state, so the connection dies while nothing was lost.
// A response gap, a NAK or the local ACK timeout recovers a lost READ.
type sendWindow struct {
	cwnd     int32 // PSNs that may be outstanding; 0 means maxWindow
	ssthresh int32 // slow start ends here; 0 means maxWindow
	acked    int32 // PSNs acknowledged toward the next additive increase

	// One round-trip sample at a time, from a PSN sent once (Karn).
	sampling  bool
	sampleOld bool // the sample spans a probe: it only raises peak
	samplePSN ib.PSN
	sampleAt  time.Duration
	srtt      time.Duration // 0 until the first sample
	rttvar    time.Duration
	minRTT    time.Duration // the path without a queue
	peak      time.Duration // the longest recent stall a spurious probe measured
	peakAt    time.Duration // when peak was set or last aged

	probeArmed bool
	probeAt    time.Duration
	probes     uint8         // unanswered probes since the last progress
	since      time.Duration // when the probes' wait began

	// The window and requester position before a probe, restored if the
	// first ACK after it covers more than the probed PSN: the path was
	// slow, nothing was lost, and what was in flight need not be resent.
	undo                   bool
	undoPSN                ib.PSN
	undoCwnd, undoSsthresh int32
	undoReqPSN             ib.PSN
	undoIdx, undoOff       uint32

	// After an ACK that a probe's answer may be, a second ACK of the PSN
	// it acknowledged (dupPSN) shows that the original's ACK and the
	// probe's both came: the wait to the first (dupStall) was a stall of
	// the path. The watch ends with an ACK of a PSN first sent after the
	// probe (dupEnd or later), which the responder sends after the
	// probe's. dupCounted says the probe was counted spurious already.
	dupWatch   bool
	dupCounted bool
	dupPSN     ib.PSN
	dupEnd     ib.PSN
	dupStall   time.Duration
	// After a spurious probe whose first ACK left part of what was sent
	// before it unacknowledged, an ACK of all that (stallEnd) without a
	// resend in between shows the wait to the first ACK (stallWait) was
	// a stall.
	stallWatch bool
	stallEnd   ib.PSN
	stallWait  time.Duration
	probeMax   ib.PSN        // the requester's maxPSN when the last probe left
	probedAt   time.Duration // when the last probe left
	lost       bool          // a loss was seen, the last at lossAt
	lossAt     time.Duration
}

const (
	// maxWindow is rxe's requester bound: a PSN more than
	// RXE_MAX_UNACKED_PSNS past the first unacknowledged one waits.
	maxWindow = maxUnackedPSNs + 1
	// minWindow is the least a loss leaves: small enough to bound the
	// resend after it (two 64 KiB messages at MTU 4096), large enough that a
	// software path, whose round trip is mostly scheduling, is not left idle.
	minWindow = 32
	// minProbe is the shortest probe timeout, above the scheduling noise
	// of a software path.
	minProbe  = 200 * time.Microsecond
	maxProbes = 5
	// probeSpan bounds the probes' wait after the last progress; beyond
	// it the local ACK timeout alone acts, so a dead peer costs a few
	// packets in its first milliseconds and no timer wake-ups after.
	probeSpan = 8 * time.Millisecond
	// peakHold is how long the longest wait the path showed keeps the
	// probe timeout up before it halves.
	peakHold = time.Second
	// maxStallFloor bounds what stalls add to the probe timeout, so that a
	// lost tail on a path that stalls is still probed within the probe
	// span rather than left to the local ACK timeout.
	maxStallFloor = probeSpan / 2
)

// window returns the PSNs that may be outstanding.
func (w *sendWindow) window() int32 {
	if w.cwnd == 0 {
		return maxWindow
	}
	return w.cwnd
}

func (w *sendWindow) threshold() int32 {
	if w.ssthresh == 0 {
		return maxWindow
	}
	return w.ssthresh
}

// onSend notes a request packet at psn; fresh says it was never sent before.
func (w *sendWindow) onSend(now time.Duration, psn ib.PSN, fresh bool) {
	if fresh && !w.sampling {
		w.sampling, w.samplePSN, w.sampleAt, w.sampleOld = true, psn, now, false
	}
}

// onAck grows the window by n acknowledged PSNs, the first unacknowledged
// PSN now being psn, and takes a round-trip sample. It reports a probe
// found spurious, whose window it has restored.
func (w *sendWindow) onAck(now time.Duration, psn ib.PSN, n int32) (spurious bool) {
	w.probes = 0
	acked := psn.Add(ib.PSNMask)
	if w.stallWatch && ib.PSNDiff(psn, w.stallEnd) >= 0 {
		// Everything sent before the probe arrived without a resend,
		// and the first ACK after the probe came before it did: the
		// responder had not reached the probe, the wait was a stall.
		w.stallWatch = false
		w.notePeak(now, w.stallWait)
	}
	if w.dupWatch {
		if ib.PSNDiff(psn, w.dupEnd) > 0 {
			w.dupWatch = false // past the probe's answer
		} else {
			w.dupPSN = acked // the rest of a burst the stall held
		}
	}
	if w.undo {
		w.undo = false
		// Both a spurious probe (the first ACK after it covers more than
		// the probed PSN) and one that repaired a loss of a single PSN in
		// flight may be answered by this ACK: a second ACK of it tells.
		spans := w.sampling && w.sampleOld && ib.PSNDiff(psn, w.samplePSN) > 0
		if spans {
			w.dupWatch, w.dupPSN, w.dupEnd, w.dupStall = true, acked, w.probeMax, now-w.sampleAt
		}
		if ib.PSNDiff(psn, w.undoPSN) > 1 {
			w.cwnd, w.ssthresh, w.acked = w.undoCwnd, w.undoSsthresh, 0
			spurious = true
			// An ACK that leaves part of what was sent before the
			// probe unacknowledged left the responder before the
			// probe got there (the path delivers in order): if the
			// rest arrives without a resend, it was a stall.
			if ib.PSNDiff(w.probeMax, psn) > 0 {
				w.stallWatch, w.stallEnd, w.stallWait = true, w.probeMax, now-w.since
			}
			// On a path that lost nothing lately a lost ACK is
			// unlikely, and a responder that coalesces its ACKs (a
			// goroce one reading a backlog at once) gives no second
			// ACK: the timing of this one then tells a stall.
			if d := now - w.probedAt; spans && !w.lossRecent(now) && (d < w.minRTT || d > w.srtt+4*w.rttvar) {
				w.notePeak(now, w.dupStall)
			}
		} else {
			w.sampling = false // the go-back-N resends the sampled PSN
			if ib.PSNDiff(w.probeMax, w.undoPSN) > 1 {
				// The probe found a loss: the responder took the
				// probed PSN and held nothing after it.
				w.peak /= 2
				w.lost, w.lossAt = true, now
			}
		}
		w.dupCounted = spurious
	}
	if w.sampling && ib.PSNDiff(psn, w.samplePSN) > 0 {
		w.sampling = false
		if !w.sampleOld {
			w.rttSample(now - w.sampleAt)
		}
	}
	if spurious {
		return true
	}
	c := w.window()
	if c >= maxWindow {
		return false
	}
	if th := w.threshold(); c < th {
		c = min(c+n, th) // slow start
	} else if w.acked += n; w.acked >= c {
		w.acked -= c
		c++
	}
	w.set(c)
	return false
}

func (w *sendWindow) set(c int32) {
	if c >= maxWindow {
		w.cwnd, w.ssthresh, w.acked = 0, 0, 0
		return
	}
	w.cwnd = max(c, 1)
}

// onLoss narrows the window at the start of a go-back-N episode to what
// the path holds without a queue, window × minRTT/sRTT (half the window
// before the first round-trip sample), at least minWindow; a timeout or
// probe drops it to one PSN and slow start brings it back there. A loss
// during slow start lowers where slow start ends, never raises it.
func (w *sendWindow) onLoss(now time.Duration, timeout bool) {
	if !timeout {
		w.lost, w.lossAt = true, now
	}
	w.sampling = false
	w.undo = false
	w.dupWatch = false
	w.stallWatch = false
	c := w.window()
	next := c / 2
	if w.srtt > 0 && w.minRTT > 0 {
		next = int32(int64(c) * int64(w.minRTT) / int64(w.srtt))
	}
	next = min(max(next, minWindow), max(c, w.threshold()))
	w.acked = 0
	if timeout {
		w.set(1)
	} else {
		w.set(min(next, c))
	}
	if next < maxWindow {
		w.ssthresh = next
	}
}

func (w *sendWindow) rttSample(r time.Duration) {
	if r <= 0 {
		r = 1
	}
	if w.minRTT == 0 || r < w.minRTT {
		w.minRTT = r
	}
	if w.srtt == 0 {
		w.srtt, w.rttvar = r, r/2
		return
	}
	d := w.srtt - r
	if d < 0 {
		d = -d
	}
	w.rttvar += (d - w.rttvar) / 4
	w.srtt += (r - w.srtt) / 8
}

// onDupAck takes an ACK of psn that acknowledges nothing new: if it is the
// second ACK of the PSN the first ACK after a probe acknowledged, the wait
// for that first ACK was a stall. It reports a probe found spurious only
// now, one whose first ACK covered no more than the probed PSN.
func (w *sendWindow) onDupAck(now time.Duration, psn ib.PSN) (spurious bool) {
	if !w.dupWatch || psn != w.dupPSN {
		return false
	}
	w.dupWatch = false
	w.notePeak(now, w.dupStall)
	return !w.dupCounted
}

// lossRecent reports a loss within the last peakHold.
func (w *sendWindow) lossRecent(now time.Duration) bool {
	return w.lost && now-w.lossAt < peakHold
}

// notePeak records a stall of d measured at now.
func (w *sendWindow) notePeak(now, d time.Duration) {
	w.agePeak(now)
	if d >= w.peak {
		w.peak, w.peakAt = d, now
	}
}

// agePeak halves the peak for every peakHold without a longer stall.
func (w *sendWindow) agePeak(now time.Duration) {
	for w.peak > 0 && now-w.peakAt >= peakHold {
		w.peak /= 2
		w.peakAt += peakHold
	}
}

// probeTimeout is the wait for progress before a probe, or 0 for none.
func (w *sendWindow) probeTimeout(rto time.Duration) time.Duration {
	if w.srtt == 0 || rto == 0 || w.probes >= maxProbes {
		return 0
	}
	p := max(w.srtt+4*w.rttvar, min(w.peak+w.peak/4, maxStallFloor), minProbe) << w.probes
	if p >= rto/2 {
		return 0
	}
	return p
}

// armProbe (re)starts the probe timer while PSNs are outstanding.
func (q *QP) armProbe(now time.Duration) {
	c := &q.comp
	c.win.probeArmed = false
	if q.req.rnrWait || q.req.readsOut > 0 || ib.PSNDiff(q.req.maxPSN, c.psn) <= 0 {
		return
	}
	c.win.agePeak(now)
	p := c.win.probeTimeout(q.rto)
	if p == 0 {
		return
	}
	if c.win.probes == 0 {
		c.win.since = now
	}
	if now+p-c.win.since > probeSpan {
		// The last probe goes at the end of the span, so that a path
		// whose stalls raised the probe timeout near the span still gets
		// a second probe before the local ACK timeout.
		if c.win.probes == 0 || now-c.win.since >= probeSpan {
			return
		}
		p = c.win.since + probeSpan - now
	}
	c.win.probeArmed, c.win.probeAt = true, now+p
	q.watchTimers(c.win.probeAt)
}

// probe resends from the first unacknowledged PSN when nothing came back
// for a probe timeout. It starts a go-back-N episode with a window of one
// PSN, so a probe that finds the path merely slow costs one packet, and
// the window it had comes back with the ACK that shows so.
func (q *QP) probe(now time.Duration) {
	c := &q.comp
	c.win.probeArmed = false
	if q.typ != RC || (q.state != StateRTS && q.state != StateSQD) || q.req.rnrWait || q.req.readsOut > 0 {
		return
	}
	if ib.PSNDiff(q.req.maxPSN, c.psn) <= 0 || q.sqHead == q.sqTail {
		return
	}
	q.e.stats.Probes++
	// Only the first probe of an episode, taken while no go-back-N is
	// pending, records what to restore.
	w := &c.win
	if !w.undo && w.probes == 0 && !q.req.needRetry {
		w.undoCwnd, w.undoSsthresh = w.cwnd, w.ssthresh
		w.undoReqPSN, w.undoIdx, w.undoOff = q.req.psn, q.req.idx, q.req.off
		w.undo = true
	}
	undo, sampling := w.undo, w.sampling
	w.probeMax, w.probedAt = q.req.maxPSN, now
	w.onLoss(now, true)
	w.undo, w.undoPSN = undo, c.psn
	if undo && sampling {
		// Kept if the probe proves spurious (onAck).
		w.sampling, w.sampleOld = true, true
	}
	c.win.probes++
	q.req.needRetry = true
	c.startedRetry = true
	c.retryFrom = c.psn
	q.armProbe(now)
	q.e.schedule(q)
}

// resumeAfterProbe puts the requester back where it was before a probe the
// responder answered with an ACK past the probed PSN: nothing after it was
// lost, so nothing after it is resent.
func (q *QP) resumeAfterProbe() {
	w := &q.comp.win
	if ib.PSNDiff(w.undoReqPSN, q.comp.psn) < 0 || ib.PSNDiff(w.undoReqPSN, q.req.maxPSN) > 0 {
		return // acknowledged past it already: syncReq moves the requester
	}
	q.req.psn, q.req.idx, q.req.off = w.undoReqPSN, w.undoIdx, w.undoOff
	q.req.needRetry = false
	q.comp.startedRetry = false
}
