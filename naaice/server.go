package naaice

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/internal/errtimeout"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

// Return codes goroce's software NAA sends on its own, from the range the
// protocol reserves (0x03-0x0f): the C software NAA answers neither case
// (it stops the connection's worker and the host waits).
const (
	// RCUnknownFunction: no routine is registered for the function code.
	RCUnknownFunction uint8 = 0x03
	// RCRoutinePanic: the routine panicked.
	RCRoutinePanic uint8 = 0x04
)

// Call is one RPC as a routine sees it. The slices are the NAA's memory for
// this connection: they keep their contents from one RPC to the next, as
// the C software NAA's do, and the host's writes land in them.
type Call struct {
	FnCode uint8
	User   [3]byte // the immediate's user bytes 0, 1, 2
	// Regions are the parameter regions in AAR order, Flags their flags.
	Regions [][]byte
	Flags   []mrsp.Flags
	// Internal are the NAA-only regions, in AAR order.
	Internal [][]byte
	// RPC counts the RPCs of the connection from 0.
	RPC    int
	Remote netip.AddrPort
}

// Routine runs an RPC in place on the call's regions and returns its
// return code: 0 success, 0x10-0x7f application errors. After a non-zero
// code no output is written back, only the code (as the library does).
type Routine func(ctx context.Context, c *Call) uint8

// ServerOptions configure a Server.
type ServerOptions struct {
	// Limits bound each AAR (zero value: DefaultServerLimits).
	Limits *mrsp.Limits
	// MaxConns bounds the connections served at once (0: 16). When they
	// are all taken a new connection displaces the one idle longest
	// (handshake done, waiting for its AAR or its next RPC); if none is
	// idle it is rejected with the C software NAA's "Server overlad".
	MaxConns int
	// IdleTimeout bounds the wait for a connection's AAR after the
	// handshake and for its next RPC after the last (0:
	// DefaultIdleTimeout; negative: no bound). The connection is then
	// closed and its memory returned.
	IdleTimeout time.Duration
	// MaxMemory bounds the region memory of all connections together (0:
	// 1 GiB). An AAR beyond it first takes the memory of the connections
	// idle longest, which are closed (IdleEvicted); if that is not enough
	// it is answered with an MRSP error, code 1.
	MaxMemory uint64
	// Logger receives one line per failed connection (nil: none).
	Logger *slog.Logger
}

// DefaultIdleTimeout is the default ServerOptions.IdleTimeout: far longer
// than a host takes between connecting and its AAR, or between RPCs of one
// batch, and short enough that hoarded connections come back soon.
const DefaultIdleTimeout = 10 * time.Second

// errIdle ends a connection that sent no AAR or RPC within IdleTimeout.
var errIdle = errtimeout.New("naaice: connection idle past the server's IdleTimeout")

// errEvicted ends an idle connection displaced by a new one (MaxConns).
var errEvicted = errors.New("naaice: idle connection closed for a new one (MaxConns)")

// Refusals the server makes itself, beyond what mrsp.ParseAAR checks: the
// same reasons and codes as mrsp's limit checks.
var (
	errNAAFull   = &mrsp.Error{Kind: mrsp.ErrRefused, Reason: "total-size", Detail: "regions exceed the NAA's memory", Code: mrsp.CodeNoMemory}
	errNAAMemory = &mrsp.Error{Kind: mrsp.ErrRefused, Reason: "memory", Detail: "region memory could not be registered", Code: mrsp.CodeNoMemory}
)

// DefaultServerLimits: the library's limits (31 regions, page-aligned
// non-overlapping NAA addresses) and 256 MiB per connection.
var DefaultServerLimits = mrsp.Limits{MaxRegions: mrsp.MaxAAREntries, MaxTotal: 256 << 20}

// ServerCounters count what a Server saw. Every connection that ends
// other than by the host's disconnect between RPCs is counted under the
// reason.
type ServerCounters struct {
	Accepted, Rejected, Active uint64
	// RPCs completed (write-back done), and those with a non-zero code.
	RPCs, RPCErrors uint64
	// MRSPErrors: AARs answered with an MRSP error message.
	MRSPErrors uint64
	// UnknownFunction: RPCs with no routine (answered RCUnknownFunction).
	UnknownFunction uint64
	// HostAborts: host error writes (immediate 0).
	HostAborts uint64
	// OutOfOrder: messages or completions the state did not allow.
	OutOfOrder uint64
	// CompletionErrors: failed work completions (a write outside the
	// regions, retries exhausted, ...).
	CompletionErrors uint64
	// Disconnects: hosts that left while an MRSP or RPC was under way,
	// including one that closed so soon after its last result that the
	// ACK of the write-back never came.
	Disconnects uint64
	// IdleTimeouts: connections closed for sending no AAR or RPC within
	// IdleTimeout. IdleEvicted: idle connections closed to admit a new
	// one when MaxConns were taken.
	IdleTimeouts, IdleEvicted uint64
}

// Server is a software NAA: it accepts host connections, runs the MRSP
// and serves RPCs with the routines registered by function code, each
// connection on its own goroutine.
type Server struct {
	dev  *roce.Device
	lim  mrsp.Limits
	max  int
	idle time.Duration
	mem  uint64
	log  *slog.Logger
	rtMu sync.RWMutex
	rts  map[uint8]Routine

	mu      sync.Mutex
	active  int
	used    uint64
	workers map[*worker]struct{} // admitted, holding a slot

	ctr struct {
		accepted, rejected, rpcs, rpcErrors, mrspErrors, unknownFn,
		hostAborts, outOfOrder, wcErrors, disconnects, idleTimeouts, idleEvicted atomic.Uint64
	}
}

// NewServer makes a software NAA on dev with no routines.
func NewServer(dev *roce.Device, opts ServerOptions) *Server {
	s := &Server{dev: dev, lim: DefaultServerLimits, max: 16, idle: DefaultIdleTimeout, mem: 1 << 30,
		rts: map[uint8]Routine{}, workers: map[*worker]struct{}{}}
	if opts.IdleTimeout != 0 {
		s.idle = max(opts.IdleTimeout, 0)
	}
	if opts.Limits != nil {
		s.lim = *opts.Limits
	}
	if opts.MaxConns > 0 {
		s.max = opts.MaxConns
	}
	if opts.MaxMemory > 0 {
		s.mem = opts.MaxMemory
	}
	s.log = opts.Logger
	return s
}

// Handle registers r for function code fn (1..127), replacing any routine
// there was.
func (s *Server) Handle(fn uint8, r Routine) error {
	if fn == 0 || fn > mrsp.FnCodeMask || r == nil {
		return fmt.Errorf("%w: function code %d", ErrInvalid, fn)
	}
	s.rtMu.Lock()
	s.rts[fn] = r
	s.rtMu.Unlock()
	return nil
}

func (s *Server) routine(fn uint8) Routine {
	s.rtMu.RLock()
	defer s.rtMu.RUnlock()
	return s.rts[fn]
}

// Counters returns a snapshot of the counters.
func (s *Server) Counters() ServerCounters {
	s.mu.Lock()
	active := uint64(s.active)
	s.mu.Unlock()
	c := &s.ctr
	return ServerCounters{Accepted: c.accepted.Load(), Rejected: c.rejected.Load(), Active: active,
		RPCs: c.rpcs.Load(), RPCErrors: c.rpcErrors.Load(), MRSPErrors: c.mrspErrors.Load(),
		UnknownFunction: c.unknownFn.Load(), HostAborts: c.hostAborts.Load(), OutOfOrder: c.outOfOrder.Load(),
		CompletionErrors: c.wcErrors.Load(), Disconnects: c.disconnects.Load(),
		IdleTimeouts: c.idleTimeouts.Load(), IdleEvicted: c.idleEvicted.Load()}
}

// ListenAndServe listens on addr (port 12345 is the C server's) and
// serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr netip.AddrPort) error {
	l, err := cm.Listen(ctx, s.dev, addr, cm.ListenOptions{})
	if err != nil {
		return err
	}
	defer l.Close()
	return s.Serve(ctx, l)
}

// Serve answers the connection requests of l until ctx ends or l closes,
// then waits for its connections to end (they end with ctx).
func (s *Server) Serve(ctx context.Context, l *cm.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := l.Request(ctx)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithCancelCause(ctx)
		w := &worker{s: s, m: mrsp.NewMachine(mrsp.NAA), cancel: cancel}
		if !s.admit(w) {
			cancel(nil)
			s.ctr.rejected.Add(1)
			_ = req.Reject(mad.RejConsumerDefined, []byte(mrsp.RejectOverload))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.leave(w)
			defer cancel(nil)
			s.serve(wctx, w, req)
		}()
	}
}

// admit gives w a slot, taking it from the connection idle longest if
// they are all taken: a host that connects and never sends its AAR, or
// stops between RPCs, must not keep a working one out.
func (s *Server) admit(w *worker) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active >= s.max {
		victim := s.idlestLocked(func(*worker) bool { return true })
		if victim == nil {
			return false
		}
		s.evictLocked(victim)
	}
	s.active++
	s.workers[w] = struct{}{}
	return true
}

func (s *Server) leave(w *worker) {
	s.mu.Lock()
	if _, ok := s.workers[w]; ok {
		delete(s.workers, w)
		s.active--
	}
	s.mu.Unlock()
}

// reserve takes n bytes of the memory budget for w. If the budget is
// spent, connections idle longest that hold memory give theirs up and are
// closed (evicted), as for a slot: announcing regions and going quiet
// must not keep a working host's AAR out.
func (s *Server) reserve(w *worker, n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.used+n > s.mem || s.used+n < s.used {
		victim := s.idlestLocked(func(v *worker) bool { return v != w && v.reserved > 0 })
		if victim == nil {
			return false
		}
		s.evictLocked(victim)
	}
	s.used += n
	w.reserved = n
	return true
}

// unreserve returns w's memory to the budget, once.
func (s *Server) unreserve(w *worker) {
	s.mu.Lock()
	s.used -= w.reserved
	w.reserved = 0
	s.mu.Unlock()
}

// idlestLocked returns the worker idle longest among those ok accepts.
func (s *Server) idlestLocked(ok func(*worker) bool) *worker {
	var victim *worker
	for v := range s.workers {
		if since := v.idleSince.Load(); since != 0 && ok(v) && (victim == nil || since < victim.idleSince.Load()) {
			victim = v
		}
	}
	return victim
}

// evictLocked closes an idle connection: its slot and memory are free at
// once (its goroutine closes the connection and the regions).
func (s *Server) evictLocked(v *worker) {
	delete(s.workers, v)
	s.active--
	s.used -= v.reserved
	v.reserved = 0
	v.cancel(errEvicted)
	s.ctr.idleEvicted.Add(1)
}

// acceptTimeout bounds a handshake whose peer never sends its RTU.
const acceptTimeout = 30 * time.Second

// serve runs one connection: accept, MRSP, RPCs until the host leaves.
func (s *Server) serve(ctx context.Context, w *worker, req *cm.Request) {
	defer w.release()
	if err := w.accept(ctx, req); err != nil {
		if s.log != nil {
			s.log.Warn("naaice: accept failed", "peer", req.RemoteAddr(), "err", err)
		}
		return
	}
	s.ctr.accepted.Add(1)
	// run returns only when the connection ends.
	err := w.run(ctx)
	switch {
	case errors.Is(err, errIdle):
		s.ctr.idleTimeouts.Add(1)
	case errors.Is(err, errEvicted):
		// counted by admit
	case errors.Is(err, ErrConnectionEnded):
		if w.m.State() != mrsp.DataReceiving || w.held {
			s.ctr.disconnects.Add(1)
		} else {
			err = nil // the host left between RPCs: the normal end
		}
	case errors.As(err, new(*mrsp.TransitionError)):
		s.ctr.outOfOrder.Add(1)
	case errors.As(err, new(*CompletionError)):
		s.ctr.wcErrors.Add(1)
	}
	if err != nil && s.log != nil && (ctx.Err() == nil || errors.Is(err, errEvicted)) {
		s.log.Warn("naaice: connection failed", "peer", w.conn.RemoteAddr(), "state", w.m.State(), "err", err)
	}
}

// worker is one connection of the server (the C library's worker).
type worker struct {
	s      *Server
	cancel context.CancelCauseFunc // ends the connection (evicted when idle)
	// idleSince is when the worker began waiting for the host's AAR or
	// next RPC (monotonic nanoseconds since serverEpoch), 0 while busy.
	idleSince atomic.Int64
	timer     *time.Timer // IdleTimeout's, reused

	m    *mrsp.Machine
	pd   *roce.PD
	cq   *roce.CQ
	conn *cm.Conn
	done <-chan struct{}

	sendBuf, recvBuf []byte
	sendMR, recvMR   *roce.MR
	regions          []mrsp.Region
	mrs              []*roce.MR
	call             Call
	reserved         uint64 // of the server's memory budget (Server.mu)

	batch     [16]roce.WorkCompletion
	next, end int
	// held is a host write-with-immediate that arrived before our own
	// write-back completed (its ACK was lost and the host went on).
	held   bool
	heldWC roce.WorkCompletion

	plan []mrsp.Write
	wrs  []roce.SendWR
	sges []roce.SGE
	rwr  roce.RecvWR
	rsge [1]roce.SGE
}

func (w *worker) accept(ctx context.Context, req *cm.Request) error {
	var err error
	dev := w.s.dev
	if w.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if w.cq, err = dev.CreateCQ(2*mrsp.MaxAAREntries + 8); err != nil {
		return err
	}
	w.sendBuf = make([]byte, mrsp.RecvBufLen)
	w.recvBuf = make([]byte, mrsp.RecvBufLen)
	if w.sendMR, err = w.pd.RegisterMR(w.sendBuf, roce.AccessLocalWrite); err != nil {
		return err
	}
	if w.recvMR, err = w.pd.RegisterMR(w.recvBuf, roce.AccessLocalWrite); err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, acceptTimeout)
	defer cancel()
	// The AAR's receive is posted before the REP leaves, as the C server
	// posts it before rdma_accept.
	w.conn, err = req.Accept(actx, cm.AcceptOptions{
		QP: cm.QPOptions{PD: w.pd, SendCQ: w.cq, RecvCQ: w.cq, SigAll: true,
			Cap:     roce.QPCap{MaxSendWR: mrsp.MaxAAREntries + 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1},
			Prepare: func(c *cm.Conn) error { return w.postRecv(c.QP(), wrMRSPRecv) }},
		ResponderResources: mrsp.ResponderResources, InitiatorDepth: mrsp.InitiatorDepth,
		RNRRetryCount: mrsp.RNRRetryCount,
	})
	if err != nil {
		return err
	}
	w.done = w.conn.Done()
	_ = w.m.Step(mrsp.EvConnectReq)
	_ = w.m.Step(mrsp.EvEstablished)
	w.call.Remote = w.conn.RemoteAddr()
	return nil
}

// postRecv posts a receive into the MRSP buffer: the AAR's, and (as a
// placeholder the host's writes with immediate do not touch) each RPC's;
// a SEND out of order lands there and is recognised.
func (w *worker) postRecv(q *roce.QP, id uint64) error {
	w.rsge[0] = w.recvMR.SGE(0, len(w.recvBuf))
	w.rwr = roce.RecvWR{ID: id, SGL: w.rsge[:]}
	return q.PostRecv(&w.rwr)
}

// serverEpoch is the origin of worker.idleSince.
var serverEpoch = time.Now()

// waitIdle is wait for the host's next move (its AAR, the next RPC): the
// worker is idle meanwhile, may be evicted for a new connection (ctx's
// cause), and gives up after the server's IdleTimeout. It reuses one
// timer: an RPC allocates nothing.
func (w *worker) waitIdle(ctx context.Context) (*roce.WorkCompletion, error) {
	w.idleSince.Store(max(int64(time.Since(serverEpoch)), 1))
	defer w.idleSince.Store(0)
	for i := 0; i < spinRounds && w.next == w.end && w.cq.Len() == 0; i++ {
		runtime.Gosched()
	}
	if w.s.idle > 0 && w.next == w.end && w.cq.Len() == 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(w.s.idle)
		} else {
			w.timer.Reset(w.s.idle)
		}
		defer w.timer.Stop()
		for w.cq.Len() == 0 {
			select {
			case <-w.cq.Ready():
			case <-w.done:
				return w.wait(ctx) // wait reports the end
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-w.timer.C:
				if w.cq.Len() == 0 {
					return nil, errIdle
				}
			}
		}
	}
	wc, err := w.wait(ctx)
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return wc, err
}

// wait returns the next completion, in order.
func (w *worker) wait(ctx context.Context) (*roce.WorkCompletion, error) {
	for w.next == w.end {
		w.next, w.end = 0, w.cq.Poll(w.batch[:])
		if w.end > 0 {
			break
		}
		if err := waitCQ(ctx, w.cq, w.done); err != nil {
			return nil, err
		}
	}
	wc := &w.batch[w.next]
	w.next++
	if wc.Status != roce.WCSuccess {
		return nil, &CompletionError{Status: wc.Status, Opcode: wc.Opcode}
	}
	return wc, nil
}

func (w *worker) outOfOrder(ev mrsp.Event) error {
	return &mrsp.TransitionError{Role: mrsp.NAA, State: w.m.State(), Event: ev}
}

func wcEvent(wc *roce.WorkCompletion) mrsp.Event {
	switch wc.Opcode {
	case roce.WCSend:
		return mrsp.EvSendDone
	case roce.WCRecv:
		return mrsp.EvRecvAAR
	case roce.WCRDMAWrite:
		return mrsp.EvWriteDone
	case roce.WCRecvRDMAWithImm:
		return mrsp.EvRecvImm
	}
	return mrsp.EvCMError
}

func (w *worker) run(ctx context.Context) error {
	_ = w.m.Step(mrsp.EvWorkerStart)
	if err := w.mrsp(ctx); err != nil {
		return err
	}
	for {
		var wc *roce.WorkCompletion
		if w.held {
			w.held = false
			wc = &w.heldWC
		} else {
			var err error
			if wc, err = w.waitIdle(ctx); err != nil {
				return err
			}
		}
		if wc.Opcode != roce.WCRecvRDMAWithImm {
			return w.outOfOrder(wcEvent(wc))
		}
		if err := w.rpc(ctx, wc.Imm); err != nil {
			return err
		}
	}
}

// mrsp answers the host's AAR: regions allocated and an A, or an ERR.
func (w *worker) mrsp(ctx context.Context) error {
	wc, err := w.waitIdle(ctx)
	if err != nil {
		return err
	}
	if wc.Opcode != roce.WCRecv {
		return w.outOfOrder(wcEvent(wc))
	}
	msg := w.recvBuf[:min(int(wc.ByteLen), len(w.recvBuf))]
	w.regions, err = mrsp.ParseAAR(msg, &w.s.lim, w.regions[:0])
	if err == nil {
		err = w.allocate()
	}
	if err != nil {
		w.s.ctr.mrspErrors.Add(1)
		_ = w.m.Step(mrsp.EvRecvBadAAR)
		code := mrsp.CodeNoMemory
		var me *mrsp.Error
		if errors.As(err, &me) && me.Code != 0 {
			code = me.Code
		}
		w.send(ctx, mrsp.AppendErr(w.sendBuf[:0], code))
		return fmt.Errorf("naaice: AAR refused with code %d: %w", code, err)
	}
	adv := make([]mrsp.Advert, len(w.mrs))
	for i, mr := range w.mrs {
		adv[i] = mrsp.Advert{Addr: mr.Addr(), RKey: mr.RKey(), Size: uint32(mr.Len())}
	}
	a, err := mrsp.AppendA(w.sendBuf[:0], adv)
	if err != nil {
		return err
	}
	// The first RPC's receive goes before the A, so a host that writes at
	// once never meets an empty receive queue.
	if err := w.postRecv(w.conn.QP(), wrDataRecv); err != nil {
		return err
	}
	_ = w.m.Step(mrsp.EvRecvAAR)
	if err := w.send(ctx, a); err != nil {
		return err
	}
	_ = w.m.Step(mrsp.EvSendDone)
	return w.m.Step(mrsp.EvPostRecv)
}

// allocate makes the NAA memory of the AAR's regions.
func (w *worker) allocate() error {
	var total uint64
	outputs := 0
	for _, r := range w.regions {
		total += uint64(r.Size)
		if r.Flags&mrsp.FlagOutput != 0 {
			outputs++
		}
	}
	if !w.s.reserve(w, total) {
		return errNAAFull
	}
	for _, r := range w.regions {
		buf := make([]byte, r.Size)
		if r.Internal() {
			w.call.Internal = append(w.call.Internal, buf)
			continue
		}
		mr, err := w.pd.RegisterMR(buf, roce.AccessLocalWrite|roce.AccessRemoteWrite)
		if err != nil {
			return errNAAMemory
		}
		w.mrs = append(w.mrs, mr)
		w.call.Regions = append(w.call.Regions, buf)
		w.call.Flags = append(w.call.Flags, r.Flags)
	}
	w.plan = make([]mrsp.Write, 0, outputs+1)
	w.wrs = make([]roce.SendWR, outputs+1)
	w.sges = make([]roce.SGE, outputs+1)
	return nil
}

// send posts an MRSP message (SEND, solicited) and waits for its
// completion. A host write with immediate that overtakes it is held.
func (w *worker) send(ctx context.Context, msg []byte) error {
	var sge [1]roce.SGE
	sge[0] = w.sendMR.SGE(0, len(msg))
	if err := w.conn.QP().PostSend(&roce.SendWR{ID: wrMRSPSend, Opcode: roce.WRSend,
		Flags: roce.SendSignaled | roce.SendSolicited, SGL: sge[:]}); err != nil {
		return err
	}
	for {
		wc, err := w.wait(ctx)
		if err != nil {
			return err
		}
		switch {
		case wc.Opcode == roce.WCSend:
			return nil
		case wc.Opcode == roce.WCRecvRDMAWithImm && !w.held && w.m.State() == mrsp.MRSPSending:
			w.held, w.heldWC = true, *wc
		default:
			return w.outOfOrder(wcEvent(wc))
		}
	}
}

// rpc runs one RPC started by the host's immediate and writes back.
func (w *worker) rpc(ctx context.Context, imm uint32) error {
	fn, user, err := mrsp.ParseHostImm(imm)
	if err != nil {
		_ = w.m.Step(mrsp.EvRecvAbort)
		w.s.ctr.hostAborts.Add(1)
		return fmt.Errorf("naaice: RPC %d: %w", w.call.RPC, err)
	}
	if err := w.m.Step(mrsp.EvRecvImm); err != nil {
		return err
	}
	// The next RPC's receive goes before the write-back that lets the host
	// start it.
	if err := w.postRecv(w.conn.QP(), wrDataRecv); err != nil {
		return err
	}
	w.call.FnCode, w.call.User = fn, user
	rc := w.runRoutine(ctx)
	if rc != 0 {
		w.s.ctr.rpcErrors.Add(1)
	}
	var plan []mrsp.Write
	if rc == 0 {
		plan, err = mrsp.NAAWrites(w.regions, 0, w.plan[:0])
	}
	if rc != 0 || errors.Is(err, mrsp.ErrNoWrites) {
		// An error, or no outputs: only the immediate, on a zero-length
		// write to the host's first region.
		var a mrsp.Write
		a, err = mrsp.NAAAbort(w.regions, rc)
		plan = append(w.plan[:0], a)
	}
	if err != nil {
		return err
	}
	for i, p := range plan {
		n := int(p.Len)
		w.sges[i] = w.mrs[p.Region].SGE(0, n)
		wr := &w.wrs[i]
		*wr = roce.SendWR{ID: wrWrite + uint64(p.Region), Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
			SGL: w.sges[i : i+1], RemoteAddr: p.RemoteAddr, RKey: p.RKey}
		if n == 0 {
			wr.SGL = nil
		}
		if p.WithImm {
			wr.Opcode, wr.Imm = roce.WRRDMAWriteWithImm, p.Imm
			wr.Flags |= roce.SendSolicited
		}
	}
	if err := w.m.StartData(len(plan)); err != nil {
		return err
	}
	if _, err := w.conn.QP().PostSendBatch(w.wrs[:len(plan)]); err != nil {
		return err
	}
	for w.m.State() == mrsp.DataSending {
		wc, err := w.wait(ctx)
		if err != nil {
			return err
		}
		if wc.Opcode == roce.WCRecvRDMAWithImm && !w.held {
			w.held, w.heldWC = true, *wc
			continue
		}
		if wc.Opcode != roce.WCRDMAWrite {
			return w.outOfOrder(wcEvent(wc))
		}
		if err := w.m.Step(mrsp.EvWriteDone); err != nil {
			return err
		}
	}
	w.call.RPC++
	w.s.ctr.rpcs.Add(1)
	return nil
}

func (w *worker) runRoutine(ctx context.Context) (rc uint8) {
	r := w.s.routine(w.call.FnCode)
	if r == nil {
		w.s.ctr.unknownFn.Add(1)
		return RCUnknownFunction
	}
	defer func() {
		if recover() != nil {
			rc = RCRoutinePanic
		}
	}()
	return r(ctx, &w.call)
}

func (w *worker) release() {
	if w.conn != nil {
		_ = w.conn.Close()
	}
	for _, mr := range w.mrs {
		_ = mr.Close()
	}
	for _, mr := range []*roce.MR{w.sendMR, w.recvMR} {
		if mr != nil {
			_ = mr.Close()
		}
	}
	if w.cq != nil {
		_ = w.cq.Close()
	}
	if w.pd != nil {
		_ = w.pd.Close()
	}
	w.s.unreserve(w)
}
