package qp

import (
	"encoding/binary"
	"unsafe"

	"github.com/goroce/goroce/ib"
)

const (
	resNone = iota
	resRead
	resAtomic
	resAtomicWrite
	resFlush
)

// respRes is a saved READ or atomic, kept for duplicate replay (rxe resp_res).
type respRes struct {
	kind     uint8
	queued   bool // a response entry for it is in the output ring
	newState bool // the next response packet starts a (re)started response: FIRST/ONLY
	firstPSN ib.PSN
	lastPSN  ib.PSN
	curPSN   ib.PSN
	origVA   uint64 // the range the original request covered
	origLen  uint32
	va       uint64 // next byte to send
	resid    uint32
	rkey     uint32
	orig     uint64 // atomic: the value before the operation
	msn      uint32
	gen      uint32 // bumped when the slot is reused, so stale output entries are recognised
}

const (
	outAck = iota
	outRead
	outAtomic
	outAtomicWrite
)

// outEntry is one pending response, in PSN order.
type outEntry struct {
	kind uint8
	syn  ib.Syndrome
	psn  ib.PSN
	msn  uint32
	res  int32
	gen  uint32 // generation of the resource slot when queued
}

const (
	msgNone = iota
	msgSend
	msgWrite
)

// responder is the receiving half of a QP (rxe_resp.c).
type responder struct {
	epsn    ib.PSN
	msn     uint32
	nakSent bool  // one sequence-error NAK per gap
	inMsg   uint8 // message in progress
	dropMsg bool  // UC: drop until the next FIRST/ONLY

	haveRecv bool
	cur      curRecv
	recvOff  uint64

	wva    uint64
	wrkey  uint32
	wresid uint32
	wlen   uint32

	res     []respRes // made on first use (allocRes), like out (pushOut)
	resHead int
	nres    int // len(res) once made: max_dest_rd_atomic rounded up to a power of 2

	// Requests refused for their PSN since the QP was created (PSNRejects).
	dupReqs, oosReqs uint64

	out     []outEntry
	outHead int
	outLen  int
}

func (r *responder) reset(epsn ib.PSN) {
	r.epsn = epsn
	r.msn = 0
	r.nakSent = false
	r.inMsg = msgNone
	r.dropMsg = false
	r.haveRecv = false
	r.recvOff = 0
	r.clearOutput()
}

// initResources sizes the responder resources for n READs and atomics in
// flight. The slots and the output ring are made when first needed, so a
// QP that has answered nothing holds neither.
func (r *responder) initResources(n int) {
	n = roundUpPow2(n)
	r.nres = n
	if r.res != nil && len(r.res) != n {
		r.res = nil
	}
	if r.out != nil && len(r.out) != 2*n+4 {
		r.out = nil
	}
	clear(r.res)
	r.resHead = 0
	r.outHead, r.outLen = 0, 0
}

// release drops the slots and the output ring of a responder with nothing
// queued; the next use makes them again.
func (r *responder) release() {
	if r.outLen == 0 {
		r.res, r.out = nil, nil
		r.resHead, r.outHead = 0, 0
	}
}

func (r *responder) clearOutput() {
	r.outHead, r.outLen = 0, 0
	for i := range r.res {
		r.res[i].queued = false
	}
}

func (r *responder) pushOut(e outEntry) bool {
	if r.out == nil && r.nres > 0 { // a DC orphan has none
		r.out = make([]outEntry, 2*r.nres+4)
	}
	if r.outLen == len(r.out) {
		return false
	}
	r.out[(r.outHead+r.outLen)%len(r.out)] = e
	r.outLen++
	return true
}

// singleAtHead reports whether the next output is a one-packet response.
func (r *responder) singleAtHead() bool {
	return r.outLen > 0 && r.out[r.outHead].kind != outRead
}

func (r *responder) popOut() {
	r.outHead = (r.outHead + 1) % len(r.out)
	r.outLen--
}

// queueAck queues an ACK/NAK. A positive ACK replaces a positive ACK still
// waiting at the tail: the newer one says everything the older one did.
// The queue is emptied by the transmit pass that follows every receive
// batch, so this coalesces the ACKs of one batch and never delays an ACK
// past it.
func (q *QP) queueAck(syn ib.Syndrome, psn ib.PSN, msn uint32) {
	r := &q.resp
	if syn.Type() == ib.SyndromeACK && r.outLen > 0 {
		t := &r.out[(r.outHead+r.outLen-1)%len(r.out)]
		if t.kind == outAck && t.syn.Type() == ib.SyndromeACK {
			if ib.PSNDiff(psn, t.psn) >= 0 {
				t.psn, t.msn, t.syn = psn, msn, syn
			}
			q.e.stats.AcksCoalesced++
			return
		}
	}
	r.pushOut(outEntry{kind: outAck, syn: syn, psn: psn, msn: msn})
	q.e.schedule(q)
}

func (q *QP) queueRes(i int) {
	r := &q.resp
	if r.res[i].queued {
		return
	}
	kind := uint8(outRead)
	switch r.res[i].kind {
	case resAtomic:
		kind = outAtomic
	case resAtomicWrite, resFlush:
		kind = outAtomicWrite // both are answered by an empty READ_RESPONSE_ONLY
	}
	if r.pushOut(outEntry{kind: kind, res: int32(i), gen: r.res[i].gen}) {
		r.res[i].queued = true
	}
	q.e.schedule(q)
}

// allocRes takes the next resource slot, recycling the oldest as rxe does. If
// a response of the old occupant is still queued (a replay the requester asked
// for, or a requester exceeding max_dest_rd_atomic), that response is
// abandoned: the generation change makes its output entry stale.
func (r *responder) allocRes() int {
	if r.res == nil {
		r.res = make([]respRes, r.nres)
	}
	i := r.resHead
	r.resHead = (r.resHead + 1) % len(r.res)
	r.res[i] = respRes{gen: r.res[i].gen + 1}
	return i
}

func (r *responder) findRes(psn ib.PSN, kind uint8) int {
	for i := range r.res {
		s := &r.res[i]
		if s.kind == kind && ib.PSNDiff(psn, s.firstPSN) >= 0 && ib.PSNDiff(psn, s.lastPSN) <= 0 {
			return i
		}
	}
	return -1
}

// receive dispatches a packet addressed to this QP.
func (q *QP) receive(p *ib.Packet, src *Source) error {
	if q.dc != nil {
		return ErrWrongTransport // DC packets take Engine.receiveDC
	}
	bth := p.BTH
	if bth.TVer() != 0 {
		return ErrBadHeader
	}
	if !pkeyMatch(bth.PKey(), defaultPKey) {
		return ErrBadPKey
	}
	op := uint8(bth.Opcode())
	tr := op & 0xE0
	low := op & 0x1F
	switch q.typ {
	case RC:
		if tr != transportRC {
			return ErrWrongTransport
		}
	case UC:
		if tr != transportUC || low > opWriteOnlyImm {
			return ErrWrongTransport
		}
	case UD:
		if tr != transportUD {
			return ErrWrongTransport
		}
	}
	if q.typ == UD {
		if !q.acceptsRequests() {
			return ErrNotReady
		}
		return q.respondUD(p, src)
	}
	isResp := q.typ == RC && opClass[low]&clResponse != 0
	if isResp && !q.acceptsResponses() || !isResp && !q.acceptsRequests() {
		return ErrNotReady
	}
	if !q.fromPeer(src) {
		q.e.stats.BadAddress++
		return ErrBadAddress
	}
	if q.e.cc.on { // the call only with congestion control on: every packet passes here
		q.noteCE(src)
	}
	if isResp {
		return q.complete(p, q.e.clock.Now())
	}
	return q.respond(p)
}

// acceptsRequests reports whether the responder takes requests in the QP's
// state (rxe check_type_state: RTR or later, but not ERR).
func (q *QP) acceptsRequests() bool {
	switch q.state {
	case StateRTR, StateRTS, StateSQD, StateSQE:
		return true
	}
	return false
}

// acceptsResponses reports whether the completer takes responses in the
// QP's state.
func (q *QP) acceptsResponses() bool {
	return q.state == StateRTS || q.state == StateSQD
}

// fromPeer is rxe's check_addr for a connected QP: the packet must come from
// the address vector's destination and be addressed to its source, so that
// a third host that knows the QPN, PSN and keys cannot inject requests or
// responses. A nil src (a caller that has no network addresses, such as a
// test feeding packets by hand) is not checked; a device always passes one.
// GIDs of IPv4 addresses are IPv4-mapped on both sides, so one comparison
// covers both families.
func (q *QP) fromPeer(src *Source) bool {
	if src == nil {
		return true
	}
	av := &q.attr.AV
	return src.SGID == av.DGID && src.DGID == av.SGID
}

// classAC reports a class A/C error (rxe do_class_ac_error): NAK the request,
// complete the receive WQE in use with st, and move the QP to the error state.
// On UC the rest of the message is dropped instead.
func (q *QP) classAC(psn ib.PSN, code ib.NAKCode, st WCStatus) error {
	r := &q.resp
	if q.typ == UC {
		r.dropMsg = true
		r.inMsg = msgNone
		r.recvOff = 0
		return ErrDropped
	}
	if r.haveRecv {
		q.postRecvWC(&r.cur, st, 0)
		r.haveRecv = false
	}
	q.failResponder(st)
	q.queueAck(ib.NAKSyndrome(code), psn, r.msn)
	return ErrDropped
}

// respond processes an RC or UC request packet through the stages of rxe's
// responder (rxe_resp.c): check_psn, check_op_seq, check_op_valid,
// check_resource, check_length, then execute (with check_rkey for WRITEs,
// whose key and range persist across the message) and the acknowledgement.
// Every stage either passes the packet on or ends its processing.
func (q *QP) respond(p *ib.Packet) error {
	psn := p.BTH.PSN()
	low := uint8(p.BTH.Opcode()) & 0x1F
	cl := opClass[low]
	if cl == 0 || cl&clResponse != 0 {
		return ErrBadHeader
	}
	if done, err := q.checkPSN(p, psn, low, cl); done {
		return err
	}
	if err := q.checkOpSeq(psn, cl); err != nil {
		return err
	}
	if err := q.checkOpValid(p, psn, cl); err != nil {
		return err
	}
	if err := q.checkResource(psn, cl); err != nil {
		return err
	}
	if err := q.checkLength(p, psn, cl); err != nil {
		return err
	}
	return q.execute(p, psn, low, cl)
}

// checkPSN compares the PSN with the expected one (rxe check_psn). RC NAKs a
// gap once and hands earlier PSNs to duplicate; UC resynchronises on the
// next FIRST/ONLY. done reports that the packet was fully handled.
func (q *QP) checkPSN(p *ib.Packet, psn ib.PSN, low uint8, cl uint16) (done bool, err error) {
	r := &q.resp
	d := ib.PSNDiff(psn, r.epsn)
	if q.typ == RC {
		if d > 0 {
			r.oosReqs++
			if !r.nakSent {
				r.nakSent = true
				q.e.stats.SeqNAKsSent++
				q.queueAck(ib.NAKSyndrome(ib.NAKPSNSequenceError), r.epsn, r.msn)
			}
			return true, ErrDropped
		}
		if d < 0 {
			r.dupReqs++
			return true, q.duplicate(p, psn, low, cl)
		}
		r.nakSent = false
		return false, nil
	}
	if r.dropMsg || d != 0 {
		r.inMsg = msgNone
		r.recvOff = 0
		if cl&clFirst == 0 {
			r.dropMsg = true
			return true, ErrDropped
		}
		r.dropMsg = false
		r.epsn = psn
	}
	return false, nil
}

// checkOpSeq rejects opcodes the responder does not implement and opcodes
// out of sequence within a message (rxe check_op_seq).
func (q *QP) checkOpSeq(psn ib.PSN, cl uint16) error {
	r := &q.resp
	rc := q.typ == RC
	if cl&clUnsupported != 0 {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	switch r.inMsg {
	case msgSend:
		if cl&clSend == 0 || cl&clFirst != 0 {
			if !rc {
				r.inMsg, r.recvOff = msgNone, 0
				return ErrDropped
			}
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	case msgWrite:
		if cl&clWrite == 0 || cl&clFirst != 0 {
			if !rc {
				r.inMsg = msgNone
				return ErrDropped
			}
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	default:
		if cl&(clMiddle|clLast) != 0 && cl&clFirst == 0 {
			if !rc {
				r.dropMsg = true
				return ErrDropped
			}
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	}
	return nil
}

// checkOpValid checks that the opcode's headers are present and that the
// QP's access flags allow the operation (rxe check_op_valid).
func (q *QP) checkOpValid(p *ib.Packet, psn ib.PSN, cl uint16) error {
	// A correct parser guarantees the headers; be defensive.
	if (cl&clRETH != 0 && len(p.RETH) < ib.RETHSize) || (cl&clImm != 0 && len(p.ImmDt) < ib.ImmDtSize) ||
		(cl&clInv != 0 && len(p.IETH) < ib.IETHSize) || (cl&clAtomic != 0 && len(p.AtomicETH) < ib.AtomicETHSize) ||
		(cl&clFlush != 0 && len(p.FETH) < ib.FETHSize) {
		return ErrBadHeader
	}
	acc := q.attr.AccessFlags
	if (cl&(clWrite|clAtomicWrite) != 0 && acc&AccessRemoteWrite == 0) || (cl&clRead != 0 && acc&AccessRemoteRead == 0) ||
		(cl&clAtomic != 0 && acc&AccessRemoteAtomic == 0) {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	return nil
}

// checkResource finds responder resources for READ/atomics and a receive
// WQE for a message that needs one, RNR NAKing when there is none (rxe
// check_resource).
func (q *QP) checkResource(psn ib.PSN, cl uint16) error {
	r := &q.resp
	if cl&(clRead|clAtomic|clAtomicWrite|clFlush) != 0 && q.attr.MaxDestRdAtomic == 0 {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	if cl&clRecv != 0 && !r.haveRecv {
		if !q.takeRecv(&r.cur) {
			if q.typ != RC {
				r.dropMsg = true
				r.inMsg = msgNone
				return ErrDropped
			}
			q.e.stats.RNRNAKsSent++
			q.queueAck(ib.RNRNAKSyndrome(ib.RNRTimer(q.attr.MinRNRTimer)), psn, r.msn)
			return ErrDropped
		}
		r.haveRecv = true
		r.recvOff = 0
	}
	if cl&clSend != 0 && !r.haveRecv {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	return nil
}

// checkLength checks the payload against the path MTU for the packet's
// position in its message, and the RETH length (rxe check_length).
func (q *QP) checkLength(p *ib.Packet, psn ib.PSN, cl uint16) error {
	plen, mtu := len(p.Payload), q.mtu
	switch {
	case cl&clFirst != 0 && cl&clLast != 0:
		if plen > mtu {
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	case cl&(clFirst|clMiddle) != 0:
		if plen != mtu {
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	case cl&clLast != 0:
		if plen == 0 || plen > mtu {
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	}
	if cl&clRETH != 0 && p.RETH.DMALen() > 1<<31 {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	return nil
}

// execute carries out the request (rxe execute): READ, atomics and FLUSH
// hand over to their own executors; WRITE and SEND data is placed, and the
// message state, ACK and receive completion follow.
func (q *QP) execute(p *ib.Packet, psn ib.PSN, low uint8, cl uint16) error {
	switch {
	case cl&clRead != 0:
		return q.executeRead(p, psn)
	case cl&clAtomicWrite != 0:
		return q.executeAtomicWrite(p, psn)
	case cl&clFlush != 0:
		return q.executeFlush(p, psn)
	case cl&clAtomic != 0:
		return q.executeAtomic(p, psn, low)
	case cl&clWrite != 0:
		if err := q.executeWrite(p, psn, cl); err != nil {
			return err
		}
	case cl&clSend != 0:
		if err := q.executeSend(p, psn); err != nil {
			return err
		}
	}
	q.finishRequest(p, psn, cl)
	return nil
}

// executeWrite places one WRITE packet. The R_Key and range are checked on
// every packet against what remains of the message (rxe check_rkey).
func (q *QP) executeWrite(p *ib.Packet, psn ib.PSN, cl uint16) error {
	r := &q.resp
	if cl&clRETH != 0 {
		r.wva, r.wrkey = p.RETH.VA(), p.RETH.RKey()
		r.wresid, r.wlen = p.RETH.DMALen(), p.RETH.DMALen()
	}
	if cl&clRETH != 0 && r.wlen == 0 {
		return nil // rxe skips key checks for a zero-length RDMA WRITE (C9-88)
	}
	rest, ok := q.remoteSpan(r.wrkey, AccessRemoteWrite, r.wva, r.wresid)
	if !ok {
		return q.rkeyViolation(psn)
	}
	plen, mtu := len(p.Payload), q.mtu
	pc := int(p.BTH.PadCount())
	if r.wresid > uint32(mtu) {
		if plen != mtu || pc != 0 {
			return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
		}
	} else if uint32(plen) != r.wresid || pc != pad(int(r.wresid)) {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	if plen > 0 {
		mem := rest[:plen]
		if q.readPending(mem) {
			return q.deferRequest()
		}
		copy(mem, p.Payload)
	}
	r.wva += uint64(plen)
	r.wresid -= uint32(plen)
	return nil
}

// executeSend copies one SEND packet into the receive WQE. A buffer that is
// too small or unusable is a class A/C error on RC and drops the message on
// UC.
func (q *QP) executeSend(p *ib.Packet, psn ib.PSN) error {
	r := &q.resp
	plen := len(p.Payload)
	if plen == 0 {
		return nil
	}
	st := q.e.copySGL(q.pd, r.cur.sgl(), r.recvOff, p.Payload, true)
	if st == WCSuccess {
		r.recvOff += uint64(plen)
		return nil
	}
	if q.typ != RC {
		r.dropMsg, r.inMsg, r.recvOff = true, msgNone, 0
		return ErrDropped
	}
	if st == WCLocLenErr {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	return q.classAC(psn, ib.NAKRemoteOperationalError, WCLocQPOpErr)
}

// finishRequest advances the message and PSN state after a WRITE or SEND
// packet was placed, acknowledges it if asked, and completes the receive
// WQE at the end of a message that consumes one (rxe acknowledge, cleanup).
func (q *QP) finishRequest(p *ib.Packet, psn ib.PSN, cl uint16) {
	r := &q.resp
	invFailed := cl&clInv != 0 && !q.invalidate(p.IETH.RKey())
	if cl&clLast != 0 {
		r.msn = (r.msn + 1) & ib.PSNMask
		r.inMsg = msgNone
	} else if cl&clFirst != 0 {
		if cl&clSend != 0 {
			r.inMsg = msgSend
		} else {
			r.inMsg = msgWrite
		}
	}
	r.epsn = psn.Next()
	if q.typ == RC && p.BTH.AckReq() {
		q.queueAck(ib.SyndromeACKUnlimited, psn, r.msn)
	}
	if cl&clComplete == 0 {
		return
	}
	wc := WorkCompletion{WRID: r.cur.id, Status: WCSuccess, Opcode: WCRecv, QPN: q.qpn, Flags: WCWithGRH,
		ByteLen: uint32(r.recvOff)}
	if cl&clWrite != 0 {
		wc.Opcode = WCRecvRDMAWithImm
		wc.ByteLen = r.wlen
	}
	if cl&clImm != 0 {
		wc.Flags |= WCWithImm
		wc.Imm = p.ImmDt.Imm()
	}
	if cl&clInv != 0 {
		wc.Flags |= WCWithInv
		wc.InvalidatedRKey = p.IETH.RKey()
	}
	if invFailed {
		wc = WorkCompletion{WRID: r.cur.id, Status: WCRemInvReqErr, Opcode: WCRecv, QPN: q.qpn}
	}
	r.haveRecv = false
	q.pushWC(q.recvCQ, &wc)
	if invFailed {
		// rxe (class J): the message is still acknowledged, so the
		// requester's SEND completes, and then the QP fails. Moving to the
		// error state empties the output, so the ACK is queued after it.
		q.toError()
		if q.typ == RC && p.BTH.AckReq() {
			q.queueAck(ib.SyndromeACKUnlimited, psn, r.msn)
		}
	}
}

func (q *QP) executeRead(p *ib.Packet, psn ib.PSN) error {
	r := &q.resp
	va, rkey, n := p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen()
	if n > 0 {
		if _, ok := q.remoteSpan(rkey, AccessRemoteRead, va, n); !ok {
			return q.rkeyViolation(psn)
		}
	}
	// C9-148: the MSN counts a READ when it is received.
	r.msn = (r.msn + 1) & ib.PSNMask
	npk := uint32(1)
	if n > uint32(q.mtu) {
		npk = (n + uint32(q.mtu) - 1) / uint32(q.mtu)
	}
	i := r.allocRes()
	r.res[i] = respRes{gen: r.res[i].gen, kind: resRead, newState: true, firstPSN: psn, lastPSN: psn.Add(npk - 1), curPSN: psn,
		origVA: va, origLen: n, va: va, resid: n, rkey: rkey, msn: r.msn}
	r.epsn = psn.Add(npk)
	r.inMsg = msgNone
	q.queueRes(i)
	return nil
}

func (q *QP) executeAtomic(p *ib.Packet, psn ib.PSN, low uint8) error {
	r := &q.resp
	a := p.AtomicETH
	va := a.VA()
	mem, ok := q.remoteSpan(a.RKey(), AccessRemoteAtomic, va, 8)
	if !ok {
		return q.rkeyViolation(psn)
	}
	if va&7 != 0 {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	if q.readPending(mem) {
		return q.deferRequest()
	}
	// The target is a host-order 64-bit word, as rxe treats it.
	orig := binary.NativeEndian.Uint64(mem)
	v := orig
	if low == opCompareSwap {
		if orig == a.Compare() {
			v = a.SwapAdd()
		}
	} else {
		v = orig + a.SwapAdd()
	}
	binary.NativeEndian.PutUint64(mem, v)
	r.msn = (r.msn + 1) & ib.PSNMask
	i := r.allocRes()
	r.res[i] = respRes{gen: r.res[i].gen, kind: resAtomic, firstPSN: psn, lastPSN: psn, curPSN: psn, orig: orig, msn: r.msn, rkey: a.RKey(), origVA: va}
	r.epsn = psn.Next()
	r.inMsg = msgNone
	q.queueRes(i)
	return nil
}

// executeAtomicWrite performs an ATOMIC_WRITE: the 8 payload bytes are stored
// as one aligned word, and the answer is an empty READ_RESPONSE_ONLY (rxe).
func (q *QP) executeAtomicWrite(p *ib.Packet, psn ib.PSN) error {
	r := &q.resp
	va, n := p.RETH.VA(), p.RETH.DMALen()
	mem, ok := q.remoteSpan(p.RETH.RKey(), AccessRemoteWrite, va, n)
	if !ok {
		return q.rkeyViolation(psn)
	}
	if n != 8 || len(p.Payload) != 8 || p.BTH.PadCount() != 0 || va&7 != 0 {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	if q.readPending(mem) {
		return q.deferRequest()
	}
	copy(mem, p.Payload)
	r.msn = (r.msn + 1) & ib.PSNMask
	i := r.allocRes()
	r.res[i] = respRes{gen: r.res[i].gen, kind: resAtomicWrite, firstPSN: psn, lastPSN: psn, curPSN: psn, msn: r.msn}
	r.epsn = psn.Next()
	r.inMsg = msgNone
	q.queueRes(i)
	return nil
}

// FLUSH placement types and selectivity levels (FETH).
const (
	flushGlobal     = 1
	flushPersistent = 2
	flushRange      = 0
	flushWholeMR    = 1
)

// executeFlush answers a FLUSH (IBTA 1.5 memory placement extension) the way
// rxe does: the region must allow the requested placement type, the range is
// checked unless the whole region is selected, and the answer is an empty
// READ_RESPONSE_ONLY. Writes placed by this engine are visible as soon as they
// are made, so global visibility needs no further work; persistence is never
// granted (RegMR refuses AccessFlushPersistent).
func (q *QP) executeFlush(p *ib.Packet, psn ib.PSN) error {
	r := &q.resp
	plt, sel := p.FETH.Placement(), p.FETH.Selectivity()
	need := Access(0)
	if plt&flushGlobal != 0 {
		need |= AccessFlushGlobal
	}
	if plt&flushPersistent != 0 {
		need |= AccessFlushPersistent
	}
	if plt&^(flushGlobal|flushPersistent) != 0 || plt == 0 || sel > flushWholeMR {
		return q.classAC(psn, ib.NAKInvalidRequest, WCRemInvReqErr)
	}
	if _, _, _, ok := q.rkeyTarget(p.RETH.RKey(), need); !ok {
		return q.rkeyViolation(psn)
	}
	if sel == flushRange {
		if _, ok := q.remoteSpan(p.RETH.RKey(), need, p.RETH.VA(), p.RETH.DMALen()); !ok {
			return q.rkeyViolation(psn)
		}
	}
	r.msn = (r.msn + 1) & ib.PSNMask
	i := r.allocRes()
	r.res[i] = respRes{gen: r.res[i].gen, kind: resFlush, firstPSN: psn, lastPSN: psn, curPSN: psn, msn: r.msn}
	r.epsn = psn.Next()
	r.inMsg = msgNone
	q.queueRes(i)
	return nil
}

// readPending reports whether a READ response still to be sent covers memory
// overlapping mem. Read responses are built when the device asks for packets;
// executing a later WRITE or atomic on that memory first would let the READ
// return data newer than itself, breaking the responder's in-order execution.
func (q *QP) readPending(mem []byte) bool {
	r := &q.resp
	if r.outLen == 0 || len(mem) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	hi := lo + uintptr(len(mem))
	for i := range r.res {
		s := &r.res[i]
		if !s.queued || s.kind != resRead || s.resid == 0 {
			continue
		}
		rm, ok := q.remoteSpan(s.rkey, AccessRemoteRead, s.va, s.resid)
		if !ok {
			continue
		}
		rlo := uintptr(unsafe.Pointer(unsafe.SliceData(rm)))
		if lo < rlo+uintptr(len(rm)) && rlo < hi {
			return true
		}
	}
	return false
}

// deferRequest refuses a request that must wait for earlier READ responses to
// leave: it is dropped and, behind those responses, a sequence-error NAK asks
// the requester to resend from it.
func (q *QP) deferRequest() error {
	r := &q.resp
	if !r.nakSent {
		r.nakSent = true
		q.queueAck(ib.NAKSyndrome(ib.NAKPSNSequenceError), r.epsn, r.msn)
	}
	return ErrDropped
}

// duplicate handles an RC request with a PSN before ePSN (rxe duplicate_request).
func (q *QP) duplicate(p *ib.Packet, psn ib.PSN, low uint8, cl uint16) error {
	r := &q.resp
	q.e.stats.DuplicateRequests++
	switch {
	case cl&(clSend|clWrite) != 0:
		// C9-105: ACK again with the last PSN accepted; never re-execute.
		q.queueAck(ib.SyndromeACKUnlimited, r.epsn.Add(ib.PSNMask), r.msn)
	case cl&clRead != 0:
		if len(p.RETH) < ib.RETHSize {
			return ErrBadHeader
		}
		i := r.findRes(psn, resRead)
		if i < 0 {
			return ErrDropped
		}
		s := &r.res[i]
		va, n := p.RETH.VA(), p.RETH.DMALen()
		// The retried request must be the original or a subrange of it.
		if p.RETH.RKey() != s.rkey || va < s.origVA || n > s.origLen || va-s.origVA > uint64(s.origLen-n) {
			return ErrDropped
		}
		s.curPSN = psn
		s.va, s.resid = va, n
		s.newState = psn == s.firstPSN
		s.msn = r.msn
		q.queueRes(i)
	case cl&(clAtomic|clAtomicWrite|clFlush) != 0:
		kind := uint8(resAtomic)
		switch {
		case cl&clAtomicWrite != 0:
			kind = resAtomicWrite
		case cl&clFlush != 0:
			kind = resFlush
		}
		i := r.findRes(psn, kind)
		if i < 0 {
			return ErrDropped
		}
		// Replay the saved result; the atomic is never executed twice.
		r.res[i].msn = r.msn
		q.queueRes(i)
	default:
		return ErrDropped
	}
	return nil
}

// respondUD processes a UD SEND.
func (q *QP) respondUD(p *ib.Packet, src *Source) error {
	low := uint8(p.BTH.Opcode()) & 0x1F
	if low != opSendOnly && low != opSendOnlyImm {
		return ErrBadHeader
	}
	if len(p.DETH) < ib.DETHSize || (low == opSendOnlyImm && len(p.ImmDt) < ib.ImmDtSize) {
		return ErrBadHeader
	}
	want := q.attr.QKey
	if q.gsi {
		want = GSIQKey
	}
	if p.DETH.QKey() != want {
		return ErrBadQKey
	}
	rq := &q.rq
	if q.srq != nil {
		rq = &q.srq.rq
	}
	rq.mu.Lock()
	locked := true
	defer func() {
		if locked {
			rq.mu.Unlock()
		}
	}()
	if rq.n == 0 {
		return ErrDropped
	}
	w := &rq.ring[rq.head]
	if w.length < uint64(grhAreaLen+len(p.Payload)) {
		// Does not fit: dropped, the receive stays posted (rxe, non-SRQ).
		return ErrDropped
	}
	var grh [grhAreaLen]byte
	if src != nil {
		switch len(src.NetworkHeader) {
		case 20:
			copy(grh[20:], src.NetworkHeader)
		case 40:
			copy(grh[:], src.NetworkHeader)
		}
	}
	st := q.e.copySGL(q.pd, w.sge, 0, grh[:], true)
	if st == WCSuccess {
		st = q.e.copySGL(q.pd, w.sge, grhAreaLen, p.Payload, true)
	}
	id, _ := rq.pop()
	rq.mu.Unlock()
	locked = false
	wc := WorkCompletion{WRID: id, Status: st, Opcode: WCRecv, QPN: q.qpn, SrcQP: p.DETH.SrcQP(),
		ByteLen: uint32(grhAreaLen + len(p.Payload)), Flags: WCWithGRH}
	if st != WCSuccess {
		wc = WorkCompletion{WRID: id, Status: st, Opcode: WCRecv, QPN: q.qpn}
	} else if low == opSendOnlyImm {
		wc.Flags |= WCWithImm
		wc.Imm = p.ImmDt.Imm()
	}
	q.pushWC(q.recvCQ, &wc)
	if st != WCSuccess {
		q.toError()
	}
	return nil
}

// produce builds the next pending response (ACK, NAK, read response, atomic ACK).
func (r *responder) produce(q *QP, buf []byte, t *TxPacket) (int, bool) {
	for r.outLen > 0 {
		e := &r.out[r.outHead]
		switch e.kind {
		case outAck:
			h := ib.BTHSize
			ib.AETH(buf[h : h+ib.AETHSize]).Encode(&ib.AETHFields{Syndrome: e.syn, MSN: e.msn})
			writeBTH(buf, transportRC|opAck, false, false, 0, q.attr.DestQPN, e.psn)
			n := finish(buf, h+ib.AETHSize, 0)
			r.popOut()
			q.fillAV(t, &q.attr.AV)
			return n, true
		case outAtomic:
			s := &r.res[e.res]
			if s.gen != e.gen {
				r.popOut()
				continue
			}
			if q.state == StateErr || s.kind != resAtomic {
				s.queued = false
				r.popOut()
				continue
			}
			h := ib.BTHSize
			ib.AETH(buf[h : h+ib.AETHSize]).Encode(&ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: s.msn})
			h += ib.AETHSize
			ib.AtomicAckETH(buf[h : h+ib.AtomicAckETHSize]).Encode(&ib.AtomicAckETHFields{Orig: s.orig})
			h += ib.AtomicAckETHSize
			writeBTH(buf, transportRC|opAtomicAck, false, false, 0, q.attr.DestQPN, s.firstPSN)
			n := finish(buf, h, 0)
			s.queued = false
			r.popOut()
			q.fillAV(t, &q.attr.AV)
			return n, true
		case outAtomicWrite:
			s := &r.res[e.res]
			if s.gen != e.gen {
				r.popOut()
				continue
			}
			if q.state == StateErr || (s.kind != resAtomicWrite && s.kind != resFlush) {
				s.queued = false
				r.popOut()
				continue
			}
			h := ib.BTHSize
			ib.AETH(buf[h : h+ib.AETHSize]).Encode(&ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: s.msn})
			writeBTH(buf, transportRC|opReadRespOnly, false, false, 0, q.attr.DestQPN, s.firstPSN)
			n := finish(buf, h+ib.AETHSize, 0)
			s.queued = false
			r.popOut()
			q.fillAV(t, &q.attr.AV)
			return n, true
		case outRead:
			s := &r.res[e.res]
			if s.gen != e.gen {
				r.popOut()
				continue
			}
			if q.state == StateErr || s.kind != resRead {
				s.queued = false
				r.popOut()
				continue
			}
			return r.readResponse(q, s, buf, t)
		default:
			r.popOut()
		}
	}
	return 0, false
}

func (r *responder) readResponse(q *QP, s *respRes, buf []byte, t *TxPacket) (int, bool) {
	mtu := uint32(q.mtu)
	var op uint8
	if s.newState {
		op = opReadRespFirst
		if s.resid <= mtu {
			op = opReadRespOnly
		}
	} else {
		op = opReadRespMiddle
		if s.resid <= mtu {
			op = opReadRespLast
		}
	}
	paylen := minU32(s.resid, mtu)
	h := ib.BTHSize
	if op != opReadRespMiddle {
		ib.AETH(buf[h : h+ib.AETHSize]).Encode(&ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: s.msn})
		h += ib.AETHSize
	}
	if paylen > 0 {
		// Re-resolve the key for every packet: the region may have been
		// deregistered or invalidated, or its window moved, since the
		// request was accepted.
		mem, ok := q.remoteSpan(s.rkey, AccessRemoteRead, s.va, paylen)
		if !ok {
			q.e.stats.RKeyViolations++
			psn := s.curPSN
			s.kind = resNone
			s.queued = false
			r.popOut()
			q.failResponder(WCRemAccessErr)
			h := ib.BTHSize
			ib.AETH(buf[h : h+ib.AETHSize]).Encode(&ib.AETHFields{Syndrome: ib.NAKSyndrome(ib.NAKRemoteAccessError), MSN: r.msn})
			writeBTH(buf, transportRC|opAck, false, false, 0, q.attr.DestQPN, psn)
			q.fillAV(t, &q.attr.AV)
			return finish(buf, h+ib.AETHSize, 0), true
		}
		copy(buf[h:h+int(paylen)], mem)
	}
	pc := pad(int(paylen))
	writeBTH(buf, transportRC|op, false, false, pc, q.attr.DestQPN, s.curPSN)
	n := finish(buf, h+int(paylen), pc)
	s.newState = false
	s.va += uint64(paylen)
	s.resid -= paylen
	s.curPSN = s.curPSN.Next()
	if s.resid == 0 {
		s.queued = false
		r.popOut()
	}
	q.fillAV(t, &q.attr.AV)
	return n, true
}
