package qp

import "sync"

// PD is a protection domain: MRs, AHs, SRQs and QPs of one PD may be used together.
type PD struct {
	e      *Engine
	refs   int
	closed bool
}

// AllocPD creates a protection domain.
func (e *Engine) AllocPD() (*PD, error) { return &PD{e: e}, nil }

// Close destroys the PD; it fails with ErrBusy while objects still use it.
func (pd *PD) Close() error {
	if pd.closed {
		return ErrClosed
	}
	if pd.refs > 0 {
		return ErrBusy
	}
	pd.closed = true
	return nil
}

// MR is a registered memory region over caller-provided memory.
type MR struct {
	pd     *PD
	buf    []byte
	iova   uint64
	access Access
	key    uint32
	valid  bool
	nmw    int // windows bound to the region
}

// RegMR registers buf with the given access rights. iova is the address the
// region has on the wire (RETH/AtomicETH VA and SGE addresses). As in ibverbs,
// remote write or atomic access requires local write.
func (pd *PD) RegMR(buf []byte, iova uint64, access Access) (*MR, error) {
	if pd.closed {
		return nil, ErrClosed
	}
	if access&AccessFlushPersistent != 0 {
		return nil, ErrOpNotSupported
	}
	if access&^accessAll != 0 {
		return nil, ErrInvalidArgument
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return nil, ErrInvalidArgument
	}
	// The region must not wrap the 64-bit address space.
	if uint64(len(buf)) > ^uint64(0)-iova {
		return nil, ErrInvalidArgument
	}
	mr := &MR{pd: pd, buf: buf, iova: iova, access: access, valid: true}
	key, ok := pd.e.keys.alloc(mr)
	if !ok {
		return nil, ErrNoResources
	}
	mr.key = key
	pd.refs++
	return mr, nil
}

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.key }

// RKey returns the remote key (the same value as the local key, as in rxe).
func (mr *MR) RKey() uint32 { return mr.key }

// IOVA returns the region's start address.
func (mr *MR) IOVA() uint64 { return mr.iova }

// Len returns the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// Valid reports whether the region is registered and not invalidated.
func (mr *MR) Valid() bool { return mr.valid }

// Dereg deregisters the region: its keys are never honoured again. It fails
// with ErrBusy while memory windows are bound to it.
func (mr *MR) Dereg() error {
	if mr.pd == nil {
		return ErrClosed
	}
	if mr.nmw > 0 {
		return ErrBusy // rxe: windows are bound to it
	}
	mr.valid = false
	mr.pd.e.keys.release(mr.key)
	mr.pd.refs--
	mr.pd = nil
	mr.buf = nil
	return nil
}

// span returns the bytes [va, va+n) of the region, or false if any of them is
// outside it. Overflow-safe for any va and n.
func (mr *MR) span(va uint64, n uint32) ([]byte, bool) {
	if va < mr.iova {
		return nil, false
	}
	off := va - mr.iova
	size := uint64(len(mr.buf))
	if off > size || uint64(n) > size-off {
		return nil, false
	}
	return mr.buf[off : off+uint64(n)], true
}

// lookupMR resolves a key for pd with the needed access rights.
func (e *Engine) lookupMR(pd *PD, key uint32, need Access) *MR {
	mr := e.keys.lookup(key)
	if mr == nil || mr.pd != pd || mr.access&need != need {
		return nil
	}
	return mr
}

// AH is an address handle for UD sends.
type AH struct {
	pd *PD
	av AddressVector
}

// CreateAH creates an address handle.
func (pd *PD) CreateAH(av AddressVector) (*AH, error) {
	if pd.closed {
		return nil, ErrClosed
	}
	pd.refs++
	return &AH{pd: pd, av: av}, nil
}

// Destroy releases the address handle.
func (ah *AH) Destroy() error {
	if ah.pd == nil {
		return ErrClosed
	}
	ah.pd.refs--
	ah.pd = nil
	return nil
}

// AV returns the address vector.
func (ah *AH) AV() AddressVector { return ah.av }

// CQ is a completion queue. Its ring has a lock of its own, so that Poll,
// Len and Overflows may run concurrently with the engine (which adds
// completions under the caller's serialization and this lock): a consumer
// takes its completions without the device's lock, and QPs of every
// transmit shard complete into one CQ.
type CQ struct {
	e        *Engine
	mu       sync.Mutex // guards ring, head, n and overflow
	ring     []WorkCompletion
	head, n  int
	overflow uint64
	refs     int
	closed   bool
	// Notify, if set, is called after each completion is added, with the
	// CQ's lock held; the device uses it to wake pollers. It must not
	// block or call the CQ's methods.
	Notify  func()
	pending bool
	ctx     any
}

// CreateCQ creates a completion queue with room for cqe entries.
func (e *Engine) CreateCQ(cqe int) (*CQ, error) {
	if cqe < 1 || cqe > MaxCQE {
		return nil, ErrInvalidArgument
	}
	return &CQ{e: e, ring: make([]WorkCompletion, cqe)}, nil
}

// Poll moves up to len(wc) completions into wc, oldest first, and returns
// how many. It is safe to call concurrently with the engine.
func (cq *CQ) Poll(wc []WorkCompletion) int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	k := 0
	for k < len(wc) && cq.n > 0 {
		wc[k] = cq.ring[cq.head]
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
		cq.n--
		k++
	}
	return k
}

// Len returns the number of completions waiting.
func (cq *CQ) Len() int {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.n
}

// Overflows returns how many completions were lost because the CQ was full.
// As in rxe, a QP whose completion does not fit moves to the error state; a
// correctly sized CQ never overflows.
func (cq *CQ) Overflows() uint64 {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overflow
}

// Close destroys the CQ; it fails with ErrBusy while a QP uses it.
func (cq *CQ) Close() error {
	if cq.closed {
		return ErrClosed
	}
	if cq.refs > 0 {
		return ErrBusy
	}
	cq.closed = true
	return nil
}

func (cq *CQ) push(wc *WorkCompletion) bool {
	cq.mu.Lock()
	if cq.n == len(cq.ring) {
		cq.overflow++
		cq.mu.Unlock()
		cq.e.raise(Event{Type: EventCQErr, CQ: cq})
		return false
	}
	i := cq.head + cq.n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = *wc
	cq.n++
	if cq.Notify != nil {
		cq.Notify()
	}
	cq.mu.Unlock()
	return true
}

// SGE is a scatter/gather element: Length bytes at Addr in the MR with LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// RecvWR is a receive work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// recvWQE is a posted receive; sge points into the owning queue's store.
type recvWQE struct {
	id     uint64
	length uint64
	sge    []SGE
}

// curRecv is the receive WQE a responder is filling.
type curRecv struct {
	id     uint64
	length uint64
	// sge holds the WQE's scatter list; its array is made on the first
	// take, with room for the queue's largest, so an idle QP holds none.
	sge []SGE
}

func (c *curRecv) sgl() []SGE { return c.sge }

// recvQueue is a ring of receive WQEs, used by QPs and SRQs. The ring is
// made on the first post (alloc) and dropped by release, so a QP that
// receives nothing holds none.
type recvQueue struct {
	// mu guards the ring against QP.PostRecvConcurrent, which posts
	// without the engine's serialization: the engine's own accesses to a
	// QP's queue (taking, flushing, clearing) take it too.
	mu      sync.Mutex
	ring    []recvWQE
	store   []SGE
	head, n int
	depth   int
	maxSGE  int
}

func (r *recvQueue) init(depth, maxSGE int) {
	r.depth, r.maxSGE = depth, maxSGE
}

func (r *recvQueue) alloc() {
	depth, maxSGE := r.depth, r.maxSGE
	r.ring = make([]recvWQE, depth)
	r.store = make([]SGE, depth*maxSGE)
	for i := range r.ring {
		r.ring[i].sge = r.store[i*maxSGE : i*maxSGE : (i+1)*maxSGE]
	}
}

// release drops the ring of an empty queue.
func (r *recvQueue) release() {
	if r.n == 0 {
		r.ring, r.store, r.head = nil, nil, 0
	}
}

func (r *recvQueue) post(wr *RecvWR) error {
	if len(wr.SGL) > r.maxSGE {
		return ErrTooManySGE
	}
	if r.n == r.depth {
		return ErrQueueFull
	}
	if r.ring == nil {
		r.alloc()
	}
	i := (r.head + r.n) % len(r.ring)
	w := &r.ring[i]
	w.id = wr.ID
	w.sge = append(w.sge[:0], wr.SGL...)
	w.length = 0
	for _, s := range wr.SGL {
		w.length += uint64(s.Length)
	}
	r.n++
	return nil
}

// take moves the oldest WQE into dst.
func (r *recvQueue) take(dst *curRecv) bool {
	if r.n == 0 {
		return false
	}
	w := &r.ring[r.head]
	dst.id = w.id
	dst.length = w.length
	if cap(dst.sge) < len(w.sge) {
		dst.sge = make([]SGE, 0, r.maxSGE)
	}
	dst.sge = append(dst.sge[:0], w.sge...)
	r.head = (r.head + 1) % len(r.ring)
	r.n--
	return true
}

// pop drops the oldest WQE, returning its ID.
func (r *recvQueue) pop() (uint64, bool) {
	if r.n == 0 {
		return 0, false
	}
	id := r.ring[r.head].id
	r.head = (r.head + 1) % len(r.ring)
	r.n--
	return id, true
}

func (r *recvQueue) clear() { r.head, r.n = 0, 0 }

// SRQ is a shared receive queue.
type SRQ struct {
	pd     *PD
	rq     recvQueue
	refs   int
	closed bool
	limit  int // armed SRQ limit, 0 = disarmed (events.go)
	ctx    any
}

// SRQAttr sizes a shared receive queue.
type SRQAttr struct {
	MaxWR, MaxSGE int
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(attr SRQAttr) (*SRQ, error) {
	if pd.closed {
		return nil, ErrClosed
	}
	if attr.MaxWR < 1 || attr.MaxWR > MaxQPWR || attr.MaxSGE < 0 || attr.MaxSGE > MaxSGE {
		return nil, ErrInvalidArgument
	}
	if attr.MaxSGE == 0 {
		attr.MaxSGE = 1
	}
	s := &SRQ{pd: pd}
	s.rq.init(attr.MaxWR, attr.MaxSGE)
	pd.refs++
	return s, nil
}

// PostRecv posts a receive work request to the SRQ.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if s.closed {
		return ErrClosed
	}
	return s.rq.post(wr)
}

// Len returns the number of posted receives.
func (s *SRQ) Len() int { return s.rq.n }

// Close destroys the SRQ; it fails with ErrBusy while a QP uses it.
func (s *SRQ) Close() error {
	if s.closed {
		return ErrClosed
	}
	if s.refs > 0 {
		return ErrBusy
	}
	s.closed = true
	s.pd.refs--
	return nil
}

// copySGL copies between data and the memory an SGE list describes, starting
// off bytes into the list. toMem selects the direction. It returns the status a
// failure maps to (local protection for a bad key or range, local length when
// the list is too short).
func (e *Engine) copySGL(pd *PD, sgl []SGE, off uint64, data []byte, toMem bool) WCStatus {
	need := Access(0)
	if toMem {
		need = AccessLocalWrite
	}
	for i := range sgl {
		if len(data) == 0 {
			return WCSuccess
		}
		s := &sgl[i]
		if off >= uint64(s.Length) {
			off -= uint64(s.Length)
			continue
		}
		mr := e.lookupMR(pd, s.LKey, need)
		if mr == nil {
			return WCLocProtErr
		}
		n := uint64(s.Length) - off
		if n > uint64(len(data)) {
			n = uint64(len(data))
		}
		mem, ok := mr.span(s.Addr+off, uint32(n))
		if !ok || s.Addr+off < s.Addr {
			return WCLocProtErr
		}
		if toMem {
			copy(mem, data[:n])
		} else {
			copy(data[:n], mem)
		}
		data = data[n:]
		off = 0
	}
	if len(data) > 0 {
		return WCLocLenErr
	}
	return WCSuccess
}

// pkeyMatch is rxe's rule: the low 15 bits equal and non-zero, and at least one
// of the two a full member.
func pkeyMatch(a, b uint16) bool {
	if a&0x7FFF == 0 || a&0x7FFF != b&0x7FFF {
		return false
	}
	return a&0x8000 != 0 || b&0x8000 != 0
}
