package roce

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
)

// PD is a protection domain (ibv_pd).
type PD struct {
	d  *Device
	pd *qp.PD
}

// AllocPD creates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	pd, err := d.eng.AllocPD()
	if err != nil {
		return nil, err
	}
	d.res.PD++
	return &PD{d: d, pd: pd}, nil
}

// Close destroys the PD; it fails (qp.ErrBusy) while objects still use it.
func (pd *PD) Close() error {
	if err := pd.d.lock(); err != nil {
		return err
	}
	defer pd.d.mu.Unlock()
	return pd.d.res.released(&pd.d.res.PD, pd.pd.Close())
}

// Device returns the device the PD belongs to.
func (pd *PD) Device() *Device { return pd.d }

// MR is a memory region registered over caller memory (ibv_mr). The device
// reads and writes the memory directly: local and remote operations on it
// are zero-copy from the caller's point of view, and the caller must not
// touch bytes that an outstanding operation targets.
type MR struct {
	mrRef // stands for mr in a work request (MWBindInfo.MR)
	d     *Device
	mr    *qp.MR
	buf   []byte
	key   uint32
	addr  uint64
}

// RegisterMR registers buf (ibv_reg_mr). Its address on the wire (RETH VA,
// SGE Addr) is the memory's virtual address, as in ibverbs; Addr returns it.
// Remote write or atomic access requires AccessLocalWrite.
func (pd *PD) RegisterMR(buf []byte, access Access) (*MR, error) {
	var iova uint64
	if len(buf) > 0 {
		iova = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	}
	return pd.RegisterMRAt(buf, iova, access)
}

// RegisterMRAt registers buf with an explicit I/O virtual address (e.g. 0,
// or offsets a protocol agreed on).
func (pd *PD) RegisterMRAt(buf []byte, iova uint64, access Access) (*MR, error) {
	if err := pd.d.lock(); err != nil {
		return nil, err
	}
	defer pd.d.mu.Unlock()
	mr, err := pd.pd.RegMR(buf, iova, access)
	if err != nil {
		return nil, fmt.Errorf("roce: register MR of %d bytes: %w", len(buf), err)
	}
	pd.d.res.MR++
	return &MR{mrRef: qp.NewRef(mr), d: pd.d, mr: mr, buf: buf, key: mr.LKey(), addr: iova}, nil
}

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.key }

// RKey returns the remote key (equal to the local key, as in rxe).
func (mr *MR) RKey() uint32 { return mr.key }

// Addr returns the region's address on the wire.
func (mr *MR) Addr() uint64 { return mr.addr }

// Len returns the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// Bytes returns the registered memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// SGE returns a scatter/gather element for n bytes at offset off.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.addr + uint64(off), Length: uint32(n), LKey: mr.key}
}

// Sync orders the caller after every access the device has made to the
// region so far, and the device's later accesses after the caller's earlier
// ones (it takes and releases the device lock). Go's memory model needs this
// edge where nothing else provides it: before reading bytes a remote WRITE or
// atomic changed when no local completion reported it (polling on a flag
// byte), and after writing bytes a remote READ will fetch. A completion taken
// from a CQ of the same device already provides it.
func (mr *MR) Sync() {
	mr.d.mu.Lock()
	//lint:ignore SA2001 the critical section is the point: it is a memory barrier.
	mr.d.mu.Unlock()
}

// Close deregisters the region (ibv_dereg_mr): its keys are never honoured
// again. It fails (qp.ErrBusy) while memory windows are bound to it.
func (mr *MR) Close() error {
	if err := mr.d.lock(); err != nil {
		return err
	}
	defer mr.d.mu.Unlock()
	return mr.d.res.released(&mr.d.res.MR, mr.mr.Dereg())
}

// MW is a memory window (ibv_mw): remote access to a range of a region
// under its own R_Key, which a bind moves and an invalidation or Close
// revokes without touching the region.
type MW struct {
	mwRef // stands for mw in a work request (SendWR.MW)
	d     *Device
	mw    *qp.MW
}

// AllocMW allocates a memory window (ibv_alloc_mw). A type 1 window starts
// valid and bound to nothing, a type 2 window free.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if err := pd.d.lock(); err != nil {
		return nil, err
	}
	defer pd.d.mu.Unlock()
	mw, err := pd.pd.AllocMW(typ)
	if err != nil {
		return nil, fmt.Errorf("roce: allocate %v window: %w", typ, err)
	}
	pd.d.res.MW++
	return &MW{mwRef: qp.NewRef(mw), d: pd.d, mw: mw}, nil
}

// RKey returns the window's current R_Key; a bind changes its low 8 bits
// (the consumer key) when the send queue reaches the bind.
func (mw *MW) RKey() uint32 {
	mw.d.mu.Lock()
	defer mw.d.mu.Unlock()
	return mw.mw.RKey()
}

// Type returns the window type.
func (mw *MW) Type() MWType { return mw.mw.Type() }

// Bound reports whether the window grants access now: valid and bound to a
// non-empty range.
func (mw *MW) Bound() bool {
	mw.d.mu.Lock()
	defer mw.d.mu.Unlock()
	return mw.mw.Bound()
}

// Close deallocates the window (ibv_dealloc_mw): its R_Key is never
// honoured again and its region may be deregistered.
func (mw *MW) Close() error {
	if err := mw.d.lock(); err != nil {
		return err
	}
	defer mw.d.mu.Unlock()
	return mw.d.res.released(&mw.d.res.MW, mw.mw.Dealloc())
}

// CQ is a completion queue (ibv_cq). Completions are added by the device's
// goroutines; Poll takes them, Wait blocks until there are some.
//
// Every method is safe for concurrent use, and any number of goroutines may
// Poll and Wait at once: each added completion wakes at most one parked
// waiter (the longest waiting), so waiters never stampede, and a waiter that
// finds its completion taken by another goroutine parks again. A waiter is
// told that completions exist, not given them: after Wait returns nil, Poll,
// and Wait again if Poll returns 0. When several goroutines each need their
// own connection's completions, give each connection its own CQ (or one
// goroutine that polls and dispatches).
type CQ struct {
	d     *Device
	cq    *qp.CQ
	ready chan struct{}
	avail atomic.Int64
	// waiters parks goroutines in Wait; spinning admits one spinner.
	waiters  waitQueue
	spinning atomic.Bool
	closed   atomic.Bool
	// ackWithReply is Options.AckWithReply for the waiters of this CQ
	// (SetAckWithReply).
	ackWithReply atomic.Bool
}

// CreateCQ creates a completion queue with room for cqe entries.
func (d *Device) CreateCQ(cqe int) (*CQ, error) {
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	c, err := d.eng.CreateCQ(cqe)
	if err != nil {
		return nil, fmt.Errorf("roce: create CQ of %d entries: %w", cqe, err)
	}
	d.res.CQ++
	cq := &CQ{d: d, cq: c, ready: make(chan struct{}, 1)}
	c.SetContext(cq)
	// Runs under d.mu on the completion path: must not block or allocate.
	// avail is raised before the waiter queue is looked at, and a waiter
	// queues itself before it looks at avail, so one of the two sees the
	// other: no wake-up is lost.
	c.Notify = func() {
		cq.avail.Add(1)
		cq.waiters.wakeOne()
		select {
		case cq.ready <- struct{}{}:
		default:
		}
	}
	return cq, nil
}

// Poll moves up to len(wc) completions into wc, oldest first, and returns how
// many (ibv_poll_cq). It never blocks.
func (cq *CQ) Poll(wc []WorkCompletion) int {
	d := cq.d
	if cq.avail.Load() <= 0 {
		// Run to completion: read the link, if nobody else does.
		d.pollOnce(cq)
		if cq.avail.Load() <= 0 {
			return 0
		}
	}
	// The CQ's own lock, not the device's: a consumer polling does not
	// wait for a receive batch or a post of another QP (qp.CQ).
	n := cq.cq.Poll(wc)
	cq.avail.Add(int64(-n))
	if n > 0 {
		d.polled.Add(1)
	}
	for i := range wc[:n] {
		switch wc[i].Status {
		case qp.WCRetryExcErr:
			d.ctr.retryExc.Add(1)
		case qp.WCRNRRetryExcErr:
			d.ctr.rnrExc.Add(1)
		}
	}
	return n
}

// SetAckWithReply gives this CQ's waiters Options.AckWithReply whatever
// the device's option says: the ACK of a message whose completion ends a
// wait on this CQ leaves with what the waiter posts next (at most 20 µs
// later). For a consumer whose peers handle a reply's completion before
// that of their request as well as after it, such as rsockets, whose
// completions only move independent counters.
func (cq *CQ) SetAckWithReply(on bool) { cq.ackWithReply.Store(on) }

// Len returns the number of completions waiting.
func (cq *CQ) Len() int { return int(cq.avail.Load()) }

// Ready returns a channel that receives a value after completions were added
// (for select loops over several CQs). One value may stand for many
// completions, and a value may be stale: after a receive, Poll until it
// returns 0. Ready may be used alongside Wait and from several goroutines,
// but a value goes to one receiver only: a goroutine that receives it must
// Poll the CQ empty (taking the completions of others with it), so Ready
// suits one dispatching goroutine per CQ; goroutines that each wait for
// their own turn use Wait.
func (cq *CQ) Ready() <-chan struct{} { return cq.ready }

// Wait blocks until the CQ holds a completion, ctx ends (its error is
// returned), the CQ or the device closes (ErrClosed). The first goroutine to
// wait polls for CQSpin before it parks, which keeps latency low for
// ping-pong traffic; others park at once. Wait allocates nothing.
func (cq *CQ) Wait(ctx context.Context) error {
	return cq.wait(ctx, time.Time{})
}

// WaitDeadline is Wait bounded by an absolute deadline instead of a context
// (os.ErrDeadlineExceeded when it passes; a zero deadline waits forever). It
// suits net.Conn-style SetReadDeadline code: no context per call, and no
// allocation.
func (cq *CQ) WaitDeadline(deadline time.Time) error {
	return cq.wait(context.Background(), deadline)
}

// WaitUntil is Wait bounded by ctx and by an absolute deadline, whichever
// ends first (ctx's error, or os.ErrDeadlineExceeded when the deadline
// passes; a zero deadline is none). A waiter that must look at something
// else now and then uses it to wake without a context per wait: it
// allocates nothing.
func (cq *CQ) WaitUntil(ctx context.Context, deadline time.Time) error {
	return cq.wait(ctx, deadline)
}

// wait waits for progress on the CQ, bounded by ctx and deadline (either
// may be unbounded): the single waiting path of the CQ (see Device.park).
func (cq *CQ) wait(ctx context.Context, deadline time.Time) error {
	if cq.avail.Load() > 0 {
		return nil
	}
	if cq.closed.Load() || cq.d.closed.Load() {
		return ErrClosed
	}
	cq.d.flushDeferred()
	start := int64(-1)
	if d := cq.d; d.rxPoll != nil {
		start = d.nowNs()
		if d.busyPoll(cq, ctx, deadline) {
			return nil
		}
	} else if spin := d.busyPollWindow; spin > 0 && cq.spinning.CompareAndSwap(false, true) {
		// Spinning pays off for one latency-bound waiter; a second
		// spinner on two CPUs would only steal the cycles the device
		// needs.
		ok := cq.spin(spin)
		cq.spinning.Store(false)
		if ok {
			return nil
		}
	}
	w := getWaiter()
	defer putWaiter(w)
	for {
		cq.waiters.enqueue(w)
		if cq.avail.Load() > 0 || cq.closed.Load() {
			cq.waiters.remove(w)
		} else if err := cq.d.park(ctx, w, deadline); err != nil {
			cq.waiters.remove(w)
			// A completion that arrived meanwhile wins over the
			// error, so a wake-up meant for this waiter is not lost.
			if cq.avail.Load() > 0 {
				return nil
			}
			if err == errRepark {
				continue
			}
			return err
		}
		if cq.avail.Load() > 0 {
			if start >= 0 {
				cq.d.parkedFor(start)
			}
			return nil
		}
		if cq.closed.Load() {
			return ErrClosed
		}
		// Another goroutine polled the completion first: park again.
	}
}

func (cq *CQ) spin(spin time.Duration) bool {
	deadline := time.Now().Add(spin)
	for i := 0; ; i++ {
		if cq.avail.Load() > 0 {
			return true
		}
		if i&15 == 15 {
			if time.Now().After(deadline) {
				return false
			}
			runtime.Gosched()
		}
	}
}

// Serve runs a completion loop: it waits for completions and hands them to
// fn in batches of up to len(batch) (a caller-owned buffer, reused for every
// call, so the loop does not allocate) until ctx ends or the device closes,
// and returns why it stopped. fn runs on the calling goroutine.
func (cq *CQ) Serve(ctx context.Context, batch []WorkCompletion, fn func([]WorkCompletion)) error {
	if len(batch) == 0 {
		return fmt.Errorf("roce: Serve needs a non-empty batch buffer: %w", qp.ErrInvalidArgument)
	}
	for {
		if n := cq.Poll(batch); n > 0 {
			fn(batch[:n])
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			return err
		}
	}
}

// Overflows returns how many completions were lost because the CQ was full.
func (cq *CQ) Overflows() uint64 {
	cq.d.mu.Lock()
	defer cq.d.mu.Unlock()
	return cq.cq.Overflows()
}

// Close destroys the CQ; it fails (qp.ErrBusy) while a QP uses it.
func (cq *CQ) Close() error {
	if err := cq.d.lock(); err != nil {
		return err
	}
	defer cq.d.mu.Unlock()
	if err := cq.d.res.released(&cq.d.res.CQ, cq.cq.Close()); err != nil {
		return err
	}
	cq.closed.Store(true)
	cq.waiters.wakeAll()
	return nil
}

// SRQ is a shared receive queue (ibv_srq).
type SRQ struct {
	d     *Device
	srq   *qp.SRQ
	limit chan struct{} // one value when the armed limit is reached
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(attr SRQAttr) (*SRQ, error) {
	if err := pd.d.lock(); err != nil {
		return nil, err
	}
	defer pd.d.mu.Unlock()
	s, err := pd.pd.CreateSRQ(attr)
	if err != nil {
		return nil, devErr(err)
	}
	pd.d.res.SRQ++
	rs := &SRQ{d: pd.d, srq: s, limit: make(chan struct{}, 1)}
	s.SetContext(rs)
	return rs, nil
}

// PostRecv posts a receive work request.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if err := s.d.lock(); err != nil {
		return err
	}
	err := s.srq.PostRecv(wr)
	s.d.mu.Unlock()
	return devErr(err)
}

// PostRecvBatch posts several receive work requests under one lock. It
// returns how many were posted; on error wrs[n] failed.
func (s *SRQ) PostRecvBatch(wrs []RecvWR) (int, error) {
	if err := s.d.lock(); err != nil {
		return 0, err
	}
	defer s.d.mu.Unlock()
	for i := range wrs {
		if err := s.srq.PostRecv(&wrs[i]); err != nil {
			return i, devErr(err)
		}
	}
	return len(wrs), nil
}

// Len returns the number of posted receives not yet taken.
func (s *SRQ) Len() int {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.srq.Len()
}

// ArmLimit arms the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a
// receive is taken and fewer than n remain posted, EventSRQLimitReached is
// raised once (to subscribers and on LimitReached) and the limit disarms,
// as in the verbs specification; re-arm it after reposting. n = 0 disarms;
// n larger than the SRQ is qp.ErrInvalidArgument.
func (s *SRQ) ArmLimit(n int) error {
	if err := s.d.lock(); err != nil {
		return err
	}
	defer s.d.mu.Unlock()
	if err := s.srq.ArmLimit(n); err != nil {
		return fmt.Errorf("roce: SRQ limit %d: %w", n, err)
	}
	return nil
}

// Limit returns the armed limit (0 when disarmed or after it fired).
func (s *SRQ) Limit() int {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.srq.Limit()
}

// LimitReached returns a channel that receives a value when the armed limit
// is reached (one value may stand for several firings if nobody received).
func (s *SRQ) LimitReached() <-chan struct{} { return s.limit }

// Close destroys the SRQ.
func (s *SRQ) Close() error {
	if err := s.d.lock(); err != nil {
		return err
	}
	defer s.d.mu.Unlock()
	return s.d.res.released(&s.d.res.SRQ, s.srq.Close())
}

// AH is an address handle for UD sends (ibv_ah): a resolved destination.
type AH struct {
	ahRef // stands for ah in a work request (SendWR.AH)
	d     *Device
	ah    *qp.AH
	av    AddressVector
}

// CreateAH resolves av.DGID's MAC address (waiting at most until ctx ends)
// and creates an address handle. A zero av.SGID is filled with the device's
// address of the same family.
func (pd *PD) CreateAH(ctx context.Context, av AddressVector) (*AH, error) {
	d := pd.d
	if err := d.prepareAV(ctx, &av); err != nil {
		return nil, err
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	ah, err := pd.pd.CreateAH(av)
	if err != nil {
		return nil, devErr(err)
	}
	d.res.AH++
	return &AH{ahRef: qp.NewRef(ah), d: d, ah: ah, av: av}, nil
}

// AV returns the address vector, with the SGID filled in.
func (ah *AH) AV() AddressVector { return ah.av }

// Close destroys the address handle.
func (ah *AH) Close() error {
	if err := ah.d.lock(); err != nil {
		return err
	}
	defer ah.d.mu.Unlock()
	return ah.d.res.released(&ah.d.res.AH, ah.ah.Destroy())
}

// prepareAV fills in the source GID, checks it is ours, and resolves the
// destination's MAC so the data path finds it.
func (d *Device) prepareAV(ctx context.Context, av *AddressVector) error {
	dst := av.DGID.Addr()
	if !dst.IsValid() || dst.IsUnspecified() {
		return fmt.Errorf("roce: destination GID %v: %w", av.DGID, qp.ErrInvalidArgument)
	}
	if av.SGID == (ib.GID{}) {
		g, err := d.SourceGID(dst)
		if err != nil {
			return err
		}
		av.SGID = g
	} else if !d.gids.Load().has(av.SGID) {
		return fmt.Errorf("roce: source GID %v is not in the GID table: %w", av.SGID, ErrNoGID)
	}
	if av.SGID.Addr().Is4() != dst.Is4() {
		return fmt.Errorf("roce: source GID %v and destination GID %v differ in address family: %w",
			av.SGID, av.DGID, qp.ErrInvalidArgument)
	}
	if av.HopLimit == 0 {
		av.HopLimit = 64
	}
	if d.gids.Load().has(av.DGID) {
		return nil // loopback: delivered without the link
	}
	_, err := d.neigh.resolve(ctx, dst)
	if err != nil {
		d.ctr.noNeighbour.Add(1)
	}
	return err
}

// QPInitAttr describes a queue pair to create (struct ibv_qp_init_attr).
type QPInitAttr struct {
	Type           QPType
	SendCQ, RecvCQ *CQ
	SRQ            *SRQ // optional: the QP then has no receive queue of its own
	Cap            QPCap
	SigAll         bool       // every send WR generates a completion
	DC             DCInitAttr // DCT: access key and initiator bound
}

// QP is a queue pair (ibv_qp).
type QP struct {
	d   *Device
	q   *qp.QP
	qpn uint32
	typ QPType
	// Failure (events.go): failed is closed and err set when the device
	// moves the QP to the error state.
	failed atomic.Pointer[chan struct{}]
	err    atomic.Pointer[qp.QPError]
}

// CreateQP creates a queue pair in the RESET state. Zero capacities get
// defaults (128 WRs, 4 SGEs, 64 bytes inline).
func (pd *PD) CreateQP(attr *QPInitAttr) (*QP, error) {
	if attr == nil || attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, fmt.Errorf("roce: create QP needs a send and a receive CQ: %w", qp.ErrInvalidArgument)
	}
	d := pd.d
	if attr.SendCQ.d != d || attr.RecvCQ.d != d || (attr.SRQ != nil && attr.SRQ.d != d) {
		return nil, ErrWrongDevice
	}
	c := attr.Cap
	if c.MaxSendWR == 0 {
		c.MaxSendWR = 128
	}
	if c.MaxRecvWR == 0 && attr.SRQ == nil && attr.Type != DCI {
		c.MaxRecvWR = 128
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 4
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 4
	}
	if c.MaxInlineData == 0 {
		c.MaxInlineData = 64
	}
	ia := qp.QPInitAttr{Type: attr.Type, SendCQ: attr.SendCQ.cq, RecvCQ: attr.RecvCQ.cq, Cap: c, SigAll: attr.SigAll, DC: attr.DC}
	if attr.SRQ != nil {
		ia.SRQ = attr.SRQ.srq
	}
	if err := d.lock(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	q, err := pd.pd.CreateQP(&ia)
	if err != nil {
		return nil, fmt.Errorf("roce: create %v QP: %w", attr.Type, err)
	}
	d.res.QP++
	rq := &QP{d: d, q: q, qpn: q.QPN(), typ: attr.Type}
	failed := make(chan struct{})
	rq.failed.Store(&failed)
	q.SetContext(rq)
	return rq, nil
}

// QPN returns the queue pair number.
func (q *QP) QPN() uint32 { return q.qpn }

// Type returns RC, UC or UD.
func (q *QP) Type() QPType { return q.typ }

// State returns the current state.
func (q *QP) State() QPState {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.q.State()
}

// Attr returns the current attributes (ibv_query_qp).
func (q *QP) Attr() QPAttr {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.q.Attr()
}

// ExpectedPSN returns the PSN the QP's responder expects next: its
// starting PSN (QPAttr.RQPSN as set) until the peer's first request
// arrives, then one past the last request taken in order. (rxe's
// ibv_query_qp reports it as rq_psn; QPAttr keeps what was set.)
func (q *QP) ExpectedPSN() uint32 {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.q.ExpectedPSN()
}

// PSNRejects returns the requests this RC QP refused for their PSN: a
// peer (or someone sending from its address) at PSNs the QP does not
// expect.
func (q *QP) PSNRejects() PSNRejects {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.q.PSNRejects()
}

// SourcePort returns the UDP source port of the QP's packets: the link's
// fixed port, the AV's, or rxe's hash of the QPN.
func (q *QP) SourcePort() uint16 {
	if p := q.d.linfo.FixedSourcePort; p != 0 {
		return p
	}
	if p := q.Attr().AV.SrcPort; p != 0 {
		return p
	}
	return ib.RXESourcePort(q.qpn)
}

// Modify changes state and attributes like ibv_modify_qp. With AttrAV it
// fills a zero AV.SGID, checks the SGID is in the GID table and resolves the
// destination's MAC, waiting at most until ctx ends; with AttrPathMTU it
// refuses an MTU whose packets the link cannot carry (ErrMTU).
func (q *QP) Modify(ctx context.Context, attr *QPAttr, mask AttrMask) error {
	d := q.d
	// What the engine has queued leaves before the QP changes state: a
	// move to ERR would drop it, and the peer's last message would never
	// complete. That is an ACK a poller left to its caller (txdefer.go),
	// or one the receive path queued with a completion it posted before
	// its transmit pass, whose waiter (rdma_cm's disconnect after the
	// last message) can get here first (see Close).
	d.flushAll()
	a := *attr
	if mask&AttrAV != 0 {
		if err := d.prepareAV(ctx, &a.AV); err != nil {
			return err
		}
	}
	if mask&AttrPathMTU != 0 {
		v4 := mask&AttrAV == 0 || a.AV.DGID.IsIPv4()
		// Largest packet: BTH + RETH + ImmDt + MTU bytes of payload + ICRC.
		need := ib.BTHSize + ib.RETHSize + ib.ImmDtSize + a.PathMTU.Bytes() + ib.ICRCSize
		if limit := d.ibLimit(v4); a.PathMTU.Bytes() > 0 && need > limit {
			return fmt.Errorf("roce: path MTU %d needs %d-byte IB packets, the link's MTU %d carries %d: %w",
				a.PathMTU.Bytes(), need, d.netMTU.Load(), limit, ErrMTU)
		}
	}
	if err := d.lock(); err != nil {
		return err
	}
	err := q.q.Modify(&a, mask)
	if err == nil && mask&AttrState != 0 && a.State == StateReset {
		q.rearm()
	}
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("roce: modify QP %d: %w", q.qpn, err)
	}
	if mask&AttrAV != 0 {
		attr.AV = a.AV
	}
	// A move to ERR flushes work requests; RTS may release queued sends.
	d.flush()
	return nil
}

// PostSend posts a send work request and starts transmitting it. Structural
// errors (wrong state, queue full, too many SGEs, opcode not valid for the QP
// type) are returned; memory errors surface as error completions.
func (q *QP) PostSend(wr *SendWR) error {
	if wr == nil {
		return fmt.Errorf("roce: post send: nil work request: %w", qp.ErrInvalidArgument)
	}
	_, err := q.PostSendBatch(unsafe.Slice(wr, 1))
	return err
}

// PostSendBatch posts several send work requests with one transmit pass.
// It returns how many were posted; on error wrs[n] failed.
func (q *QP) PostSendBatch(wrs []SendWR) (int, error) {
	if wrs == nil {
		return 0, nil
	}
	d := q.d
	if d.closed.Load() {
		return 0, ErrClosed
	}
	n := 0
	var err error
	// The send queue has a lock of its own: a simple work request is
	// posted under it, without waiting for a transmit or receive pass or
	// another QP's post. The first that is not simple takes the device
	// lock, for it and the rest of the batch.
	for n < len(wrs) {
		// The work request goes to the engine as it is: its objects
		// checked to be this device's, it is not copied.
		if err = q.owns(&wrs[n]); err != nil {
			break
		}
		ok, perr := q.q.PostSendConcurrent(&wrs[n])
		if !ok {
			break
		}
		if err = perr; err != nil {
			break
		}
		n++
	}
	if err == nil && n < len(wrs) {
		if err = d.lock(); err != nil {
			return n, err
		}
		for ; n < len(wrs); n++ {
			if err = q.owns(&wrs[n]); err != nil {
				break
			}
			if err = q.q.PostSend(&wrs[n]); err != nil {
				break
			}
		}
		d.mu.Unlock()
	}
	if n > 0 {
		d.flushPosted()
	}
	if err != nil {
		return n, fmt.Errorf("roce: post send on QP %d: %w", q.qpn, err)
	}
	return n, nil
}

// owns checks that the objects wr names are this package's AH, MW and MR
// of the QP's device, which the engine may then resolve: a nil one inside
// the interface, or one of another device, stops here.
func (q *QP) owns(wr *SendWR) error {
	if err := q.d.owns(wr.AH); err != nil {
		return err
	}
	if err := q.d.owns(wr.MW); err != nil {
		return err
	}
	return q.d.owns(wr.Bind.MR)
}

// owns checks one reference of a work request (AHRef, MWRef, MRRef): nil,
// or a non-nil *AH, *MW or *MR of d.
func (d *Device) owns(ref any) error {
	var od *Device
	switch o := ref.(type) {
	case nil:
		return nil
	case *AH:
		if o != nil {
			od = o.d
		}
	case *MW:
		if o != nil {
			od = o.d
		}
	case *MR:
		if o != nil {
			od = o.d
		}
	}
	switch od {
	case nil:
		return ErrInvalidArgument
	case d:
		return nil
	}
	return ErrWrongDevice
}

// BindMW binds a type 1 window (ibv_bind_mw): it posts a BIND_MW work
// request whose new R_Key is the window's last with the consumer key
// incremented, and returns that key. The bind takes effect when the send
// queue reaches it and completes with WCBindMW (or WCMWBindErr, which
// moves the QP to the error state).
func (q *QP) BindMW(mw *MW, b *MWBind) (uint32, error) {
	if mw == nil || b == nil {
		return 0, fmt.Errorf("roce: bind MW: %w", qp.ErrInvalidArgument)
	}
	d := q.d
	if mw.d != d {
		return 0, ErrWrongDevice
	}
	if err := d.owns(b.Info.MR); err != nil {
		return 0, fmt.Errorf("roce: bind MW: %w", err)
	}
	if err := d.lock(); err != nil {
		return 0, err
	}
	key, err := q.q.BindMW(mw.mw, b)
	d.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("roce: bind MW on QP %d: %w", q.qpn, devErr(err))
	}
	d.flush()
	return key, nil
}

// SetReplyBeforeAck lets the QP's requests leave before the ACKs it has
// queued, in turn with them, instead of after them (qp.QP.SetReplyBeforeAck):
// with CQ.SetAckWithReply, a reply then reaches the peer ahead of the ACK
// that leaves with it, one frame sooner. Only for peers that do not need
// their message's completion before the reply's.
func (q *QP) SetReplyBeforeAck(on bool) {
	q.d.mu.Lock()
	q.q.SetReplyBeforeAck(on)
	q.d.mu.Unlock()
}

// PostRecv posts a receive work request. For UD QPs the first GRHSize bytes of
// the buffer receive the datagram's network header.
func (q *QP) PostRecv(wr *RecvWR) error {
	d := q.d
	if d.closed.Load() {
		return ErrClosed
	}
	// The QP's receive queue has a lock of its own: a post does not wait
	// for a receive batch or another QP's post. Only a QP in the error
	// state, where the receive completes at once, needs the device lock.
	if ok, err := q.q.PostRecvConcurrent(wr); ok {
		if err != nil {
			return fmt.Errorf("roce: post receive on QP %d: %w", q.qpn, err)
		}
		return nil
	}
	if err := d.lock(); err != nil {
		return err
	}
	err := q.q.PostRecv(wr)
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("roce: post receive on QP %d: %w", q.qpn, err)
	}
	// A receive may satisfy an RNR-waiting peer only when it retries, but a
	// UC/RC responder may also have queued an ACK: nothing to send here.
	return nil
}

// PostRecvBatch posts several receive work requests under one lock. It
// returns how many were posted; on error wrs[n] failed.
func (q *QP) PostRecvBatch(wrs []RecvWR) (int, error) {
	d := q.d
	if err := d.lock(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	for i := range wrs {
		if err := q.q.PostRecv(&wrs[i]); err != nil {
			return i, fmt.Errorf("roce: post receive on QP %d: %w", q.qpn, err)
		}
	}
	return len(wrs), nil
}

// Close destroys the QP (ibv_destroy_qp); outstanding work requests are
// dropped without completions.
func (q *QP) Close() error {
	d := q.d
	// The receive path posts a completion under the device lock and
	// transmits the ACK after it, so a caller woken by the completion can
	// get here first. The queued ACK (or NAK) leaves before the QP goes,
	// as rxe's responder sends it before its QP can be destroyed;
	// otherwise the peer resends into a QP that no longer exists. So does
	// an ACK a poller left to its caller (txdefer.go).
	d.flushAll()
	if err := d.lock(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	return d.res.released(&d.res.QP, q.q.Destroy())
}

// ConnectAttr are the parameters Connect applies: the usual rc_pingpong /
// rdma_cm choices, with defaults for zero fields.
type ConnectAttr struct {
	// Remote end (RC/UC).
	RemoteQPN uint32
	RemoteGID ib.GID // or RemoteAddr
	// RemoteAddr is used when RemoteGID is zero.
	RemoteAddr netip.Addr
	RemotePSN  uint32 // the peer's initial send PSN (our RQ PSN)
	LocalPSN   uint32 // our initial send PSN
	// SGID is the source GID (default: the device address of the remote's family).
	SGID ib.GID
	// PathMTU defaults to the port's active MTU.
	PathMTU ib.MTU
	// Access is the remote access the responder allows (default: remote
	// read, write and atomic).
	Access Access
	// Timeout (default 14: ~67 ms), RetryCnt and RNRRetry (default 7:
	// forever, as rxe), MinRNRTimer (default 12: 0.64 ms), RdAtomic (default 16).
	Timeout, RetryCnt, RNRRetry, MinRNRTimer, RdAtomic uint8
	// NoDefaults takes Timeout, RetryCnt, RNRRetry and MinRNRTimer as given,
	// zeros included.
	NoDefaults bool
	// TrafficClass (DSCP<<2 | ECN) and HopLimit (TTL, default 64).
	TrafficClass, HopLimit uint8
	// QKey is the UD QP's Q_Key.
	QKey uint32
}

// Connect brings a QP from RESET to RTS: INIT, RTR (with the remote end and
// neighbour resolution, bounded by ctx) and RTS. UD QPs need only QKey.
func (q *QP) Connect(ctx context.Context, c *ConnectAttr) error {
	d := q.d
	var a QPAttr
	a.State, a.Port = StateInit, 1
	mask := AttrState | AttrPKeyIndex | AttrPort
	if q.typ == UD {
		a.QKey = c.QKey
		mask |= AttrQKey
	} else {
		a.AccessFlags = c.Access
		if a.AccessFlags == 0 {
			a.AccessFlags = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessLocalWrite
		}
		mask |= AttrAccessFlags
	}
	if err := q.Modify(ctx, &a, mask); err != nil {
		return err
	}
	a = QPAttr{State: StateRTR}
	mask = AttrState
	if q.typ != UD {
		dgid := c.RemoteGID
		if dgid == (ib.GID{}) {
			if !c.RemoteAddr.IsValid() {
				return fmt.Errorf("roce: connect: no remote GID or address: %w", qp.ErrInvalidArgument)
			}
			dgid = ib.GIDFromAddr(c.RemoteAddr)
		}
		a.AV = AddressVector{DGID: dgid, SGID: c.SGID, TrafficClass: c.TrafficClass, HopLimit: c.HopLimit}
		a.PathMTU = c.PathMTU
		if a.PathMTU == 0 {
			a.PathMTU = d.activeMTU()
		}
		a.DestQPN, a.RQPSN = c.RemoteQPN, c.RemotePSN
		mask |= AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN
		if q.typ == RC {
			a.MaxDestRdAtomic = orDefault(c.RdAtomic, 16, false)
			a.MinRNRTimer = orDefault(c.MinRNRTimer, 12, c.NoDefaults)
			mask |= AttrMaxDestRdAtomic | AttrMinRNRTimer
		}
	}
	if err := q.Modify(ctx, &a, mask); err != nil {
		return err
	}
	a = QPAttr{State: StateRTS, SQPSN: c.LocalPSN}
	mask = AttrState | AttrSQPSN
	if q.typ == RC {
		a.Timeout = orDefault(c.Timeout, 14, c.NoDefaults)
		a.RetryCnt = orDefault(c.RetryCnt, 7, c.NoDefaults)
		a.RNRRetry = orDefault(c.RNRRetry, 7, c.NoDefaults)
		a.MaxRdAtomic = orDefault(c.RdAtomic, 16, false)
		mask |= AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
	}
	return q.Modify(ctx, &a, mask)
}

func orDefault(v, def uint8, keep bool) uint8 {
	if v == 0 && !keep {
		return def
	}
	return v
}
