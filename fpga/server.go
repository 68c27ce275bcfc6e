package fpga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// Defaults of NewServer, as Rogue's.
const (
	DefaultMaxPayload   = 9000
	DefaultRxQueueDepth = 256
)

// Errors of the server (see the package doc's Errors section).
var (
	// ErrInvalidSetting: an argument the FPGA or Rogue cannot take.
	ErrInvalidSetting = errors.New("fpga: invalid setting")
	// ErrState: a call the server's state does not allow (CompleteConnection
	// before SetFPGAGID, twice, or after Stop; SetFPGAGID once connected).
	ErrState = errors.New("fpga: call not allowed in this state")
	// ErrFlushed: the receive queue was flushed (QP in error state).
	ErrFlushed = errors.New("fpga: receive flushed (QP in error state)")
	// ErrPSNMismatch: the sender's PSNs do not match (a stale FPGA QP).
	ErrPSNMismatch = errors.New("fpga: sender's PSNs do not match (stale FPGA QP? soft-reset it)")
)

// stateError is an ErrState with the call order it refused.
type stateError string

func (e stateError) Error() string        { return "fpga: " + string(e) }
func (e stateError) Is(target error) bool { return target == ErrState }

const (
	errNoFPGAGID stateError = "FPGA GID not set (SetFPGAGID)"
	errConnected stateError = "CompleteConnection already called"
	errStopped   stateError = "server stopped"
)

// DataPath selects which completions carry frames.
type DataPath uint8

const (
	// DataPathAny accepts both firmware generations.
	DataPathAny DataPath = iota
	// DataPathSend accepts only SEND WITH IMMEDIATE (gen 2).
	DataPathSend
	// DataPathWrite accepts only RDMA WRITE WITH IMMEDIATE (gen 1).
	DataPathWrite
)

// Stats are the server's counters.
type Stats struct {
	Frames, Bytes uint64
	// Completions dropped (slot posted again, except BadSlot).
	BadSlot   uint64 // work request ID out of range
	BadLength uint64 // zero or longer than maxPayload
	BadOpcode uint64 // not the data path's receive-with-immediate
	BadStatus uint64 // error completions other than a flush
	// BadDuplicate counts completions of a slot whose receive was not
	// posted (a second completion of the same slot before it was given
	// back); they are ignored: the slot is neither delivered nor posted.
	BadDuplicate uint64
	// BadRelease counts Release calls on a frame already released, and
	// reposts of a slot already posted; both are ignored.
	BadRelease uint64
	// Held is the number of slots consumers hold now.
	Held int
}

// Server is a Rogue RoCEv2 receive server on one RC QP.
type Server struct {
	dev        *roce.Device
	port       uint8
	gidIndex   int
	maxPayload int
	depth      int
	rqPSN      uint32
	sqPSN      uint32
	log        *slog.Logger

	pd   *roce.PD
	qp   *roce.QP
	slab *rxSlab

	// refs holds per slot a generation (upper 32 bits) and a reference
	// count (lower 32), so a release of a stale Frame is caught.
	refs []atomic.Uint64

	mu        sync.Mutex
	fpgaGID   ib.GID
	hostGID   ib.GID
	haveFPGA  bool
	path      DataPath
	connected bool
	stopped   bool
	cancel    context.CancelFunc
	err       error
	consumers atomic.Pointer[[]*Consumer] // delivery order: secondaries, then the primary
	attached  chan struct{}               // closed at the first Attach
	done      chan struct{}               // closed when the receive goroutine ends
	watchDone chan struct{}

	frames, bytes                                 atomic.Uint64
	psnSuspect                                    atomic.Pointer[error] // a suspected PSN mismatch (watchPSN), until a frame
	badSlot, badLen, badOp, badStatus, badRelease atomic.Uint64
	badDup                                        atomic.Uint64
	held                                          atomic.Int64

	pend []int32 // slots to post again after the current completion batch (receive goroutine)
}

// NewServer creates a server on dev: the slab of rxQueueDepth slots of
// maxPayload bytes (0 selects the defaults 256 and 9000), its memory region,
// the CQ and the RC QP in INIT. port is the device port (1). gidIndex is the
// host's GID table index; a negative index picks the RoCEv2 IPv4 GID in the
// FPGA's /24 (or IPv6 GID in its /64), as PyRogue does: at SetFPGAGID, or at
// CompleteConnection if the FPGA GID is set later.
func NewServer(dev *roce.Device, port uint8, gidIndex, maxPayload, rxQueueDepth int) (*Server, error) {
	if maxPayload == 0 {
		maxPayload = DefaultMaxPayload
	}
	if rxQueueDepth == 0 {
		rxQueueDepth = DefaultRxQueueDepth
	}
	if maxPayload < 0 || rxQueueDepth < 0 || port > 1 {
		return nil, fmt.Errorf("fpga: port %d, maxPayload %d, depth %d: %w", port, maxPayload, rxQueueDepth, ErrInvalidSetting)
	}
	if port == 0 {
		port = 1
	}
	s := &Server{dev: dev, port: port, gidIndex: gidIndex, maxPayload: maxPayload, depth: rxQueueDepth,
		rqPSN: rand.Uint32() & ib.PSNMask, sqPSN: rand.Uint32() & ib.PSNMask, log: slog.Default(),
		attached: make(chan struct{}), done: make(chan struct{}), refs: make([]atomic.Uint64, rxQueueDepth)}
	if gidIndex >= 0 {
		g, err := dev.GID(gidIndex)
		if err != nil {
			return nil, fmt.Errorf("fpga: GID index %d: %w", gidIndex, err)
		}
		if g == (ib.GID{}) {
			return nil, fmt.Errorf("fpga: GID index %d is all zero: %w", gidIndex, roce.ErrNoGID)
		}
		s.hostGID = g
	}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if s.slab, err = newRxSlab(dev, s.pd, rxQueueDepth, maxPayload); err != nil {
		s.pd.Close()
		return nil, err
	}
	s.qp, err = s.pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: s.slab.cq, RecvCQ: s.slab.cq,
		Cap: roce.QPCap{MaxSendWR: 1, MaxRecvWR: rxQueueDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err == nil {
		s.slab.attach(s.qp)
		err = s.qp.Modify(context.Background(), &roce.QPAttr{State: roce.StateInit, Port: port,
			AccessFlags: roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessLocalWrite},
			roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags)
	}
	if err != nil {
		if s.qp != nil {
			s.qp.Close()
		}
		s.slab.close()
		s.pd.Close()
		return nil, err
	}
	return s, nil
}

// SetLogger replaces the logger (default slog.Default()).
func (s *Server) SetLogger(l *slog.Logger) { s.log = l }

// SetDataPath restricts the frames accepted to one firmware generation;
// completions of the other are counted as BadOpcode. Call it before
// CompleteConnection.
func (s *Server) SetDataPath(p DataPath) {
	s.mu.Lock()
	s.path = p
	s.mu.Unlock()
}

// SetFPGAGID sets the FPGA's GID (its IPv4 address as ::ffff:a.b.c.d). It
// must be called before CompleteConnection. With a negative GID index it
// also picks the host GID.
func (s *Server) SetFPGAGID(g ib.GID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected {
		return errConnected
	}
	s.fpgaGID, s.haveFPGA = g, true
	if s.gidIndex < 0 {
		return s.pickGID()
	}
	return nil
}

// pickGID picks the host GID on the FPGA's subnet (PyRogue's detectGidIndex:
// the RoCE v2 GID whose IPv4 address shares the FPGA's /24).
func (s *Server) pickGID() error {
	fa := s.fpgaGID.Addr()
	bits := 24
	if !fa.Is4() {
		bits = 64
	}
	pfx, err := fa.Prefix(bits)
	if err != nil {
		return fmt.Errorf("fpga: FPGA GID %v: %w", s.fpgaGID, ErrInvalidSetting)
	}
	for _, e := range s.dev.GIDs() {
		if e.Type == roce.GIDTypeRoCEv2 && e.Addr.Is4() == fa.Is4() && pfx.Contains(e.Addr) && e.Addr != fa {
			s.hostGID = e.GID
			return nil
		}
	}
	return fmt.Errorf("fpga: no RoCEv2 GID shares the subnet of FPGA %v: %w", fa, roce.ErrNoGID)
}

// CompleteConnection connects the server to the FPGA's QP: it posts every
// receive, then moves the QP to RTR (destination fpgaQPN, first expected
// PSN fpgaRqPSN, path MTU pmtu, RNR NAK timer minRNRTimer) and RTS (send PSN
// SqPSN, timeout 14, retry 3, RNR retry 7), and starts the receive
// goroutine. A zero pmtu means 4096 (code 5) and a zero minRNRTimer code 1
// (0.01 ms), Rogue's defaults. It may be called once; ctx bounds the
// neighbour resolution of the FPGA's address.
func (s *Server) CompleteConnection(ctx context.Context, fpgaQPN, fpgaRqPSN uint32, pmtu ib.MTU, minRNRTimer uint8) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.stopped:
		return errStopped
	case s.connected:
		return errConnected
	case !s.haveFPGA:
		return errNoFPGAGID
	}
	if pmtu == 0 {
		pmtu = ib.MTU4096
	}
	if minRNRTimer == 0 {
		minRNRTimer = 1
	}
	if !pmtu.Valid() || minRNRTimer > 31 || fpgaQPN > ib.PSNMask || fpgaRqPSN > ib.PSNMask {
		return fmt.Errorf("fpga: QPN %#x PSN %#x pmtu %d RNR timer %d: %w", fpgaQPN, fpgaRqPSN, pmtu, minRNRTimer, ErrInvalidSetting)
	}
	if s.hostGID == (ib.GID{}) {
		if err := s.pickGID(); err != nil {
			return err
		}
	}
	s.connected = true
	if err := s.slab.postAll(); err != nil {
		return err
	}
	err := s.qp.Modify(ctx, &roce.QPAttr{State: roce.StateRTR, PathMTU: pmtu, DestQPN: fpgaQPN, RQPSN: fpgaRqPSN,
		MaxDestRdAtomic: 16, MinRNRTimer: minRNRTimer,
		AV: roce.AddressVector{DGID: s.fpgaGID, SGID: s.hostGID, HopLimit: 64}},
		roce.AttrState|roce.AttrAV|roce.AttrPathMTU|roce.AttrDestQPN|roce.AttrRQPSN|roce.AttrMaxDestRdAtomic|roce.AttrMinRNRTimer)
	if err != nil {
		return fmt.Errorf("fpga: QP to RTR: %w", err)
	}
	err = s.qp.Modify(ctx, &roce.QPAttr{State: roce.StateRTS, SQPSN: s.sqPSN, Timeout: 14, RetryCnt: 3, RNRRetry: 7, MaxRdAtomic: 16},
		roce.AttrState|roce.AttrSQPSN|roce.AttrTimeout|roce.AttrRetryCnt|roce.AttrRNRRetry|roce.AttrMaxQPRdAtomic)
	if err != nil {
		return fmt.Errorf("fpga: QP to RTS: %w", err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.watchDone = make(chan struct{})
	go s.run(rctx)
	go s.watchPSN(rctx)
	return nil
}

// Consumer takes frames from a server (Rogue's stream Slave). AcceptFrame
// runs on the server's receive goroutine; the frame is valid until it
// returns unless the consumer calls Retain.
type Consumer interface {
	AcceptFrame(Frame)
}

// ConsumerFunc adapts a function to Consumer.
type ConsumerFunc func(Frame)

// AcceptFrame calls f.
func (f ConsumerFunc) AcceptFrame(fr Frame) { f(fr) }

// Attach adds a consumer. The first consumer attached is the primary: it
// gets each frame after all others. The returned function detaches it.
func (s *Server) Attach(c Consumer) (detach func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	box := &c // identity of this attachment (funcs do not compare)
	var cur []*Consumer
	if p := s.consumers.Load(); p != nil {
		cur = *p
	}
	next := make([]*Consumer, 0, len(cur)+1)
	if len(cur) == 0 {
		next = append(next, box)
	} else {
		// Secondaries in attach order, the primary (first attached) last.
		next = append(next, cur[:len(cur)-1]...)
		next = append(next, box, cur[len(cur)-1])
	}
	s.consumers.Store(&next)
	select {
	case <-s.attached:
	default:
		close(s.attached)
	}
	return func() { s.detach(box) }
}

func (s *Server) detach(box *Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.consumers.Load()
	if p == nil {
		return
	}
	next := make([]*Consumer, 0, len(*p))
	for _, c := range *p {
		if c != box {
			next = append(next, c)
		}
	}
	s.consumers.Store(&next)
}

// Serve passes every frame to fn (on the receive goroutine; the frame is
// valid until fn returns unless fn retains it) until ctx ends, the server
// stops, or a PSN mismatch is detected. It returns nil when ctx ends or
// Stop was called, else the reason (Err).
func (s *Server) Serve(ctx context.Context, fn func(Frame)) error {
	detach := s.Attach(ConsumerFunc(fn))
	defer detach()
	var watch <-chan struct{}
	s.mu.Lock()
	watch = s.watchDone
	s.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.done:
			return s.Err()
		case <-watch:
			if err := s.Err(); err != nil {
				return err
			}
			watch = nil
		}
	}
}

// Done is closed when the receive goroutine has ended (Stop, or a flush).
func (s *Server) Done() <-chan struct{} { return s.done }

// Err reports why the server stopped receiving (ErrFlushed), or
// ErrPSNMismatch: confirmed (Serve returned it), or suspected while no
// frame has arrived (refused packets from the FPGA's address: a stale
// sender's first burst, or spoofed). nil while it runs normally.
func (s *Server) Err() error {
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err == nil && s.frames.Load() == 0 {
		if p := s.psnSuspect.Load(); p != nil {
			return *p
		}
	}
	return err
}

func (s *Server) setErr(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// run is the receive goroutine.
func (s *Server) run(ctx context.Context) {
	defer close(s.done)
	select {
	case <-s.attached:
	case <-ctx.Done():
		return
	}
	var wc [pollBatch]roce.WorkCompletion
	s.mu.Lock()
	path := s.path
	s.mu.Unlock()
	s.pend = make([]int32, 0, repostBatch)
	for {
		n, err := s.slab.poll(ctx, wc[:min(s.depth, pollBatch)])
		if err != nil {
			if ctx.Err() == nil {
				s.setErr(err)
			}
			return
		}
		for i := range wc[:n] {
			if !s.complete(&wc[i], path) {
				s.setErr(ErrFlushed)
				s.log.Warn("fpga: receive queue flushed; server stops", "qpn", s.qp.QPN())
				return
			}
		}
		s.flushReposts()
	}
}

// pollBatch is the most completions the receive goroutine takes at once.
// The slots it frees go back to the receive queue repostBatch at a time
// and at the end of the batch: one device lock per group instead of one
// per frame, and a consumer that is slow with one frame of a batch delays
// the reposts of at most repostBatch-1 others.
const (
	pollBatch   = 64
	repostBatch = 16
)

// repost queues slot for the next batch repost. Only the receive goroutine
// calls it.
func (s *Server) repost(slot int) {
	s.pend = append(s.pend, int32(slot))
	if len(s.pend) >= repostBatch {
		s.flushReposts()
	}
}

// flushReposts posts the queued slots again.
func (s *Server) flushReposts() {
	if len(s.pend) > 0 {
		s.slab.repostBatch(s.pend)
		s.pend = s.pend[:0]
	}
}

// releaseOwn drops the server's own reference to f, taken when its
// completion arrived, on the receive goroutine: a slot no consumer kept
// joins the batch repost.
func (s *Server) releaseOwn(f Frame) {
	if s.unref(f) {
		s.repost(int(f.slot))
	}
}

// unref drops one reference to f and reports whether it was the last. A
// stale frame, or one released more often than retained, is counted
// (Stats.BadRelease) and otherwise ignored.
func (s *Server) unref(f Frame) bool {
	r := &s.refs[f.slot]
	for {
		v := r.Load()
		if uint32(v>>32) != f.gen || uint32(v) == 0 {
			s.badRelease.Add(1)
			return false
		}
		if r.CompareAndSwap(v, v-1) {
			if uint32(v) != 1 {
				return false
			}
			s.held.Add(-1)
			return true
		}
	}
}

// complete handles one completion as Rogue's processCompletion; it returns
// false for a flush.
func (s *Server) complete(wc *roce.WorkCompletion, path DataPath) bool {
	if wc.WRID >= uint64(s.depth) {
		s.badSlot.Add(1)
		return true
	}
	slot := int(wc.WRID)
	if wc.Status == roce.WCWRFlushErr {
		return false
	}
	if !s.slab.take(slot) {
		// The slot's receive is not on the queue: it was completed
		// already and is held or waiting to be posted again.
		s.badDup.Add(1)
		return true
	}
	if wc.Status != roce.WCSuccess {
		s.badStatus.Add(1)
		s.repost(slot)
		return true
	}
	ok := wc.Flags&roce.WCWithImm != 0
	switch wc.Opcode {
	case roce.WCRecv:
		ok = ok && path != DataPathWrite
	case roce.WCRecvRDMAWithImm:
		ok = ok && path != DataPathSend
	default:
		ok = false
	}
	if !ok {
		s.badOp.Add(1)
		s.repost(slot)
		return true
	}
	if wc.ByteLen == 0 || int(wc.ByteLen) > s.maxPayload {
		s.badLen.Add(1)
		s.repost(slot)
		return true
	}
	s.frames.Add(1)
	s.bytes.Add(uint64(wc.ByteLen))
	gen := s.refs[slot].Load()>>32 + 1
	s.refs[slot].Store(gen<<32 | 1)
	s.held.Add(1)
	f := Frame{s: s, slot: uint32(slot), gen: uint32(gen), n: wc.ByteLen, imm: wc.Imm}
	if p := s.consumers.Load(); p != nil {
		for _, c := range *p {
			(*c).AcceptFrame(f)
		}
	}
	s.releaseOwn(f)
	return true
}

// watchPSN reports a sender whose PSNs do not match the new QP (see the
// package documentation) until the first frame arrives. It reads the
// server QP's own counts of requests refused for their PSN, so other RC
// traffic on the device cannot trip it. Refusals still seen after
// psnGrace make the mismatch suspected: Err reports it until a frame
// arrives, but Serve goes on, since a few packets spoofed from the FPGA's
// address at wrong PSNs look the same as a stale sender's first burst (an
// rxe sender behind the QP's PSN sends its window once and then waits).
// Refusals that go on, in psnTicks samples over psnGrace, confirm it:
// Serve then returns the error.
func (s *Server) watchPSN(ctx context.Context) {
	defer close(s.watchDone)
	t := time.NewTicker(psnTick)
	defer t.Stop()
	var first time.Time
	var last, seen uint64
	ticks := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.frames.Load() > 0 {
			return
		}
		r := s.qp.PSNRejects()
		n := r.Duplicate + r.OutOfSequence
		if n != last {
			last = n
			ticks++
		}
		if n == 0 {
			continue
		}
		if first.IsZero() {
			// A lost first packet also starts with a sequence NAK; the
			// sender's retransmission mends that well within psnGrace.
			first, seen = time.Now(), n
			continue
		}
		if time.Since(first) < psnGrace {
			continue
		}
		// A duplicate is answered with an ACK, so a sender behind the
		// QP's PSN has nothing to resend: before any frame it can only be
		// stale (or spoofed). Out-of-sequence requests must persist.
		if r.Duplicate == 0 && n == seen {
			continue
		}
		err := fmt.Errorf("%w: expected PSN %#x; since connecting %d duplicate and %d out-of-sequence requests from the FPGA's address over %v, no frame",
			ErrPSNMismatch, s.qp.Attr().RQPSN, r.Duplicate, r.OutOfSequence, time.Since(first).Round(time.Millisecond))
		if s.psnSuspect.CompareAndSwap(nil, &err) {
			s.log.Error("fpga: sender PSNs do not match", "err", err)
		}
		if ticks >= psnTicks {
			s.setErr(err)
			return
		}
	}
}

// The PSN check samples the QP's counters every psnTick; refusals after
// psnGrace make a mismatch suspected, and in psnTicks samples confirmed.
const (
	psnTick  = 50 * time.Millisecond
	psnGrace = 500 * time.Millisecond
	psnTicks = 4
)

// Stop ends the receive goroutine and frees the QP, the slab and the CQ.
// It is idempotent. Frames still held stay readable; releasing them does
// nothing. It waits for a consumer's AcceptFrame in progress, so it must not
// be called from one.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	cancel, started := s.cancel, s.connected && s.cancel != nil
	s.mu.Unlock()
	if started {
		cancel()
		<-s.done
		<-s.watchDone
	}
	s.qp.Close()
	s.slab.close()
	s.pd.Close()
}

// Close is Stop.
func (s *Server) Close() error {
	s.Stop()
	return nil
}

// QPN returns the host QP number.
func (s *Server) QPN() uint32 { return s.qp.QPN() }

// GID returns the host GID (zero until it is picked when the GID index is
// negative).
func (s *Server) GID() ib.GID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hostGID
}

// Addr returns the host's address (the GID as an IP address).
func (s *Server) Addr() netip.Addr { return s.GID().Addr() }

// RqPSN returns the host's receive PSN drawn at creation; the FPGA's
// (unused) receive side is programmed with it.
func (s *Server) RqPSN() uint32 { return s.rqPSN }

// SqPSN returns the host's send PSN; the FPGA's send PSN is programmed with
// it and CompleteConnection gets it back as fpgaRqPSN.
func (s *Server) SqPSN() uint32 { return s.sqPSN }

// MRAddr returns the slab's address (gen 1: the FPGA writes at MRAddr +
// slot·maxPayload).
func (s *Server) MRAddr() uint64 { return s.slab.mr.Addr() }

// MRRKey returns the slab's remote key.
func (s *Server) MRRKey() uint32 { return s.slab.mr.RKey() }

// MRLen returns the slab's length (maxPayload × depth).
func (s *Server) MRLen() uint32 { return uint32(len(s.slab.buf)) }

// MaxPayload returns the slot size.
func (s *Server) MaxPayload() int { return s.maxPayload }

// Depth returns the number of slots.
func (s *Server) Depth() int { return s.depth }

// FrameCount returns the frames received.
func (s *Server) FrameCount() uint64 { return s.frames.Load() }

// ByteCount returns the bytes received.
func (s *Server) ByteCount() uint64 { return s.bytes.Load() }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	return Stats{Frames: s.frames.Load(), Bytes: s.bytes.Load(), BadSlot: s.badSlot.Load(),
		BadLength: s.badLen.Load(), BadOpcode: s.badOp.Load(), BadStatus: s.badStatus.Load(),
		BadDuplicate: s.badDup.Load(), BadRelease: s.badRelease.Load() + s.slab.badRepost.Load(), Held: int(s.held.Load())}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
