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
				}
			}
			if ib.PSNDiff(q.req.psn, q.comp.psn) > maxUnackedPSNs {
				return 0, false
			}
		}
		n, ok := q.requestRCUC(now, w, buf, t)
		if !ok && q.state == StateRTS {
			continue // the WQE failed locally and was completed; try the next
		}
		return n, ok
	}
}

// requestRCUC builds one RC or UC request packet of w.
func (q *QP) requestRCUC(now time.Duration, w *sendWQE, buf []byte, t *TxPacket) (int, bool) {
	mtu := uint32(q.mtu)
	base := uint8(transportRC)
	if q.typ == UC {
		base = transportUC
	}
	if q.req.off == 0 {
		npk := uint32(1)
		if !isAtomicWR(w.op) && w.length > mtu {
			npk = (w.length + mtu - 1) / mtu
		}
		w.firstPSN = q.req.psn
		w.lastPSN = q.req.psn.Add(npk - 1)
		w.started = true
	}
	off := q.req.off
	remaining := w.length - off
	first := off == 0
	last := remaining <= mtu
	psn := q.req.psn
	h := ib.BTHSize
	var op uint8
	paylen := 0
	nextPSN := psn.Next()
	se := false
	switch w.op {
	case WRSend, WRSendWithImm, WRSendWithInv:
		paylen = int(minU32(remaining, mtu))
		switch {
		case first && last:
			op = opSendOnly
		case first:
			op = opSendFirst
		case last:
			op = opSendLast
		default:
			op = opSendMiddle
		}
		if last {
			se = w.flags&SendSolicited != 0
			if w.op == WRSendWithImm {
				op++ // LAST→LAST_IMM, ONLY→ONLY_IMM
				ib.ImmDt(buf[h : h+ib.ImmDtSize]).Encode(&ib.ImmDtFields{Imm: w.imm})
				h += ib.ImmDtSize
			} else if w.op == WRSendWithInv {
				if op == opSendOnly {
					op = opSendOnlyInv
				} else {
					op = opSendLastInv
				}
				ib.IETH(buf[h : h+ib.IETHSize]).Encode(&ib.IETHFields{RKey: w.invRKey})
				h += ib.IETHSize
			}
		}
	case WRRDMAWrite, WRRDMAWriteWithImm:
		paylen = int(minU32(remaining, mtu))
		switch {
		case first && last:
			op = opWriteOnly
		case first:
			op = opWriteFirst
		case last:
			op = opWriteLast
		default:
			op = opWriteMiddle
		}
		if first {
			ib.RETH(buf[h : h+ib.RETHSize]).Encode(&ib.RETHFields{VA: w.remoteAddr, RKey: w.rkey, DMALen: w.length})
			h += ib.RETHSize
		}
		if last && w.op == WRRDMAWriteWithImm {
			op++ // LAST→LAST_IMM, ONLY→ONLY_IMM
			se = w.flags&SendSolicited != 0
			ib.ImmDt(buf[h : h+ib.ImmDtSize]).Encode(&ib.ImmDtFields{Imm: w.imm})
			h += ib.ImmDtSize
		}
	case WRRDMARead:
		op = opReadRequest
		ib.RETH(buf[h : h+ib.RETHSize]).Encode(&ib.RETHFields{VA: w.remoteAddr + uint64(off), RKey: w.rkey, DMALen: remaining})
		h += ib.RETHSize
		npk := uint32(1)
		if remaining > mtu {
			npk = (remaining + mtu - 1) / mtu
		}
		nextPSN = psn.Add(npk)
		last = true
		remaining = 0
	case WRFlush:
		op = opFlush
		ib.FETH(buf[h : h+ib.FETHSize]).Encode(&ib.FETHFields{Placement: uint8(w.swap) & 0xF, Selectivity: uint8(w.swap>>4) & 3})
		h += ib.FETHSize
		ib.RETH(buf[h : h+ib.RETHSize]).Encode(&ib.RETHFields{VA: w.remoteAddr, RKey: w.rkey, DMALen: uint32(w.compareAdd)})
		h += ib.RETHSize
		last = true
		remaining = 0
	case WRAtomicWrite:
		op = opAtomicWrite
		ib.RETH(buf[h : h+ib.RETHSize]).Encode(&ib.RETHFields{VA: w.remoteAddr, RKey: w.rkey, DMALen: 8})
		h += ib.RETHSize
		paylen = 8
		last = true
		remaining = 0
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		f := ib.AtomicETHFields{VA: w.remoteAddr, RKey: w.rkey}
		if w.op == WRAtomicCmpAndSwp {
			op = opCompareSwap
			f.SwapAdd, f.Compare = w.swap, w.compareAdd
		} else {
			op = opFetchAdd
			f.SwapAdd = w.compareAdd
		}
		ib.AtomicETH(buf[h : h+ib.AtomicETHSize]).Encode(&f)
		h += ib.AtomicETHSize
		last = true
		remaining = 0
	}
	if paylen > 0 {
		dst := buf[h : h+paylen]
		if w.flags&SendInline != 0 {
			copy(dst, w.inline[off:])
		} else if st := q.e.copySGL(q.pd, w.sge, uint64(off), dst, false); st != WCSuccess {
			q.failWQE(st)
			return 0, false
		}
	}
	ackReq := false
	if q.typ == RC {
		// rxe: AckReq on the last packet of a message, and on a packet that
		// finds more than RXE_MAX_PKT_PER_ACK earlier ones without it.
		if last {
			ackReq = true
			q.req.noack = 0
		} else if q.req.noack++; q.req.noack > maxPktPerAck+1 {
			ackReq = true
			q.req.noack = 0
		}
	}
	pc := pad(paylen)
	writeBTH(buf, base|op, se, ackReq, pc, q.attr.DestQPN, psn)
	n := finish(buf, h+paylen, pc)

	q.req.psn = nextPSN
	if ib.PSNDiff(nextPSN, q.req.maxPSN) > 0 {
		q.req.maxPSN = nextPSN
	}
	if last {
		q.req.idx++
		q.req.off = 0
		if q.typ == UC {
			// Unreliable: done once sent.
			q.postSendWC(w, WCSuccess)
			q.sqHead++
		}
	} else {
		q.req.off = off + uint32(paylen)
	}
	if q.typ == RC && !q.comp.armed && q.rto > 0 {
		q.armRTO(now)
	}
	q.fillAV(t, &q.attr.AV)
	return n, true
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
