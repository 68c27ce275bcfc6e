package qp

import (
	"strconv"

	"github.com/goroce/goroce/ib"
)

// Memory windows (IBTA 10.6.7, rxe_mw.c): a window grants remote access to
// a range of a memory region under its own R_Key, and can be moved, shrunk
// or revoked without touching the region.
//
// Type 1 windows are bound with QP.BindMW (ibv_bind_mw) and stay valid
// until they are rebound or deallocated; they cannot be invalidated. Type 2
// windows (2B in the IBTA's terms) are bound by a BIND_MW work request,
// only from the FREE state, and are then usable by the binding QP alone;
// LOCAL_INV or an incoming SEND_WITH_INV returns them to FREE. A window's
// R_Key keeps the index of its key-table slot and takes its low 8 bits,
// the consumer key, from each bind.
//
// The responder resolves an R_Key to an MR or a window. A window is checked
// as rxe_lookup_mw does (key, PD, binding QP for type 2, valid state,
// non-zero length, access) and the access must lie within the window's
// range; rxe checks only the region's range there, this engine the
// window's, which the bind placed inside the region.

// MWType is a memory window type (ibv_mw_type).
type MWType uint8

// Memory window types.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

func (t MWType) String() string {
	switch t {
	case MWType1:
		return "MW_TYPE_1"
	case MWType2:
		return "MW_TYPE_2"
	}
	return "MWType(" + strconv.Itoa(int(t)) + ")"
}

// Window states (rxe_mw_state).
const (
	mwInvalid = iota // deallocated
	mwFree           // type 2, not bound
	mwValid          // type 1 (bound or not), or type 2 bound
)

// MW is a memory window (ibv_mw).
type MW struct {
	pd      *PD
	typ     MWType
	rkey    uint32 // current R_Key
	postKey uint32 // type 1: the R_Key the last BindMW call handed out
	state   uint8
	mr      *MR // bound region; nil when the length is 0
	addr    uint64
	length  uint64
	access  Access
	qp      *QP // type 2: the QP the window is bound to
}

// MWBindInfo says what a window is bound to (struct ibv_mw_bind_info):
// Length bytes at Addr of MR, with the given remote access rights. A zero
// Length unbinds a type 1 window (MR may then be nil).
type MWBindInfo struct {
	MR     MRRef
	Addr   uint64
	Length uint64
	Access Access
}

// MWBind is a type 1 bind request (struct ibv_mw_bind).
type MWBind struct {
	ID    uint64
	Flags SendFlags
	Info  MWBindInfo
}

// AllocMW allocates a memory window (ibv_alloc_mw). A type 1 window starts
// valid but bound to nothing; a type 2 window starts free.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if pd.closed {
		return nil, ErrClosed
	}
	if typ != MWType1 && typ != MWType2 {
		return nil, ErrInvalidArgument
	}
	mw := &MW{pd: pd, typ: typ, state: mwValid}
	if typ == MWType2 {
		mw.state = mwFree
	}
	key, ok := pd.e.keys.allocMW(mw)
	if !ok {
		return nil, ErrNoResources
	}
	mw.rkey, mw.postKey = key, key
	pd.refs++
	return mw, nil
}

// RKey returns the window's current R_Key: a bind changes its low 8 bits
// when the bind executes.
func (mw *MW) RKey() uint32 { return mw.rkey }

// Type returns the window type.
func (mw *MW) Type() MWType { return mw.typ }

// Bound reports whether the window currently grants access: valid and bound
// to a non-empty range.
func (mw *MW) Bound() bool { return mw.state == mwValid && mw.length > 0 }

// Range returns the bound range (zero when unbound).
func (mw *MW) Range() (addr, length uint64) { return mw.addr, mw.length }

// Dealloc deallocates the window (ibv_dealloc_mw): its R_Key is never
// honoured again and its region may be deregistered.
func (mw *MW) Dealloc() error {
	if mw.pd == nil {
		return ErrClosed
	}
	mw.unbind()
	mw.state = mwInvalid
	mw.pd.e.keys.release(mw.rkey)
	mw.pd.refs--
	mw.pd = nil
	return nil
}

// unbind drops the window's region and QP.
func (mw *MW) unbind() {
	if mw.mr != nil {
		mw.mr.nmw--
		mw.mr = nil
	}
	mw.qp = nil
	mw.addr, mw.length, mw.access = 0, 0, 0
}

// incRKey is ibv_inc_rkey: the next consumer key, the index unchanged.
func incRKey(k uint32) uint32 { return k&^0xFF | (k+1)&0xFF }

// BindMW binds a type 1 window (ibv_bind_mw): it posts a BIND_MW work
// request whose new R_Key is the window's last one with the consumer key
// incremented, and returns that key. The bind takes effect, and MW.RKey
// changes, when the send queue reaches it; its completion is WCBindMW.
func (q *QP) BindMW(mw *MW, b *MWBind) (uint32, error) {
	if mw == nil || b == nil || mw.typ != MWType1 {
		return 0, ErrInvalidArgument
	}
	if mw.pd == nil {
		return 0, ErrClosed
	}
	if mr := mrOf(b.Info.MR); mr != nil && mr.pd != mw.pd {
		return 0, ErrWrongPD
	}
	key := incRKey(mw.postKey)
	wr := SendWR{ID: b.ID, Opcode: WRBindMW, Flags: b.Flags, MW: mw, Bind: b.Info, RKey: key}
	if err := q.PostSend(&wr); err != nil {
		return 0, err
	}
	mw.postKey = key
	return key, nil
}

// checkBindWR refuses at post time what ibv_bind_mw and ibv_post_send
// refuse before the bind reaches the device.
func (q *QP) checkBindWR(wr *SendWR) error {
	mw, mr := mwOf(wr.MW), mrOf(wr.Bind.MR)
	if mw == nil || mw.pd == nil || mw.pd.e != q.e {
		return ErrInvalidArgument
	}
	if mr == nil && (wr.Bind.Addr != 0 || wr.Bind.Length != 0) {
		return ErrInvalidArgument
	}
	if mr != nil && (mr.pd == nil || mr.pd.e != q.e) {
		return ErrInvalidArgument
	}
	return nil
}

// windowAccess is what a window may grant.
const windowAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessFlushGlobal | AccessLocalWrite

// bind executes a BIND_MW work request: rxe_check_bind_mw's checks, then
// rxe_do_bind_mw. It reports whether the bind was made; a refused bind
// completes with WCMWBindErr.
func (q *QP) bind(w *sendWQE) bool {
	mw, mr := w.mw, w.bindMR
	if mw == nil || mw.pd == nil || mw.state == mwInvalid {
		return false
	}
	if w.bindLen == 0 {
		mr = nil
	} else if mr == nil || mr.pd == nil || !mr.valid {
		return false
	}
	if w.bindAccess&^windowAccess != 0 {
		return false
	}
	switch mw.typ {
	case MWType1:
		if mw.state != mwValid {
			return false
		}
	case MWType2:
		// o10-37.2.30: only a free window is bound; C10-72: by a QP of
		// its PD; o10-37.2.40: never to nothing.
		if mw.state != mwFree || q.pd != mw.pd || mr == nil {
			return false
		}
	}
	if mr != nil {
		// C10-73: the region allows binding; C10-74: a window that can
		// be written needs a region the owner may write.
		if mr.pd != mw.pd || mr.access&AccessMWBind == 0 {
			return false
		}
		if w.bindAccess&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && mr.access&AccessLocalWrite == 0 {
			return false
		}
		// C10-75: the window lies inside the region.
		a := w.remoteAddr
		if a < mr.iova || a-mr.iova > uint64(len(mr.buf)) || w.bindLen > uint64(len(mr.buf))-(a-mr.iova) {
			return false
		}
	}
	mw.unbind()
	mw.rkey = mw.rkey&^0xFF | w.rkey&0xFF
	mw.access = w.bindAccess
	mw.state = mwValid
	mw.addr, mw.length = w.remoteAddr, w.bindLen
	if mr != nil {
		mw.mr = mr
		mr.nmw++
	}
	if mw.typ == MWType2 {
		mw.qp = q
	}
	return true
}

// invalidate carries out a LOCAL_INV or a received SEND_WITH_INV for key:
// a type 2 window bound through this QP returns to FREE (a type 1 window
// cannot be invalidated, o10-37.2.26); an MR of this QP's PD with no window
// bound to it is invalidated. It reports success.
func (q *QP) invalidate(key uint32) bool {
	if mw := q.e.keys.lookupMW(key); mw != nil {
		if mw.typ != MWType2 || mw.state != mwValid || mw.pd != q.pd || mw.qp != q {
			return false
		}
		mw.unbind()
		mw.state = mwFree
		return true
	}
	mr := q.e.keys.lookup(key)
	if mr == nil || mr.pd != q.pd || mr.nmw > 0 {
		return false
	}
	mr.valid = false
	return true
}

// isLocalWR reports a work request the requester carries out itself,
// sending nothing.
func isLocalWR(op WROpcode) bool { return op == WRBindMW || op == WRLocalInv }

// executeLocal carries out the local work request w at the requester
// position. It completes in order: at once if every earlier WQE has
// completed, otherwise when the completer reaches it (completeLocal).
// A failure completes it with its error and moves the QP to the error
// state, as rxe_do_local_ops does.
func (q *QP) executeLocal(w *sendWQE) {
	ok, st := false, WCMWBindErr
	if w.op == WRBindMW {
		ok = q.bind(w)
	} else {
		ok, st = q.invalidate(w.invRKey), WCLocQPOpErr
	}
	if !ok {
		q.failWQE(st)
		return
	}
	w.started = true
	q.req.idx++
	q.req.off = 0
	q.completeLocal()
}

// completeLocal completes executed local WQEs that have reached the head
// of the send queue.
func (q *QP) completeLocal() {
	// The requester may be behind the head (an ACK covering a WQE it is
	// to resend): the slot at the tail is then no WQE, and may be a
	// concurrent poster's (PostSendConcurrent).
	for q.sqHead != q.req.idx && q.sqHead != q.sqTail {
		w := q.wqe(q.sqHead)
		if !isLocalWR(w.op) || !w.started {
			return
		}
		q.postSendWC(w, WCSuccess)
		q.sqHead++
	}
}

// rkeyTarget resolves an R_Key for a remote access needing need: an MR's
// key grants its whole region, a window's key the window's range of its
// region. ok is false for any key the responder must refuse.
func (q *QP) rkeyTarget(key uint32, need Access) (mr *MR, lo, size uint64, ok bool) {
	k := &q.e.keys
	idx := key >> 8
	if int(idx) >= len(k.mrs) {
		return nil, 0, 0, false
	}
	if mr = k.mrs[idx]; mr != nil {
		if mr.key != key || !mr.valid || mr.pd != q.pd || mr.access&need != need {
			return nil, 0, 0, false
		}
		return mr, mr.iova, uint64(len(mr.buf)), true
	}
	mw := k.mws[idx]
	if mw == nil || mw.rkey != key || mw.state != mwValid || mw.pd != q.pd || mw.length == 0 ||
		mw.access&need != need || (mw.typ == MWType2 && mw.qp != q) {
		return nil, 0, 0, false
	}
	if mr = mw.mr; mr == nil || !mr.valid {
		return nil, 0, 0, false
	}
	return mr, mw.addr, mw.length, true
}

// remoteSpan returns the n bytes at va that key grants with access need,
// or false if the key does not resolve or any byte lies outside what it
// grants. Overflow-safe for any va and n.
func (q *QP) remoteSpan(key uint32, need Access, va uint64, n uint32) ([]byte, bool) {
	mr, lo, size, ok := q.rkeyTarget(key, need)
	if !ok || va < lo || va-lo > size || uint64(n) > size-(va-lo) {
		return nil, false
	}
	return mr.span(va, n)
}

// rkeyViolation answers a request whose R_Key, access or range check failed
// with a remote access error NAK (rxe RESPST_ERR_RKEY_VIOLATION), counted.
func (q *QP) rkeyViolation(psn ib.PSN) error {
	q.e.stats.RKeyViolations++
	return q.classAC(psn, ib.NAKRemoteAccessError, WCRemAccessErr)
}
