package qp

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/ib"
)

// QPCap sizes a queue pair's work queues.
type QPCap struct {
	MaxSendWR, MaxRecvWR   int
	MaxSendSGE, MaxRecvSGE int
	MaxInlineData          int
}

// QPInitAttr describes a queue pair to create.
type QPInitAttr struct {
	Type           QPType
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // optional; then the QP has no receive queue of its own
	Cap            QPCap
	SigAll         bool       // every send WR generates a completion
	DC             DCInitAttr // DCT only: access key and initiator bound (see dc.go)
}

// QPAttr holds the modifiable attributes of a queue pair (struct ibv_qp_attr).
type QPAttr struct {
	State, CurState QPState
	AccessFlags     Access // remote access the responder allows
	PKeyIndex       uint16
	Port            uint8
	QKey            uint32
	AV              AddressVector
	PathMTU         ib.MTU
	Timeout         uint8 // local ACK timeout 4.096 µs × 2^Timeout; 0 = no retransmit timer
	RetryCnt        uint8 // 7 = retry forever (as rxe)
	RNRRetry        uint8 // 7 = retry forever
	MinRNRTimer     uint8
	RQPSN, SQPSN    uint32
	MaxRdAtomic     uint8 // initiator depth
	MaxDestRdAtomic uint8 // responder resources
	DestQPN         uint32
}

// sendWQE is a posted send work request plus the requester's bookkeeping.
type sendWQE struct {
	id         uint64
	op         WROpcode
	flags      SendFlags
	imm        uint32
	invRKey    uint32
	remoteAddr uint64
	rkey       uint32
	compareAdd uint64
	swap       uint64
	sge        []SGE  // into the QP's sge store
	inline     []byte // into the QP's inline store; used when flags has SendInline
	length     uint32

	// BIND_MW: the window and what to bind it to (the address is
	// remoteAddr, the new R_Key rkey)
	mw         *MW
	bindMR     *MR
	bindLen    uint64
	bindAccess Access

	// UD and DCI (the DCI's target: address, DCT number, DC key)
	av        AddressVector
	remoteQPN uint32
	qkey      uint32
	dcKey     uint64

	started   bool // PSNs assigned
	rdCounted bool // holds one of the max_rd_atomic slots
	firstPSN  ib.PSN
	lastPSN   ib.PSN
}

// QP is a queue pair.
type QP struct {
	e      *Engine
	pd     *PD
	typ    QPType // GSI QPs are UD internally
	gsi    bool
	qpn    uint32
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	cap    QPCap
	sigAll bool

	state QPState
	attr  QPAttr
	mtu   int
	rto   time.Duration // retransmit timeout, 0 = none
	sport uint16

	sq       []sendWQE
	sqStore  []SGE
	sqInline []byte
	sqHead   uint32 // oldest not completed (completer position)
	sqTail   uint32 // next free, as far as the engine has absorbed posts
	rq       recvQueue

	// Posts without the engine's serialization (PostSendConcurrent). sqMu
	// guards the ring's allocation, the state and destroyed as posters
	// read them, and the slots from sqTail on: a poster writes the slot
	// at sqPosted and then publishes sqPosted+1, which the engine absorbs
	// into sqTail (absorbPosts) where it starts work on the QP. sqHeadPub
	// is sqHead as the engine last published it, never ahead of it: a
	// poster's bound for a free slot.
	sqMu      sync.Mutex
	sqPosted  atomic.Uint32
	sqHeadPub atomic.Uint32
	inboxNext *QP         // in the shard's inbox (readyList.post)
	inboxed   atomic.Bool // in the inbox, or being put there

	req  requester
	comp completer
	resp responder
	dc   *dcQP // DCI, DCT, or one initiator's responder state at a DCT
	cc   *ccQP // congestion control (ccrate.go); nil until it is used

	inReady   bool
	readyNext *QP
	reqTurn   bool // the requester goes first on the next produce
	destroyed bool
	timerSlot int32 // the QP's slot in the engine's timer heap, 0 if none yet
	timerIn   bool  // in the timer heap, keyed at timerKey
	timerKey  time.Duration
	timerPass uint32 // the Advance pass that last ran this QP's timers
	listIdx   int32  // index in the engine's qpList

	// replyFirst: requests go before queued single-packet responses
	// (SetReplyBeforeAck).
	replyFirst bool

	// Asynchronous events (events.go).
	ctx       any
	failure   *QPError
	cause     WCStatus // status of the error completion that preceded a failure
	respFault bool     // the responder detected the failure
	lostWC    bool     // a completion did not fit its CQ
}

// CreateQP creates a queue pair in the RESET state.
func (pd *PD) CreateQP(init *QPInitAttr) (*QP, error) {
	e := pd.e
	if pd.closed {
		return nil, ErrClosed
	}
	typ, gsi := init.Type, false
	switch typ {
	case RC, UC, UD:
	case DCI, DCT:
		typ = RC // the RC requester, completer and responder run DC
	case GSI:
		if e.qps[1] != nil {
			return nil, ErrBusy
		}
		typ, gsi = UD, true
	default:
		return nil, ErrOpNotSupported
	}
	if init.SendCQ == nil || init.RecvCQ == nil || init.SendCQ.closed || init.RecvCQ.closed {
		return nil, ErrInvalidArgument
	}
	c := init.Cap
	if err := dcPrepare(init, &c); err != nil {
		return nil, err
	}
	if c.MaxSendWR < 1 || c.MaxSendWR > MaxQPWR || c.MaxSendSGE < 0 || c.MaxSendSGE > MaxSGE ||
		c.MaxInlineData < 0 || c.MaxInlineData > MaxInline {
		return nil, ErrInvalidArgument
	}
	if init.SRQ == nil && (c.MaxRecvWR < 1 || c.MaxRecvWR > MaxQPWR || c.MaxRecvSGE < 0 || c.MaxRecvSGE > MaxSGE) {
		return nil, ErrInvalidArgument
	}
	if init.SRQ != nil {
		if init.SRQ.closed {
			return nil, ErrClosed
		}
		if init.SRQ.pd != pd {
			return nil, ErrWrongPD
		}
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	qpn, ok := uint32(1), true
	if !gsi {
		qpn, ok = e.allocQPN()
	}
	if !ok {
		return nil, ErrNoResources
	}
	q := &QP{
		e: e, pd: pd, typ: typ, gsi: gsi, qpn: qpn,
		sendCQ: init.SendCQ, recvCQ: init.RecvCQ, srq: init.SRQ,
		cap: c, sigAll: init.SigAll,
	}
	if init.SRQ == nil {
		q.rq.init(c.MaxRecvWR, c.MaxRecvSGE)
	} else {
		init.SRQ.refs++
	}
	q.attr.PathMTU = ib.MTU256 // rxe's default until modify sets it
	q.attr.Port = 1
	q.mtu = 256
	q.sport = ib.RXESourcePort(qpn)
	q.resetTransport()
	q.initDC(init)
	pd.refs++
	init.SendCQ.refs++
	init.RecvCQ.refs++
	e.qps[qpn] = q
	q.listIdx = int32(len(e.qpList))
	e.qpList = append(e.qpList, q)
	return q, nil
}

func (e *Engine) allocQPN() (uint32, bool) {
	for i := 0; i < 1<<24; i++ {
		n := e.nextQPN
		e.nextQPN++
		if e.nextQPN > ib.PSNMask {
			e.nextQPN = firstQPN
		}
		if _, used := e.qps[n]; !used {
			return n, true
		}
	}
	return 0, false
}

// QPN returns the queue pair number.
func (q *QP) QPN() uint32 { return q.qpn }

// PSNRejects counts the requests an RC QP's responder refused for their
// PSN since the QP was created, whoever sent them from the peer's address.
type PSNRejects struct {
	Duplicate     uint64 // behind the expected PSN: acknowledged again, not executed
	OutOfSequence uint64 // ahead of it: one sequence NAK per gap, then dropped
}

// PSNRejects returns the QP's own counts of requests refused for their PSN
// (the device's duplicate_request and out_of_sequence counters sum every
// QP's).
func (q *QP) PSNRejects() PSNRejects {
	return PSNRejects{Duplicate: q.resp.dupReqs, OutOfSequence: q.resp.oosReqs}
}

// ExpectedPSN returns the PSN the responder expects next (rxe's
// resp.psn, what ibv_query_qp reports as rq_psn on rxe): the starting PSN
// until the first request arrives.
func (q *QP) ExpectedPSN() uint32 { return uint32(q.resp.epsn) }

// Type returns the transport type.
func (q *QP) Type() QPType {
	if q.dc != nil {
		return q.dc.qpType()
	}
	if q.gsi {
		return GSI
	}
	return q.typ
}

// State returns the current state.
func (q *QP) State() QPState { return q.state }

// Attr returns the current attributes.
func (q *QP) Attr() QPAttr {
	a := q.attr
	a.State, a.CurState = q.state, q.state
	return a
}

// Destroy destroys the queue pair. Outstanding work requests are dropped
// without completions, as ibv_destroy_qp does.
func (q *QP) Destroy() error {
	if q.destroyed {
		return ErrClosed
	}
	// Under both queues' locks: a concurrent post either sees the QP
	// destroyed or was made before, and is dropped with the others.
	q.sqMu.Lock()
	q.rq.mu.Lock()
	q.destroyed = true
	q.rq.mu.Unlock()
	q.sqMu.Unlock()
	q.destroyDC()
	rl := q.e.readyOf(q)
	rl.drain() // so that q is in the ready list, if anywhere, and leaves it
	rl.remove(q)
	q.e.timers.release(q)
	delete(q.e.qps, q.qpn)
	if q.e.rxQP == q {
		q.e.rxQP = nil
	}
	// Swap with the last, in O(1) however many QPs there are, and clear
	// the vacated slot, which would otherwise keep this QP and its CQs
	// reachable.
	l := q.e.qpList
	last := l[len(l)-1]
	l[q.listIdx], last.listIdx = last, q.listIdx
	l[len(l)-1] = nil
	q.e.qpList = l[:len(l)-1]
	q.pd.refs--
	q.sendCQ.refs--
	q.recvCQ.refs--
	if q.srq != nil {
		q.srq.refs--
	}
	return nil
}

// transition is what qpStateTable says about one move for one QP type.
type transition struct {
	valid    bool
	req, opt AttrMask
}

// qpMove is one entry of qpStateTable: the QP types that may make the move,
// and per type the attributes it requires and those it allows besides
// (AttrState is always required).
type qpMove struct {
	types    uint8 // bit 1<<t: allowed for QPType t
	req, opt [UD + 1]AttrMask
}

const (
	forRC  = 1 << RC
	forUC  = 1 << UC
	forUD  = 1 << UD
	forAll = forRC | forUC | forUD
)

// masks gives the RC, UC and UD entries of a qpMove column.
func masks(rc, uc, ud AttrMask) [UD + 1]AttrMask {
	var m [UD + 1]AttrMask
	m[RC], m[UC], m[UD] = rc, uc, ud
	return m
}

// qpStateTable is the kernel's qp_state_table (ib_modify_qp_is_ok in
// drivers/infiniband/core/verbs.c) for the QP types and attributes this
// engine supports, indexed [current][next]. GSI QPs use the UD entries.
// Every state may move to RESET and to ERR with no other attribute.
var qpStateTable = [StateErr + 1][StateErr + 1]qpMove{
	StateReset: {
		StateReset: {types: forAll},
		StateInit: {types: forAll, req: masks(
			AttrPKeyIndex|AttrPort|AttrAccessFlags,
			AttrPKeyIndex|AttrPort|AttrAccessFlags,
			AttrPKeyIndex|AttrPort|AttrQKey)},
		StateErr: {types: forAll},
	},
	StateInit: {
		StateReset: {types: forAll},
		StateInit: {types: forAll, opt: masks(
			AttrPKeyIndex|AttrPort|AttrAccessFlags,
			AttrPKeyIndex|AttrPort|AttrAccessFlags,
			AttrPKeyIndex|AttrPort|AttrQKey)},
		StateRTR: {types: forAll,
			req: masks(
				AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer,
				AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN,
				0),
			opt: masks(
				AttrAltPath|AttrAccessFlags|AttrPKeyIndex,
				AttrAltPath|AttrAccessFlags|AttrPKeyIndex,
				AttrPKeyIndex|AttrQKey)},
		StateErr: {types: forAll},
	},
	StateRTR: {
		StateReset: {types: forAll},
		StateRTS: {types: forAll,
			req: masks(
				AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic,
				AttrSQPSN,
				AttrSQPSN),
			opt: masks(
				AttrCurState|AttrAltPath|AttrAccessFlags|AttrMinRNRTimer|AttrPathMigState,
				AttrCurState|AttrAltPath|AttrAccessFlags|AttrPathMigState,
				AttrCurState|AttrQKey)},
		StateErr: {types: forAll},
	},
	StateRTS: {
		StateReset: {types: forAll},
		StateRTS: {types: forAll, opt: masks(
			AttrCurState|AttrAccessFlags|AttrAltPath|AttrPathMigState|AttrMinRNRTimer,
			AttrCurState|AttrAccessFlags|AttrAltPath|AttrPathMigState,
			AttrCurState|AttrQKey)},
		StateSQD: {types: forAll, opt: masks(AttrEnSQDAsyncNotify, AttrEnSQDAsyncNotify, AttrEnSQDAsyncNotify)},
		StateErr: {types: forAll},
	},
	StateSQD: {
		StateReset: {types: forAll},
		StateRTS: {types: forAll, opt: masks(
			AttrCurState|AttrAccessFlags|AttrAltPath|AttrPathMigState|AttrMinRNRTimer,
			AttrCurState|AttrAccessFlags|AttrAltPath|AttrPathMigState,
			AttrCurState|AttrQKey)},
		StateSQD: {types: forAll, opt: masks(
			AttrPort|AttrAV|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic|AttrMaxDestRdAtomic|
				AttrCurState|AttrAltPath|AttrAccessFlags|AttrPKeyIndex|AttrMinRNRTimer|AttrPathMigState,
			AttrPort|AttrAV|AttrCurState|AttrAltPath|AttrAccessFlags|AttrPKeyIndex|AttrPathMigState,
			AttrPKeyIndex|AttrQKey)},
		StateErr: {types: forAll},
	},
	StateSQE: {
		StateReset: {types: forAll},
		// Only UC and UD QPs reach SQE (an RC send error is fatal).
		StateRTS: {types: forUC | forUD, opt: masks(
			0,
			AttrCurState|AttrAccessFlags,
			AttrCurState|AttrQKey)},
		StateErr: {types: forAll},
	},
	StateErr: {
		StateReset: {types: forAll},
		StateErr:   {types: forAll},
	},
}

// transitionFor looks a move up in qpStateTable.
func transitionFor(t QPType, from, to QPState) transition {
	if t == DCI || t == DCT {
		return dcTransitionFor(t, from, to)
	}
	if t > UD || from > StateErr || to > StateErr {
		return transition{}
	}
	m := &qpStateTable[from][to]
	if m.types&(1<<t) == 0 {
		return transition{}
	}
	return transition{true, m.req[t] | AttrState, m.opt[t]}
}

// Modify changes the QP's state and attributes like ibv_modify_qp: the mask must
// contain every attribute the transition requires and nothing it does not allow,
// and every value must be in range. On error nothing changes.
func (q *QP) Modify(attr *QPAttr, mask AttrMask) error {
	if q.destroyed {
		return ErrClosed
	}
	cur := q.state
	if mask&AttrCurState != 0 {
		if attr.CurState != q.state {
			return &AttrError{AttrCurState, "does not match the current state " + q.state.String()}
		}
	}
	next := cur
	if mask&AttrState != 0 {
		if attr.State > StateErr {
			return &AttrError{AttrState, "unknown state"}
		}
		next = attr.State
	}
	tr := transitionFor(q.tableType(), cur, next)
	if mask&AttrState == 0 {
		// Attribute change without a state change: allowed only where a
		// same-state transition exists.
		tr = transitionFor(q.tableType(), cur, cur)
		if tr.valid {
			tr.req &^= AttrState
		}
	}
	if !tr.valid {
		return &AttrError{AttrState, "transition " + cur.String() + "→" + next.String() + " not allowed for " + q.typ.String()}
	}
	if missing := tr.req &^ mask; missing != 0 {
		return &AttrError{missing, "required for " + cur.String() + "→" + next.String()}
	}
	if extra := mask &^ (tr.req | tr.opt | AttrState); extra != 0 {
		return &AttrError{extra, "not allowed for " + cur.String() + "→" + next.String()}
	}
	if err := q.checkValues(attr, mask); err != nil {
		return err
	}
	q.applyAttrs(attr, mask)
	if next != cur {
		q.setState(next)
	}
	return nil
}

// applyAttrs stores the attributes in mask, and the transport state they
// set (PSNs, retry counters, timers, responder resources).
func (q *QP) applyAttrs(attr *QPAttr, mask AttrMask) {
	a := &q.attr
	if mask&AttrAccessFlags != 0 {
		a.AccessFlags = attr.AccessFlags
	}
	if mask&AttrPKeyIndex != 0 {
		a.PKeyIndex = attr.PKeyIndex
	}
	if mask&AttrPort != 0 {
		a.Port = attr.Port
	}
	if mask&AttrQKey != 0 {
		a.QKey = attr.QKey
	}
	if mask&AttrAV != 0 {
		a.AV = attr.AV
	}
	if mask&AttrPathMTU != 0 {
		a.PathMTU = attr.PathMTU
		q.mtu = attr.PathMTU.Bytes()
	}
	if mask&AttrTimeout != 0 {
		a.Timeout = attr.Timeout
		if attr.Timeout == 0 {
			q.rto = 0
		} else {
			q.rto = time.Duration(4096<<attr.Timeout) * time.Nanosecond
		}
	}
	if mask&AttrRetryCnt != 0 {
		a.RetryCnt = attr.RetryCnt
		q.comp.retryCnt = attr.RetryCnt
	}
	if mask&AttrRNRRetry != 0 {
		a.RNRRetry = attr.RNRRetry
		q.comp.rnrRetry = attr.RNRRetry
	}
	if mask&AttrMinRNRTimer != 0 {
		a.MinRNRTimer = attr.MinRNRTimer
	}
	if mask&AttrRQPSN != 0 {
		a.RQPSN = attr.RQPSN
		q.resp.epsn = ib.PSN(attr.RQPSN)
	}
	if mask&AttrSQPSN != 0 {
		a.SQPSN = attr.SQPSN
		q.req.psn = ib.PSN(attr.SQPSN)
		q.req.maxPSN = q.req.psn
		q.comp.psn = q.req.psn
	}
	if mask&AttrMaxQPRdAtomic != 0 {
		a.MaxRdAtomic = attr.MaxRdAtomic
	}
	if mask&AttrMaxDestRdAtomic != 0 {
		a.MaxDestRdAtomic = attr.MaxDestRdAtomic
		q.resp.initResources(int(attr.MaxDestRdAtomic))
	}
	if mask&AttrDestQPN != 0 {
		a.DestQPN = attr.DestQPN
	}
}

func (q *QP) checkValues(attr *QPAttr, mask AttrMask) error {
	if mask&AttrAccessFlags != 0 && attr.AccessFlags&^(accessAll|AccessFlushPersistent) != 0 {
		return &AttrError{AttrAccessFlags, "unknown access flag"}
	}
	if mask&AttrPKeyIndex != 0 && attr.PKeyIndex != 0 {
		return &AttrError{AttrPKeyIndex, "the P_Key table has one entry"}
	}
	if mask&AttrPort != 0 && attr.Port != 1 {
		return &AttrError{AttrPort, "the device has one port (1)"}
	}
	if mask&AttrPathMTU != 0 && (attr.PathMTU < ib.MTU256 || attr.PathMTU > ib.MTU4096) {
		return &AttrError{AttrPathMTU, "must be MTU256..MTU4096"}
	}
	if mask&AttrTimeout != 0 && attr.Timeout > 31 {
		return &AttrError{AttrTimeout, "must be ≤ 31"}
	}
	if mask&AttrRetryCnt != 0 && attr.RetryCnt > 7 {
		return &AttrError{AttrRetryCnt, "must be ≤ 7"}
	}
	if mask&AttrRNRRetry != 0 && attr.RNRRetry > 7 {
		return &AttrError{AttrRNRRetry, "must be ≤ 7"}
	}
	if mask&AttrMinRNRTimer != 0 && attr.MinRNRTimer > 31 {
		return &AttrError{AttrMinRNRTimer, "must be ≤ 31"}
	}
	if mask&AttrRQPSN != 0 && attr.RQPSN > ib.PSNMask {
		return &AttrError{AttrRQPSN, "PSNs are 24 bits"}
	}
	if mask&AttrSQPSN != 0 && attr.SQPSN > ib.PSNMask {
		return &AttrError{AttrSQPSN, "PSNs are 24 bits"}
	}
	if mask&AttrMaxQPRdAtomic != 0 && attr.MaxRdAtomic > MaxRdAtomic {
		return &AttrError{AttrMaxQPRdAtomic, "exceeds the device limit 128"}
	}
	if mask&AttrMaxDestRdAtomic != 0 && attr.MaxDestRdAtomic > MaxRdAtomic {
		return &AttrError{AttrMaxDestRdAtomic, "exceeds the device limit 128"}
	}
	if mask&AttrDestQPN != 0 && attr.DestQPN > ib.PSNMask {
		return &AttrError{AttrDestQPN, "QPNs are 24 bits"}
	}
	if mask&(AttrAltPath|AttrPathMigState) != 0 {
		return &AttrError{mask & (AttrAltPath | AttrPathMigState), "alternate paths are not supported"}
	}
	return nil
}

func (q *QP) setState(s QPState) {
	prev := q.state
	// Under the queues' locks: PostSendConcurrent and PostRecvConcurrent
	// read the state there, so a work request they post is either refused
	// or was posted before, absorbed here, and is sent, flushed or dropped
	// by the reset like any other.
	q.sqMu.Lock()
	q.rq.mu.Lock()
	q.state = s
	if s == StateReset && q.srq == nil {
		q.rq.clear()
		q.rq.release()
	}
	q.rq.mu.Unlock()
	q.absorbPosts()
	if s == StateReset {
		q.sqHead, q.sqTail = 0, 0
		q.sqPosted.Store(0)
		q.sqHeadPub.Store(0)
		// Empty in RESET: the ring goes, under the lock posters read it in.
		q.sq, q.sqStore, q.sqInline = nil, nil, nil
	}
	q.sqMu.Unlock()
	switch s {
	case StateReset:
		q.resetTransport()
		q.e.readyOf(q).remove(q)
		q.releaseQueues()
	case StateErr:
		if prev != StateErr {
			q.flush()
			q.publishHead()
		}
	case StateRTS:
		q.e.schedule(q)
	}
}

// resetTransport returns requester, completer and responder to their initial state.
func (q *QP) resetTransport() {
	q.req = requester{psn: ib.PSN(q.attr.SQPSN), maxPSN: ib.PSN(q.attr.SQPSN)}
	q.comp = completer{psn: ib.PSN(q.attr.SQPSN), retryCnt: q.attr.RetryCnt, rnrRetry: q.attr.RNRRetry}
	q.resp.reset(ib.PSN(q.attr.RQPSN))
	q.resp.initResources(int(q.attr.MaxDestRdAtomic))
	q.failure, q.cause, q.respFault, q.lostWC = nil, WCSuccess, false, false
	if q.cc != nil {
		*q.cc = ccQP{}
	}
	if q.dc != nil {
		q.resetDC()
	}
}

// toError moves the QP to the error state (after a fatal transport error).
func (q *QP) toError() {
	if q.state != StateErr && q.state != StateReset {
		q.raiseFailure()
		q.setState(StateErr)
	}
}

// flush completes every outstanding work request with WR_FLUSH_ERR.
func (q *QP) flush() {
	for q.sqHead != q.sqTail {
		w := q.wqe(q.sqHead)
		q.postSendWC(w, WCWRFlushErr)
		q.sqHead++
	}
	q.req.idx, q.req.off = q.sqTail, 0
	q.comp.armed = false
	q.req.rnrWait = false
	if q.resp.haveRecv {
		q.postRecvWC(&q.resp.cur, WCWRFlushErr, 0)
		q.resp.haveRecv = false
	}
	if q.srq == nil {
		for {
			q.rq.mu.Lock()
			id, ok := q.rq.pop()
			q.rq.mu.Unlock()
			if !ok {
				break
			}
			wc := WorkCompletion{WRID: id, Status: WCWRFlushErr, Opcode: WCRecv, QPN: q.qpn}
			q.pushWC(q.recvCQ, &wc)
		}
	}
	q.resp.clearOutput()
	q.lastWQE()
}

func (q *QP) wqe(i uint32) *sendWQE { return &q.sq[i%uint32(len(q.sq))] }

// allocSQ makes the send queue, on the first post: an idle QP holds none.
func (q *QP) allocSQ() {
	c := &q.cap
	q.sq = make([]sendWQE, c.MaxSendWR)
	q.sqStore = make([]SGE, c.MaxSendWR*c.MaxSendSGE)
	if c.MaxInlineData > 0 {
		q.sqInline = make([]byte, c.MaxSendWR*c.MaxInlineData)
	}
	for i := range q.sq {
		q.sq[i].sge = q.sqStore[i*c.MaxSendSGE : i*c.MaxSendSGE : (i+1)*c.MaxSendSGE]
		if c.MaxInlineData > 0 {
			q.sq[i].inline = q.sqInline[i*c.MaxInlineData : i*c.MaxInlineData : (i+1)*c.MaxInlineData]
		}
	}
}

// SendWR is a send work request (struct ibv_send_wr, one at a time).
type SendWR struct {
	ID             uint64
	Opcode         WROpcode
	Flags          SendFlags
	SGL            []SGE
	Inline         []byte // the payload when Flags has SendInline (copied at post time; SGL ignored)
	Imm            uint32 // for *_WITH_IMM, as it goes on the wire
	InvalidateRKey uint32 // for SEND_WITH_INV and LOCAL_INV
	RemoteAddr     uint64 // RDMA and atomics
	// RKey is the remote key of RDMA and atomics; for BIND_MW the window's
	// new R_Key (ibv_send_wr.bind_mw.rkey), of which only the low 8 bits,
	// the consumer key, are used.
	RKey       uint32
	CompareAdd uint64 // atomics: compare (CmpSwap) or add (FetchAdd)
	Swap       uint64 // CmpSwap
	// BIND_MW: the window and where to bind it (ibv_send_wr.bind_mw)
	MW   MWRef
	Bind MWBindInfo
	// FLUSH (with RemoteAddr and RKey)
	FlushLen       uint32
	FlushPlacement uint8 // 1 = global visibility, 2 = persistence (both may be set)
	FlushLevel     uint8 // 0 = the range RemoteAddr..+FlushLen, 1 = the whole region
	// UD; a DCI's target is AH, RemoteQPN (the DCT number) and DCKey, as
	// mlx5dv_wr_set_dc_addr(ah, remote_dctn, remote_dc_key) names it
	AH         AHRef
	RemoteQPN  uint32
	RemoteQKey uint32
	DCKey      uint64
}

// PostSend posts a send work request. Structural errors (opcode not valid for
// the QP type, too many SGEs, queue full, wrong state) are returned at once;
// memory errors (bad L_Key, range) surface as error completions as in ibverbs.
func (q *QP) PostSend(wr *SendWR) error {
	if q.destroyed {
		return ErrClosed
	}
	switch q.state {
	case StateRTS, StateSQD, StateErr:
	default:
		return ErrInvalidState
	}
	if !q.opAllowed(wr.Opcode) {
		return ErrOpNotSupported
	}
	// The slots from sqTail on are the posters' (PostSendConcurrent).
	q.sqMu.Lock()
	q.absorbPosts()
	if q.sqTail-q.sqHead >= uint32(q.cap.MaxSendWR) {
		q.sqMu.Unlock()
		return ErrQueueFull
	}
	if q.sq == nil {
		q.allocSQ()
	}
	w := q.wqe(q.sqTail)
	if err := q.fillWQE(w, wr, q.mtu); err != nil {
		q.sqMu.Unlock()
		return err
	}
	q.sqTail++
	q.sqPosted.Store(q.sqTail)
	q.sqMu.Unlock()
	if q.state == StateErr {
		// ibverbs: WRs posted in the error state complete with a flush error.
		q.postSendWC(w, WCWRFlushErr)
		q.sqHead++
		q.req.idx = q.sqTail
		q.publishHead()
		return nil
	}
	q.e.schedule(q)
	return nil
}

// errNotSimple: PostSendConcurrent leaves the work request to PostSend.
var errNotSimple = errors.New("qp: not a simple send work request")

// PostSendConcurrent is PostSend for a caller that does not hold the
// engine's serialization: it may run at the same time as any engine
// call. It posts under the send queue's own lock the work
// requests that need nothing but the request and the QP's fixed
// attributes: those of an RC or UC QP in RTS that touch no memory window
// or region at post time, once the QP has its send queue. For any other,
// and when the queue looks full, it reports false having done nothing,
// and the caller posts with PostSend (which knows exactly how full the
// queue is). Errors are those PostSend would return.
func (q *QP) PostSendConcurrent(wr *SendWR) (bool, error) {
	if q.typ == UD || isLocalWR(wr.Opcode) {
		return false, nil
	}
	q.sqMu.Lock()
	if q.destroyed {
		q.sqMu.Unlock()
		return true, ErrClosed
	}
	if q.state != StateRTS || q.dc != nil || q.sq == nil {
		q.sqMu.Unlock()
		return false, nil
	}
	if !q.opAllowed(wr.Opcode) {
		q.sqMu.Unlock()
		return true, ErrOpNotSupported
	}
	tail := q.sqPosted.Load()
	if tail-q.sqHeadPub.Load() >= uint32(q.cap.MaxSendWR) {
		q.sqMu.Unlock()
		return false, nil
	}
	if err := q.fillWQE(q.wqe(tail), wr, 0); err != nil {
		q.sqMu.Unlock()
		if err == errNotSimple {
			return false, nil
		}
		return true, err
	}
	// The WQE is written before it is published: the engine reads it,
	// and the memory the caller wrote before posting, after it absorbs
	// the new tail.
	q.sqPosted.Store(tail + 1)
	q.e.readyOf(q).post(q)
	q.sqMu.Unlock()
	return true, nil
}

// absorbPosts makes the posts PostSendConcurrent published the engine's.
// Under the engine's serialization.
func (q *QP) absorbPosts() { q.sqTail = q.sqPosted.Load() }

// publishHead lets posters reuse the slots the engine has completed: it
// is done with them. Under the engine's serialization.
func (q *QP) publishHead() {
	if q.sqHeadPub.Load() != q.sqHead {
		q.sqHeadPub.Store(q.sqHead)
	}
}

// fillWQE checks wr and writes it into w, a free slot. The checks read
// the request and the QP's fixed attributes; the ones that read engine
// objects (the AH of a UD or DCI send, a BIND_MW) are reached only from
// PostSend. mtu is the path MTU, or 0 for a caller that may not read it
// (the READ bound is then checked against the smallest MTU, and a READ
// past it is left to PostSend with errNotSimple).
func (q *QP) fillWQE(w *sendWQE, wr *SendWR, mtu int) error {
	var length uint64
	inline := wr.Flags&SendInline != 0
	if inline {
		if len(wr.Inline) > q.cap.MaxInlineData {
			return ErrInlineTooLarge
		}
		if wr.Opcode == WRRDMARead || wr.Opcode == WRAtomicCmpAndSwp || wr.Opcode == WRAtomicFetchAndAdd {
			return ErrInvalidArgument
		}
		length = uint64(len(wr.Inline))
	} else {
		if len(wr.SGL) > q.cap.MaxSendSGE {
			return ErrTooManySGE
		}
		for _, s := range wr.SGL {
			length += uint64(s.Length)
		}
	}
	if length > MaxMsgSize {
		return ErrMessageTooLarge
	}
	switch wr.Opcode {
	case WRAtomicCmpAndSwp, WRAtomicFetchAndAdd, WRAtomicWrite:
		if length != 8 {
			return ErrInvalidArgument
		}
	}
	var ah *AH
	if q.typ == UD || q.isDCI() {
		if ah = ahOf(wr.AH); ah == nil || ah.pd != q.pd {
			return ErrInvalidArgument
		}
		if wr.RemoteQPN > ib.PSNMask {
			return ErrInvalidArgument
		}
	}
	if wr.Opcode == WRBindMW {
		if err := q.checkBindWR(wr); err != nil {
			return err
		}
	}
	// A READ must stay well inside half the PSN space.
	if wr.Opcode == WRRDMARead {
		if mtu == 0 {
			if length/uint64(ib.MTU256.Bytes()) >= 1<<22 {
				return errNotSimple
			}
		} else if length/uint64(mtu) >= 1<<22 {
			return ErrMessageTooLarge
		}
	}
	w.id, w.op, w.flags = wr.ID, wr.Opcode, wr.Flags
	w.imm, w.invRKey = wr.Imm, wr.InvalidateRKey
	w.remoteAddr, w.rkey = wr.RemoteAddr, wr.RKey
	w.compareAdd, w.swap = wr.CompareAdd, wr.Swap
	if wr.Opcode == WRFlush {
		// A FLUSH carries no data: its parameters ride in the atomic operands.
		if wr.FlushPlacement == 0 || wr.FlushPlacement > 3 || wr.FlushLevel > 1 || len(wr.SGL) != 0 {
			return ErrInvalidArgument
		}
		w.compareAdd = uint64(wr.FlushLen)
		w.swap = uint64(wr.FlushPlacement) | uint64(wr.FlushLevel)<<4
	}
	w.length = uint32(length)
	w.mw, w.bindMR = nil, nil
	if isLocalWR(wr.Opcode) {
		// A local operation moves no data: its SGL is ignored.
		w.length, length, inline = 0, 0, false
		w.mw, w.bindMR, w.bindLen, w.bindAccess = mwOf(wr.MW), mrOf(wr.Bind.MR), wr.Bind.Length, wr.Bind.Access
		w.remoteAddr = wr.Bind.Addr
	}
	if inline {
		w.inline = append(w.inline[:0], wr.Inline...)
		w.sge = w.sge[:0]
	} else {
		w.sge = append(w.sge[:0], wr.SGL...)
	}
	if q.typ == UD || q.isDCI() {
		w.av, w.remoteQPN, w.qkey, w.dcKey = ah.av, wr.RemoteQPN, wr.RemoteQKey, wr.DCKey
	}
	w.started, w.rdCounted = false, false
	return nil
}

func (q *QP) opAllowed(op WROpcode) bool {
	if q.dc != nil {
		return q.dc.opAllowed(op)
	}
	switch q.typ {
	case RC:
		switch op {
		case WRRDMAWrite, WRRDMAWriteWithImm, WRSend, WRSendWithImm, WRRDMARead,
			WRAtomicCmpAndSwp, WRAtomicFetchAndAdd, WRSendWithInv, WRAtomicWrite, WRFlush,
			WRLocalInv, WRBindMW:
			return true
		}
	case UC:
		switch op {
		case WRRDMAWrite, WRRDMAWriteWithImm, WRSend, WRSendWithImm, WRLocalInv, WRBindMW:
			return true
		}
	case UD:
		switch op {
		case WRSend, WRSendWithImm:
			return true
		}
	}
	return false
}

// PostRecv posts a receive work request.
func (q *QP) PostRecv(wr *RecvWR) error {
	if q.destroyed {
		return ErrClosed
	}
	if q.srq != nil {
		return ErrInvalidArgument
	}
	switch q.state {
	case StateReset:
		return ErrInvalidState
	case StateErr:
		if len(wr.SGL) > q.rq.maxSGE {
			return ErrTooManySGE
		}
		wc := WorkCompletion{WRID: wr.ID, Status: WCWRFlushErr, Opcode: WCRecv, QPN: q.qpn}
		q.pushWC(q.recvCQ, &wc)
		return nil
	}
	q.rq.mu.Lock()
	defer q.rq.mu.Unlock()
	return q.rq.post(wr)
}

// PostRecvConcurrent is PostRecv for a caller that does not hold the
// engine's serialization: it may run at the same time as any engine call.
// It reports false, having done nothing, when the QP is in the error state
// (where a receive completes at once, flushed: the caller posts it with
// PostRecv then) or uses an SRQ.
func (q *QP) PostRecvConcurrent(wr *RecvWR) (bool, error) {
	if q.srq != nil {
		return false, nil
	}
	q.rq.mu.Lock()
	defer q.rq.mu.Unlock()
	if q.destroyed {
		return true, ErrClosed
	}
	switch q.state {
	case StateReset:
		return true, ErrInvalidState
	case StateErr:
		return false, nil
	}
	return true, q.rq.post(wr)
}

// takeRecv takes the next receive WQE from the SRQ or the QP's own queue.
func (q *QP) takeRecv(dst *curRecv) bool {
	if q.srq != nil {
		return q.srq.take(dst)
	}
	q.rq.mu.Lock()
	defer q.rq.mu.Unlock()
	return q.rq.take(dst)
}

// pushWC adds a completion; if the CQ is full the completion is lost and, as
// rxe does on CQ overflow, the QP moves to the error state.
func (q *QP) pushWC(cq *CQ, wc *WorkCompletion) {
	q.noteCause(wc.Status)
	if !cq.push(wc) && q.state != StateErr {
		q.lostWC = true
		q.toError()
	}
}

func wcOpcodeFor(op WROpcode) WCOpcode {
	switch op {
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return WCRDMAWrite
	case WRRDMARead:
		return WCRDMARead
	case WRAtomicCmpAndSwp:
		return WCCompSwap
	case WRAtomicFetchAndAdd:
		return WCFetchAdd
	case WRAtomicWrite:
		return WCAtomicWrite
	case WRFlush:
		return WCFlush
	case WRBindMW:
		return WCBindMW
	case WRLocalInv:
		return WCLocalInv
	}
	return WCSend
}

// postSendWC reports a finished send WQE if it asked for a completion or failed.
func (q *QP) postSendWC(w *sendWQE, st WCStatus) {
	if w.rdCounted {
		w.rdCounted = false
		q.req.rdOutstanding--
		if w.op == WRRDMARead {
			q.req.readsOut--
		}
	}
	if st == WCSuccess && !q.sigAll && w.flags&SendSignaled == 0 {
		return
	}
	wc := WorkCompletion{WRID: w.id, Status: st, Opcode: wcOpcodeFor(w.op), ByteLen: w.length, QPN: q.qpn}
	if w.op == WRSendWithImm || w.op == WRRDMAWriteWithImm {
		wc.Flags |= WCWithImm
	}
	q.pushWC(q.sendCQ, &wc)
}

func (q *QP) postRecvWC(c *curRecv, st WCStatus, n uint32) {
	wc := WorkCompletion{WRID: c.id, Status: st, Opcode: WCRecv, ByteLen: n, QPN: q.qpn}
	q.pushWC(q.recvCQ, &wc)
}

const (
	idle = iota
	produced
	shortBuffer
)

// produce writes the next packet of this QP into t.
func (q *QP) produce(now time.Duration, t *TxPacket) int {
	if q.destroyed {
		return idle
	}
	if q.dc != nil {
		return q.produceDC(now, t)
	}
	if !q.ccApplies() {
		return q.produceBody(now, t)
	}
	if q.cc != nil && q.cc.cnpPending && q.produceCNP(t) { // the call only with a CNP to send
		return produced
	}
	r := q.produceBody(now, t)
	if r == produced {
		markECT(t)
	}
	return r
}

// produceBody is produce for every QP; DC QPs reach it through produceDC.
func (q *QP) produceBody(now time.Duration, t *TxPacket) int {
	buf := t.Buf
	if t.Headroom < 0 || t.Headroom > len(buf) {
		q.e.stats.ShortTxBuffer++
		return shortBuffer
	}
	buf = buf[t.Headroom:]
	need := q.mtu
	if q.typ == UD {
		need = q.e.portMTU.Bytes()
	}
	if len(buf) < need+maxHeaderLen+ib.ICRCSize {
		q.e.stats.ShortTxBuffer++
		return shortBuffer
	}
	// A queued single-packet response (ACK, NAK, atomic or empty READ
	// response) leaves before any request, as rxe's responder sends it when
	// it handles the packet: the peer must see its message acknowledged
	// before anything the application posted after seeing the completion
	// (a reply overtaking the ACK shows the peer the reply first). Only a
	// multi-packet READ response stream alternates with this QP's requests,
	// so that neither holds the other up; with SetReplyBeforeAck every
	// response does, the request first.
	if q.replyFirst && q.reqTurn {
		if n, ok := q.request(now, buf, t); ok {
			t.Len = n
			// A response passed over has the next turn.
			q.reqTurn = q.resp.outLen == 0
			return produced
		}
	} else if q.reqTurn && !q.resp.singleAtHead() {
		if n, ok := q.request(now, buf, t); ok {
			t.Len = n
			q.reqTurn = false
			return produced
		}
	}
	// The congestion control calls only with it on: every packet passes here.
	if q.e.cc.on && q.ccHoldsResponse(now) {
		// A READ response stream waits for the QP's rate (ccrate.go).
	} else if n, ok := q.resp.produce(q, buf, t); ok {
		t.Len = n
		q.reqTurn = true
		if q.e.cc.on {
			q.ccChargeResponse(now, buf, n)
		}
		return produced
	}
	if n, ok := q.request(now, buf, t); ok {
		t.Len = n
		q.reqTurn = false
		return produced
	}
	return idle
}

// SetReplyBeforeAck lets the QP's requests leave before its queued ACKs
// (and other single-packet responses), turn about with them, instead of
// after them. For a consumer whose peers do not need to see a message
// acknowledged before the reply to it (rsockets): the ACK and the reply
// of a request/response exchange leave in one transmit pass, and the
// reply, sent first, reaches the peer one frame sooner.
func (q *QP) SetReplyBeforeAck(on bool) {
	q.replyFirst = on
	q.reqTurn = on
}

func (q *QP) mayHaveWork() bool {
	if q.dc != nil && q.dc.hasControl(q) {
		return true
	}
	return q.resp.outLen > 0 || q.req.idx != q.sqTail || q.req.needRetry || q.cc != nil && q.cc.cnpPending
}

func (q *QP) fillAV(t *TxPacket, av *AddressVector) {
	t.AV = *av
	if t.AV.SrcPort == 0 {
		t.AV.SrcPort = q.sport
	}
	t.SrcQPN = q.qpn
}

// armRTO (re)starts the retransmit timer.
func (q *QP) armRTO(now time.Duration) {
	q.comp.armed = true
	q.comp.lateOnce = false
	q.comp.deadline = now + q.rto
	q.watchTimers(q.comp.deadline)
}

// watchTimers puts the QP in the engine's timer heap, keyed no later than
// at, and notes the timer just armed to expire at at (Engine.TakeArmed).
func (q *QP) watchTimers(at time.Duration) {
	e := q.e
	if !e.armedOK || at < e.armed {
		e.armed, e.armedOK = at, true
	}
	if !q.timerIn || at < q.timerKey { // else keyed early enough (timers.go)
		e.timers.arm(q, at)
	}
}

// deadline returns the QP's earliest timer.
func (q *QP) deadline() (time.Duration, bool) {
	var d time.Duration
	ok := false
	if q.comp.armed {
		d, ok = q.comp.deadline, true
	}
	if q.req.rnrWait && (!ok || q.req.rnrUntil < d) {
		d, ok = q.req.rnrUntil, true
	}
	if q.comp.win.probeArmed && (!ok || q.comp.win.probeAt < d) {
		d, ok = q.comp.win.probeAt, true
	}
	if q.dc != nil && q.dc.lingerArmed && (!ok || q.dc.lingerAt < d) {
		d, ok = q.dc.lingerAt, true
	}
	return q.ccDeadline(d, ok)
}

// advance runs the QP's timers due at now.
func (q *QP) advance(now time.Duration) {
	if q.req.rnrWait && now >= q.req.rnrUntil {
		q.req.rnrWait = false
		q.e.schedule(q)
	}
	if q.comp.armed && now >= q.comp.deadline {
		// A retransmit timer run an eighth of its timeout late was held
		// up by this process, not by the path: what the peer sent in the
		// meantime may be waiting to be read. It gets that long again,
		// once, so that a stalled process does not take its own delay
		// for a lost ACK (a go-back-N from a window of one).
		if grace := q.rto / 8; now-q.comp.deadline > grace && !q.comp.lateOnce {
			q.comp.lateOnce = true
			q.comp.deadline = now + grace
			q.watchTimers(q.comp.deadline)
		} else {
			q.comp.armed = false
			q.timeout(now)
		}
	}
	if q.comp.win.probeArmed && now >= q.comp.win.probeAt {
		q.probe(now)
	}
	if q.dc != nil {
		q.advanceDC(now)
	}
	q.ccAdvance(now)
}

// pad returns the pad length for a payload of n bytes.
func pad(n int) int { return (-n) & 3 }

// releaseQueues drops the work request rings and the responder resources
// of a QP back in RESET, where they are all empty; the next use makes them
// again. A QP cycled through RESET for reuse holds no more than a new one.
func (q *QP) releaseQueues() {
	// The send and receive queues were released by setState, under their
	// locks.
	q.resp.cur.sge = nil
	q.resp.release()
}
