package qp

import (
	"encoding/binary"
	"time"

	"github.com/goroce/goroce/ib"
)

// completer processes ACKs, NAKs, read responses and atomic ACKs at the
// requester side (rxe_comp.c).
type completer struct {
	psn          ib.PSN // first unacknowledged PSN
	retryCnt     uint8
	rnrRetry     uint8
	startedRetry bool
	retryFrom    ib.PSN // comp.psn when the current retry started
	armed        bool   // retransmit timer
	lateOnce     bool   // the timer fired late and was given a grace (advance)
	deadline     time.Duration
	win          sendWindow // congestion window and probe timer (cc.go)
}

// complete handles one response packet on an RC QP.
func (q *QP) complete(p *ib.Packet, now time.Duration) error {
	if q.state != StateRTS && q.state != StateSQD {
		return ErrNotReady
	}
	psn := p.BTH.PSN()
	low := uint8(p.BTH.Opcode()) & 0x1F
	before := q.comp.psn
	// A response can only refer to something already sent.
	if ib.PSNDiff(psn, q.req.maxPSN) >= 0 {
		return ErrDropped
	}
	if low == opAck && ib.PSNDiff(psn, before) < 0 && len(p.AETH) >= ib.AETHSize &&
		p.AETH.Syndrome().Type() == ib.SyndromeACK && q.comp.win.onDupAck(now, psn) {
		q.e.stats.SpuriousProbes++
		return ErrDropped // acknowledged already
	}
	progress, lost := false, false
	// Responses past the oldest WQE acknowledge it (SEND/WRITE) or show that its
	// response was lost (READ/atomic).
	for q.sqHead != q.sqTail {
		w := q.wqe(q.sqHead)
		if !w.started || ib.PSNDiff(psn, w.lastPSN) <= 0 {
			break
		}
		if isRdAtomicWR(w.op) {
			lost = true
			break
		}
		if ib.PSNDiff(w.lastPSN.Next(), q.comp.psn) > 0 {
			q.comp.psn = w.lastPSN.Next()
		}
		q.completeHead(WCSuccess)
		progress = true
	}
	var err error
	if !lost {
		err = q.completeOne(p, now, psn, low, &progress)
	}
	if q.state != StateRTS && q.state != StateSQD {
		return err
	}
	if d := ib.PSNDiff(q.comp.psn, before); d > 0 {
		if q.comp.win.onAck(now, q.comp.psn, d) {
			q.e.stats.SpuriousProbes++
			q.resumeAfterProbe()
		}
		q.armProbe(now)
	}
	if progress {
		q.comp.retryCnt = q.attr.RetryCnt
		q.comp.rnrRetry = q.attr.RNRRetry
		q.comp.startedRetry = false
		q.syncReq()
		if ib.PSNDiff(q.req.maxPSN, q.comp.psn) > 0 && q.rto > 0 && !q.req.rnrWait {
			q.armRTO(now)
		} else if q.sqHead == q.sqTail || ib.PSNDiff(q.req.maxPSN, q.comp.psn) <= 0 {
			q.comp.armed = false
		}
		q.e.schedule(q)
	}
	if lost {
		q.retry(now, false)
	}
	return err
}

// completeOne matches one response with the oldest WQE, in the stages of
// rxe's completer (rxe_comp.c): check_psn here, then check_ack by response
// kind, each of which carries out its read, atomic or write_send step.
func (q *QP) completeOne(p *ib.Packet, now time.Duration, psn ib.PSN, low uint8, progress *bool) error {
	if q.sqHead == q.sqTail {
		return ErrDropped
	}
	w := q.wqe(q.sqHead)
	if !w.started {
		return ErrDropped
	}
	d := ib.PSNDiff(psn, q.comp.psn)
	if d < 0 {
		return ErrDropped // already known
	}
	switch low {
	case opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
		if isEmptyReadRespWR(w.op) {
			return q.completeEmptyReadResp(p, psn, d, low, progress)
		}
		return q.completeReadResp(p, now, w, psn, d, low, progress)
	case opAtomicAck:
		return q.completeAtomicAck(p, w, psn, d, progress)
	case opAck:
		return q.completeAck(p, now, w, psn, d, progress)
	}
	return ErrDropped
}

// completeEmptyReadResp handles the empty READ_RESPONSE_ONLY that answers
// ATOMIC_WRITE and FLUSH.
func (q *QP) completeEmptyReadResp(p *ib.Packet, psn ib.PSN, d int32, low uint8, progress *bool) error {
	if d != 0 || low != opReadRespOnly || len(p.AETH) < ib.AETHSize || len(p.Payload) != 0 {
		return ErrDropped
	}
	if syn := p.AETH.Syndrome(); syn.Type() != ib.SyndromeACK {
		q.completeHead(nakStatus(syn))
		return nil
	}
	q.comp.psn = psn.Next()
	*progress = true
	q.completeHead(WCSuccess)
	return nil
}

// completeReadResp places one READ response packet and completes the READ
// with its last one.
func (q *QP) completeReadResp(p *ib.Packet, now time.Duration, w *sendWQE, psn ib.PSN, d int32, low uint8, progress *bool) error {
	if w.op != WRRDMARead {
		q.completeHead(WCBadRespErr)
		return ErrDropped
	}
	if d > 0 {
		// A response packet is missing: go back and re-request from it.
		q.retry(now, false)
		return ErrDropped
	}
	k := uint32(ib.PSNDiff(psn, w.firstPSN))
	npk := uint32(ib.PSNDiff(w.lastPSN, w.firstPSN)) + 1
	if !readRespFits(low, k, npk) {
		return ErrDropped
	}
	if low != opReadRespMiddle {
		if len(p.AETH) < ib.AETHSize {
			return ErrBadHeader
		}
		if syn := p.AETH.Syndrome(); syn.Type() != ib.SyndromeACK {
			q.completeHead(nakStatus(syn))
			return nil
		}
	}
	off := k * uint32(q.mtu)
	if off > w.length {
		return ErrDropped
	}
	if uint32(len(p.Payload)) != minU32(w.length-off, uint32(q.mtu)) {
		return ErrDropped
	}
	if len(p.Payload) > 0 {
		if st := q.e.copySGL(q.pd, w.sge, uint64(off), p.Payload, true); st != WCSuccess {
			q.completeHead(st)
			return nil
		}
	}
	q.comp.psn = psn.Next()
	*progress = true
	if k == npk-1 {
		q.completeHead(WCSuccess)
	}
	return nil
}

// readRespFits reports whether a READ response opcode fits packet k of npk.
// rxe continues a re-requested READ with MIDDLE/LAST; a responder that
// treats the retried request as new starts with FIRST/ONLY at the retry
// PSN. Both are accepted; the position must fit either way.
func readRespFits(low uint8, k, npk uint32) bool {
	switch {
	case npk == 1:
		return low == opReadRespOnly
	case k == 0:
		return low == opReadRespFirst
	case k == npk-1:
		return low == opReadRespLast || low == opReadRespOnly
	}
	return low == opReadRespMiddle || low == opReadRespFirst
}

// completeAtomicAck stores the original value an atomic ACK returns and
// completes the atomic.
func (q *QP) completeAtomicAck(p *ib.Packet, w *sendWQE, psn ib.PSN, d int32, progress *bool) error {
	if !isAtomicWR(w.op) {
		q.completeHead(WCBadRespErr)
		return ErrDropped
	}
	if d != 0 || len(p.AETH) < ib.AETHSize || len(p.AtomicAckETH) < ib.AtomicAckETHSize {
		return ErrDropped
	}
	if syn := p.AETH.Syndrome(); syn.Type() != ib.SyndromeACK {
		q.completeHead(nakStatus(syn))
		return nil
	}
	var v [8]byte
	binary.NativeEndian.PutUint64(v[:], p.AtomicAckETH.Orig())
	if st := q.e.copySGL(q.pd, w.sge, 0, v[:], true); st != WCSuccess {
		q.completeHead(st)
		return nil
	}
	q.comp.psn = psn.Next()
	*progress = true
	q.completeHead(WCSuccess)
	return nil
}

// completeAck handles an ACK, RNR NAK or NAK for the oldest WQE.
func (q *QP) completeAck(p *ib.Packet, now time.Duration, w *sendWQE, psn ib.PSN, d int32, progress *bool) error {
	if len(p.AETH) < ib.AETHSize {
		return ErrBadHeader
	}
	syn := p.AETH.Syndrome()
	switch syn.Type() {
	case ib.SyndromeACK:
		// A READ or atomic is acknowledged only by its own response.
		if isRdAtomicWR(w.op) {
			return ErrDropped
		}
		q.comp.psn = psn.Next()
		*progress = true
		if psn == w.lastPSN {
			q.completeHead(WCSuccess)
		}
		return nil
	case ib.SyndromeRNRNAK:
		return q.rnrNAK(now, psn, syn)
	case ib.SyndromeNAK:
		if syn.NAKCode() != ib.NAKPSNSequenceError {
			q.completeHead(nakStatus(syn))
			return nil
		}
		q.e.stats.SeqNAKsRcvd++
		if q.req.rnrWait {
			return ErrDropped
		}
		if d > 0 {
			q.comp.psn = psn
		}
		q.retry(now, false)
		return nil
	}
	return ErrDropped
}

// rnrNAK waits out the RNR timer before resending from psn, or fails the
// WQE once the RNR retries are spent (rxe rnr_retry).
func (q *QP) rnrNAK(now time.Duration, psn ib.PSN, syn ib.Syndrome) error {
	q.e.stats.RNRNAKsRcvd++
	if q.req.rnrWait {
		return ErrDropped
	}
	if q.comp.rnrRetry == 0 {
		q.completeHead(WCRNRRetryExcErr)
		return nil
	}
	if q.comp.rnrRetry != 7 {
		q.comp.rnrRetry--
	}
	q.comp.psn = psn
	q.req.needRetry = true
	q.req.rnrWait = true
	q.req.rnrUntil = now + syn.RNRTimer().Duration()
	q.watchTimers(q.req.rnrUntil)
	q.comp.armed = false
	q.comp.win.probeArmed = false
	return nil
}

// nakStatus maps a NAK syndrome to the requester's completion status.
func nakStatus(syn ib.Syndrome) WCStatus {
	if syn.Type() != ib.SyndromeNAK {
		return WCBadRespErr
	}
	switch syn.NAKCode() {
	case ib.NAKInvalidRequest:
		return WCRemInvReqErr
	case ib.NAKRemoteAccessError:
		return WCRemAccessErr
	default:
		return WCRemOpErr
	}
}

// completeHead completes the oldest send WQE; an error status moves the QP to
// the error state.
func (q *QP) completeHead(st WCStatus) {
	w := q.wqe(q.sqHead)
	q.postSendWC(w, st)
	q.sqHead++
	if st != WCSuccess {
		q.toError()
		return
	}
	q.completeLocal()
}

// retry starts a go-back-N retransmission from the first unacknowledged
// PSN, once per gap unless the timer fired. A NAK past the PSN the current
// go-back-N started from is a new gap, a loss among the resent packets, and
// starts another at once; rxe's completer ignores it until a WQE completes
// and leaves the gap to its retransmit timer.
func (q *QP) retry(now time.Duration, timer bool) {
	if q.comp.startedRetry && !timer && ib.PSNDiff(q.comp.psn, q.comp.retryFrom) <= 0 {
		// Already retrying from this point; a second NAK for the same gap changes nothing.
		return
	}
	if ib.PSNDiff(q.req.maxPSN, q.comp.psn) <= 0 && !timer {
		return
	}
	if q.comp.retryCnt == 0 {
		if q.sqHead != q.sqTail {
			q.completeHead(WCRetryExcErr)
		}
		return
	}
	if q.comp.retryCnt != 7 {
		q.comp.retryCnt--
	}
	q.req.needRetry = true
	q.comp.startedRetry = true
	q.comp.retryFrom = q.comp.psn
	q.comp.win.onLoss(now, timer)
	if q.rto > 0 {
		q.armRTO(now)
	}
	q.armProbe(now)
	q.e.schedule(q)
}

// timeout handles the retransmit timer.
func (q *QP) timeout(now time.Duration) {
	if q.typ != RC || (q.state != StateRTS && q.state != StateSQD) || q.req.rnrWait {
		return
	}
	if ib.PSNDiff(q.req.maxPSN, q.comp.psn) <= 0 || q.sqHead == q.sqTail {
		return
	}
	q.e.stats.Timeouts++
	q.retry(now, true)
}

// syncReq moves the requester forward when acknowledgements overtook it
// (after a rewind, an ACK may cover packets the requester is about to resend).
func (q *QP) syncReq() {
	behind := int32(q.req.idx-q.sqHead) < 0 ||
		(q.req.idx == q.sqHead && ib.PSNDiff(q.req.psn, q.comp.psn) < 0)
	if !behind {
		return
	}
	q.req.idx = q.sqHead
	q.req.psn = q.comp.psn
	q.req.off = 0
	if q.sqHead != q.sqTail {
		w := q.wqe(q.sqHead)
		if w.started && !isAtomicWR(w.op) {
			if d := ib.PSNDiff(q.comp.psn, w.firstPSN); d > 0 {
				off := uint64(d) * uint64(q.mtu)
				if off < uint64(w.length) {
					q.req.off = uint32(off)
				}
			}
		}
	}
}
