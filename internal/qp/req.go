package qp

import (
	"time"

	"github.com/goroce/goroce/ib"
)

// requester is the sending half of a QP (rxe_req.c).
type requester struct {
	psn           ib.PSN // next PSN to send
	maxPSN        ib.PSN // one past the highest PSN ever sent
	idx           uint32 // send WQE being sent
	off           uint32 // bytes of it already covered
	noack         int    // packets since the last AckReq
	needRetry     bool   // go back to the completer's position before sending
	rnrWait       bool
	rnrUntil      time.Duration
	rdOutstanding int
	readsOut      int // READs among them: no probe while one is (cc.go)
}

// request builds the next request packet into buf.
func (q *QP) request(now time.Duration, buf []byte, t *TxPacket) (int, bool) {
	for {
		if q.req.rnrWait || (q.state != StateRTS && q.state != StateSQD) {
			return 0, false
		}
		if q.req.needRetry {
			q.rewind()
		}
		if q.req.idx == q.sqTail {
			return 0, false
		}
		w := q.wqe(q.req.idx)
		// In SQD the requester finishes (and if need be resends) the messages
		// it had started, and starts no new one.
		if q.state == StateSQD && !w.started {
			return 0, false
		}
		if isLocalWR(w.op) {
			// A bind or invalidation executes when the requester reaches
			// it, so it takes effect after every earlier WQE was sent and
			// before any later one; after a go-back-N it is not repeated.
			if w.started {
				q.req.idx++
				continue
			}
			if w.flags&SendFence != 0 && q.sqHead != q.req.idx {
				return 0, false
			}
			q.executeLocal(w)
			if q.state != StateRTS {
				return 0, false
			}
			continue
		}
		switch q.typ {
		case UD:
			n, ok, again := q.requestUD(w, buf, t)
			if again {
				continue
			}
			return n, ok
		case RC:
			if q.req.off == 0 {
				if w.flags&SendFence != 0 && q.sqHead != q.req.idx {
					return 0, false
				}
				if isRdAtomicWR(w.op) && !w.rdCounted {
					if q.req.rdOutstanding >= roundUpPow2(int(q.attr.MaxRdAtomic)) || q.attr.MaxRdAtomic == 0 {
						return 0, false
					}
					w.rdCounted = true
					q.req.rdOutstanding++
					if w.op == WRRDMARead {
						q.req.readsOut++
					}
				}
			}
			if ib.PSNDiff(q.req.psn, q.comp.psn) >= q.comp.win.window() {
				return 0, false
			}
		}
		if q.ccApplies() && !q.paceOK(now) {
			return 0, false
		}
		n, ok := q.requestRCUC(now, w, buf, t)
		if ok && q.ccApplies() {
			q.paceCharge(now, n)
		}
		if !ok && q.state == StateRTS {
			continue // the WQE failed locally and was completed; try the next
		}
		return n, ok
	}
}

// reqPkt is the request packet being built: its opcode without the
// transport bits, the header bytes written so far, the payload length,
// whether it ends the WQE, the solicited-event bit and the PSN after it.
type reqPkt struct {
	op      uint8
	h       int
	paylen  int
	last    bool
	se      bool
	nextPSN ib.PSN
}

// requestRCUC builds one RC or UC request packet of w in the stages of rxe's
// requester (rxe_req.c): assign the WQE's PSNs when it starts, choose the
// opcode and write its extension headers (next_opcode, init_req_packet),
// copy the payload (finish_packet), then advance the WQE and requester
// state (update_wqe_state, update_state).
func (q *QP) requestRCUC(now time.Duration, w *sendWQE, buf []byte, t *TxPacket) (int, bool) {
	if q.req.off == 0 {
		q.startWQE(w)
	}
	off := q.req.off
	k := reqPkt{h: ib.BTHSize, nextPSN: q.req.psn.Next()}
	q.initRequest(w, buf, off, &k)
	if k.paylen > 0 && !q.copyRequestPayload(w, buf[k.h:k.h+k.paylen], off) {
		return 0, false
	}
	base := uint8(transportRC)
	if q.typ == UC {
		base = transportUC
	}
	pc := pad(k.paylen)
	writeBTH(buf, base|k.op, k.se, q.ackReq(k.last, k.nextPSN), pc, q.attr.DestQPN, q.req.psn)
	n := finish(buf, k.h+k.paylen, pc)
	q.updateRequester(now, w, off, &k)
	q.fillAV(t, &q.attr.AV)
	return n, true
}

// startWQE assigns the PSNs of a WQE about to send its first packet.
func (q *QP) startWQE(w *sendWQE) {
	mtu := uint32(q.mtu)
	npk := uint32(1)
	if !isAtomicWR(w.op) && w.length > mtu {
		npk = (w.length + mtu - 1) / mtu
	}
	w.firstPSN = q.req.psn
	w.lastPSN = q.req.psn.Add(npk - 1)
	w.started = true
}

// msgOp picks the opcode for a packet's position in its message.
func msgOp(first, last bool, only, firstOp, middle, lastOp uint8) uint8 {
	switch {
	case first && last:
		return only
	case first:
		return firstOp
	case last:
		return lastOp
	}
	return middle
}

// initRequest chooses the opcode of the packet at offset off of w and
// writes its extension headers after the BTH.
func (q *QP) initRequest(w *sendWQE, buf []byte, off uint32, k *reqPkt) {
	mtu := uint32(q.mtu)
	remaining := w.length - off
	first := off == 0
	k.last = remaining <= mtu
	switch w.op {
	case WRSend, WRSendWithImm, WRSendWithInv:
		k.paylen = int(minU32(remaining, mtu))
		k.op = msgOp(first, k.last, opSendOnly, opSendFirst, opSendMiddle, opSendLast)
		if !k.last {
			return
		}
		k.se = w.flags&SendSolicited != 0
		if w.op == WRSendWithImm {
			k.op++ // LAST→LAST_IMM, ONLY→ONLY_IMM
			k.putImm(buf, w.imm)
		} else if w.op == WRSendWithInv {
			if k.op == opSendOnly {
				k.op = opSendOnlyInv
			} else {
				k.op = opSendLastInv
			}
			ib.IETH(buf[k.h : k.h+ib.IETHSize]).Encode(&ib.IETHFields{RKey: w.invRKey})
			k.h += ib.IETHSize
		}
	case WRRDMAWrite, WRRDMAWriteWithImm:
		k.paylen = int(minU32(remaining, mtu))
		k.op = msgOp(first, k.last, opWriteOnly, opWriteFirst, opWriteMiddle, opWriteLast)
		if first {
			k.putRETH(buf, w.remoteAddr, w.rkey, w.length)
		}
		if k.last && w.op == WRRDMAWriteWithImm {
			k.op++ // LAST→LAST_IMM, ONLY→ONLY_IMM
			k.se = w.flags&SendSolicited != 0
			k.putImm(buf, w.imm)
		}
	case WRRDMARead:
		// One request for the rest of the READ; it uses a PSN per response packet.
		k.op = opReadRequest
		k.putRETH(buf, w.remoteAddr+uint64(off), w.rkey, remaining)
		npk := uint32(1)
		if remaining > mtu {
			npk = (remaining + mtu - 1) / mtu
		}
		k.nextPSN = q.req.psn.Add(npk)
		k.last = true
	case WRFlush:
		k.op = opFlush
		ib.FETH(buf[k.h : k.h+ib.FETHSize]).Encode(&ib.FETHFields{Placement: uint8(w.swap) & 0xF, Selectivity: uint8(w.swap>>4) & 3})
		k.h += ib.FETHSize
		k.putRETH(buf, w.remoteAddr, w.rkey, uint32(w.compareAdd))
		k.last = true
	case WRAtomicWrite:
		k.op = opAtomicWrite
		k.putRETH(buf, w.remoteAddr, w.rkey, 8)
		k.paylen = 8
		k.last = true
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		f := ib.AtomicETHFields{VA: w.remoteAddr, RKey: w.rkey}
		if w.op == WRAtomicCmpAndSwp {
			k.op = opCompareSwap
			f.SwapAdd, f.Compare = w.swap, w.compareAdd
		} else {
			k.op = opFetchAdd
			f.SwapAdd = w.compareAdd
		}
		ib.AtomicETH(buf[k.h : k.h+ib.AtomicETHSize]).Encode(&f)
		k.h += ib.AtomicETHSize
		k.last = true
	}
}

func (k *reqPkt) putRETH(buf []byte, va uint64, rkey, n uint32) {
	ib.RETH(buf[k.h : k.h+ib.RETHSize]).Encode(&ib.RETHFields{VA: va, RKey: rkey, DMALen: n})
	k.h += ib.RETHSize
}

func (k *reqPkt) putImm(buf []byte, imm uint32) {
	ib.ImmDt(buf[k.h : k.h+ib.ImmDtSize]).Encode(&ib.ImmDtFields{Imm: imm})
	k.h += ib.ImmDtSize
}

// copyRequestPayload fills dst with w's data from offset off. A local
// memory error completes the WQE with that error instead.
func (q *QP) copyRequestPayload(w *sendWQE, dst []byte, off uint32) bool {
	if w.flags&SendInline != 0 {
		copy(dst, w.inline[off:])
		return true
	}
	if st := q.e.copySGL(q.pd, w.sge, uint64(off), dst, false); st != WCSuccess {
		q.failWQE(st)
		return false
	}
	return true
}

// ackReq decides the AckReq bit of an RC packet that ends before next. rxe
// sets it on the last packet of a message and on a packet that finds more
// than RXE_MAX_PKT_PER_ACK earlier ones without it. A window narrowed by
// loss (cc.go) also asks for it on the packet that fills the window and
// twice per window, so that ACKs keep opening it.
func (q *QP) ackReq(last bool, next ib.PSN) bool {
	if q.typ != RC {
		return false
	}
	every := int32(maxPktPerAck + 1)
	if w := q.comp.win.window(); w < maxWindow {
		every = min(every, w/2)
		last = last || ib.PSNDiff(next, q.comp.psn) >= w
	}
	if last {
		q.req.noack = 0
		return true
	}
	if q.req.noack++; int32(q.req.noack) > every {
		q.req.noack = 0
		return true
	}
	return false
}

// updateRequester moves past the packet just built: the next PSN, the next
// WQE at the end of one (a UC WQE completes once sent), and the retransmit
// timer.
func (q *QP) updateRequester(now time.Duration, w *sendWQE, off uint32, k *reqPkt) {
	fresh := ib.PSNDiff(k.nextPSN, q.req.maxPSN) > 0
	if q.typ == RC {
		q.comp.win.onSend(now, q.req.psn, fresh && ib.PSNDiff(q.req.psn, q.req.maxPSN) >= 0)
	}
	q.req.psn = k.nextPSN
	if fresh {
		q.req.maxPSN = k.nextPSN
	}
	if k.last {
		q.req.idx++
		q.req.off = 0
		if q.typ == UC {
			q.postSendWC(w, WCSuccess)
			q.sqHead++
		}
	} else {
		q.req.off = off + uint32(k.paylen)
	}
	if q.typ == RC && !q.comp.armed && q.rto > 0 {
		q.armRTO(now)
	}
	if q.typ == RC && !q.comp.win.probeArmed {
		q.armProbe(now)
	}
}

// requestUD builds the packet of a UD send. again reports that the WQE was
// completed without a packet and the caller should look at the next one.
func (q *QP) requestUD(w *sendWQE, buf []byte, t *TxPacket) (n int, ok, again bool) {
	if int(w.length) > q.e.portMTU.Bytes() {
		// rxe (IBTA C10-93.1.1): an oversized UD send is silently dropped and
		// completes successfully.
		q.postSendWC(w, WCSuccess)
		q.sqHead++
		q.req.idx++
		return 0, false, true
	}
	op := uint8(transportUD | opSendOnly)
	h := ib.BTHSize
	qkey := w.qkey
	if q.gsi {
		qkey = GSIQKey // rxe: QP1 always sends the GSI Q_Key
	}
	ib.DETH(buf[h : h+ib.DETHSize]).Encode(&ib.DETHFields{QKey: qkey, SrcQP: q.qpn})
	h += ib.DETHSize
	if w.op == WRSendWithImm {
		op = transportUD | opSendOnlyImm
		ib.ImmDt(buf[h : h+ib.ImmDtSize]).Encode(&ib.ImmDtFields{Imm: w.imm})
		h += ib.ImmDtSize
	}
	paylen := int(w.length)
	dst := buf[h : h+paylen]
	if w.flags&SendInline != 0 {
		copy(dst, w.inline)
	} else if st := q.e.copySGL(q.pd, w.sge, 0, dst, false); st != WCSuccess {
		q.failWQE(st)
		return 0, false, q.state == StateRTS
	}
	pc := pad(paylen)
	writeBTH(buf, op, w.flags&SendSolicited != 0, false, pc, w.remoteQPN, q.req.psn)
	n = finish(buf, h+paylen, pc)
	q.req.psn = q.req.psn.Next()
	q.req.idx++
	q.postSendWC(w, WCSuccess)
	q.sqHead++
	q.fillAV(t, &w.av)
	return n, true, false
}

// failWQE reports a local error of the WQE at the requester position and
// moves the QP to the error state. Completions stay in order: older WQEs still
// waiting for their ACK are flushed first, then the failing one is reported,
// then the rest are flushed by the error transition.
func (q *QP) failWQE(st WCStatus) {
	for q.sqHead != q.req.idx {
		q.postSendWC(q.wqe(q.sqHead), WCWRFlushErr)
		q.sqHead++
	}
	q.postSendWC(q.wqe(q.req.idx), st)
	q.sqHead++
	q.req.idx++
	q.toError()
}

// rewind moves the requester back to the first unacknowledged PSN (go-back-N).
// A partially acknowledged message resumes at the packet after the last
// acknowledged one, with its original opcode; a partially answered READ is
// re-requested for the remaining bytes.
func (q *QP) rewind() {
	q.req.needRetry = false
	q.req.idx = q.sqHead
	q.req.psn = q.comp.psn
	q.req.off = 0
	q.req.noack = 0
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
	q.e.stats.Retransmits++
}

func minU32(a, b uint32) uint32 {
	if a < b {
		return a
	}
	return b
}
