package cm

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// Admission defaults of a Listener (ListenOptions).
const (
	// DefaultMaxHalfOpen is the default bound on half-open handshakes,
	// Linux's tcp_max_syn_backlog for a small host.
	DefaultMaxHalfOpen = 256
	// DefaultHalfOpenTimeout is the default lifetime of a half-open
	// handshake: the REP goes out at most every 2 s, four times; a real
	// peer answers the first within a round trip.
	DefaultHalfOpenTimeout = 8 * time.Second
)

// ErrHalfOpenDropped ends a half-open handshake displaced by a newer one
// (ListenOptions.MaxHalfOpen).
var ErrHalfOpenDropped = errors.New("cm: half-open handshake dropped for a newer request (listener's MaxHalfOpen)")

// ListenerStats counts a listener's admission decisions.
type ListenerStats struct {
	HalfOpen         int    // handshakes half-open now (being answered, no RTU yet)
	HalfOpenDropped  uint64 // half-open handshakes abandoned for newer ones (MaxHalfOpen)
	HalfOpenTimedOut uint64 // half-open handshakes whose REP retries ran out (HalfOpenTimeout)
}

// Listener accepts rdma_cm connections on one port of one device.
//
// Requests wait in the listener until Accept or Request takes them. Accept
// answers each in the background and returns established connections
// only. A request being answered leaves the backlog for the
// half-open table (ListenOptions.MaxHalfOpen, HalfOpenTimeout), so a peer
// that never completes its handshake (no RTU) holds no backlog slot and
// delays no one else.
type Listener struct {
	a    *agent
	addr netip.AddrPort
	sid  uint64
	opts ListenOptions
	// reqs holds received requests no one took yet, ready the
	// connections Accept's handshakes established and Accept has not
	// returned. Neither send blocks: both hold at most pending entries.
	reqs  chan *Request
	ready chan *Conn

	// guarded by a.mu
	pending   int                   // requests held until answered or returned by Accept (≤ Backlog)
	accepting bool                  // Accept was called: requests are answered as they come
	taken     map[*Request]struct{} // handed out by Request, not yet answered
	shut      bool
	halfOpen  list.List // of *Request, oldest first
	stats     ListenerStats

	ctx    context.Context // ends Accept's background handshakes on Close
	cancel context.CancelFunc
	closed chan struct{}
	once   sync.Once
}

// Listen starts accepting connection requests for addr's port (the
// rdma_cm port) on dev, like rdma_bind_addr + rdma_listen. An unspecified
// address accepts requests for any of the device's addresses.
func Listen(ctx context.Context, dev *roce.Device, addr netip.AddrPort, opts ListenOptions) (*Listener, error) {
	return listen(ctx, func() (*agent, error) { return acquire(dev) }, addr, opts)
}

func listen(ctx context.Context, get func() (*agent, error), addr netip.AddrPort, o ListenOptions) (*Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.PortSpace == 0 {
		o.PortSpace = mad.PortSpaceTCP
	}
	if o.PortSpace != mad.PortSpaceTCP && o.PortSpace != mad.PortSpaceUDP {
		return nil, fmt.Errorf("%w: port space %v", ErrInvalid, o.PortSpace)
	}
	if err := checkReplyData(o.PortSpace, o.PrivateData); err != nil {
		return nil, err
	}
	if o.Backlog <= 0 {
		o.Backlog = 16
	}
	if o.MaxHalfOpen <= 0 {
		o.MaxHalfOpen = max(DefaultMaxHalfOpen, o.Backlog)
	}
	if o.HalfOpenTimeout <= 0 {
		o.HalfOpenTimeout = DefaultHalfOpenTimeout
	}
	a, err := get()
	if err != nil {
		return nil, err
	}
	select {
	case <-a.dev.Done():
		// The agent outlives its device only until its references go; a
		// listener on it would never hear a request.
		a.release()
		return nil, fmt.Errorf("cm: listen on %v: %w", addr, errDeviceClosed)
	default:
	}
	l := &Listener{a: a, addr: addr, sid: mad.ServiceID(o.PortSpace, addr.Port()), opts: o,
		reqs: make(chan *Request, o.Backlog), ready: make(chan *Conn, o.Backlog+o.MaxHalfOpen),
		taken: map[*Request]struct{}{}, closed: make(chan struct{})}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	err = a.do(func(e *Engine) error {
		if err := e.Listen(l.sid); err != nil {
			return fmt.Errorf("cm: listen on %v: %w", addr, err)
		}
		a.listeners[l.sid] = l
		return nil
	})
	if err != nil {
		l.cancel()
		a.release()
		return nil, err
	}
	return l, nil
}

// checkReplyData bounds the private data of a REP or SIDR_REP.
func checkReplyData(ps mad.PortSpace, pd []byte) error {
	limit := mad.REPPrivateDataSize
	if ps == mad.PortSpaceUDP {
		limit = mad.SIDRREPPrivateDataSize
	}
	if len(pd) > limit {
		return fmt.Errorf("%w: %d bytes of reply private data, at most %d", ErrInvalid, len(pd), limit)
	}
	return nil
}

// Addr returns the address the listener was created with.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// Stats returns the listener's admission counters.
func (l *Listener) Stats() ListenerStats {
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	s := l.stats
	s.HalfOpen = l.halfOpen.Len()
	return s
}

// startLocked gives r, about to be answered, the context of its
// handshake and moves it from the backlog to the half-open table at
// once: the QP, the neighbour and the REP take time, and under a flood
// the backlog must not wait for them. The oldest half-open handshake is
// abandoned if the table is full. The caller holds a.mu.
func (l *Listener) startLocked(r *Request, parent context.Context) {
	r.hctx, r.cancel = context.WithCancelCause(parent)
	if l.shut {
		return
	}
	l.freeSlotLocked(r)
	r.halfOpen = l.halfOpen.PushBack(r)
	for l.halfOpen.Len() > l.opts.MaxHalfOpen {
		old := l.halfOpen.Remove(l.victimLocked(r)).(*Request)
		old.halfOpen = nil
		// Its handshake goroutine sends the REJ and frees the QP. A REJ
		// rather than silence: a real peer cut off this way learns it at
		// once instead of believing itself connected after its RTU, and
		// to a spoofed address it is one MAD, like the REP before it.
		old.cancel(ErrHalfOpenDropped)
		l.stats.HalfOpenDropped++
	}
}

// victimLocked picks the half-open handshake to abandon for r: the oldest
// one that has not sent its REP, else the oldest. A REQ spoofed from an
// address that answers no ARP or neighbour solicitation never gets as far
// as its REP, so under such a flood a real peer, whose REP went out and
// whose RTU is on its way, keeps its place however slowly it answers; a
// REQ spoofed from a real host's address gets a REP that host rejects.
func (l *Listener) victimLocked(r *Request) *list.Element {
	for e := l.halfOpen.Front(); e != nil; e = e.Next() {
		if v := e.Value.(*Request); v != r && !v.repQueued {
			return e
		}
	}
	return l.halfOpen.Front()
}

// leaveHalfOpenLocked takes r out of the half-open table if it is there.
func (l *Listener) leaveHalfOpenLocked(r *Request) {
	if r.halfOpen != nil {
		l.halfOpen.Remove(r.halfOpen)
		r.halfOpen = nil
	}
}

// freeSlotLocked returns r's backlog slot, once.
func (l *Listener) freeSlotLocked(r *Request) {
	if !r.slotFreed {
		r.slotFreed = true
		l.pending--
	}
}

// offerLocked queues a request if it is one rdma_cm would give this
// listener and the backlog has room.
func (l *Listener) offerLocked(ev Event) bool {
	if l.shut {
		return false
	}
	// cma_check_req_qp_type: RC REQs for the TCP port space, SIDR for UDP.
	switch ev.Type {
	case EventRequest:
		if l.opts.PortSpace != mad.PortSpaceTCP || ev.REQ == nil || ev.REQ.Transport != mad.TransportRC {
			return false
		}
	case EventSIDRRequest:
		if l.opts.PortSpace != mad.PortSpaceUDP {
			return false
		}
	default:
		return false
	}
	h, err := mad.ParseCMAHeader(ev.PrivateData)
	if err != nil {
		return false // cma.c refuses a bad header; the IB CM then sends REJ 28
	}
	// The rdma_cm lookup by the cma_hdr destination.
	if a := l.addr.Addr(); a.IsValid() && !a.IsUnspecified() && h.Dst() != a.Unmap() {
		return false
	}
	if l.pending >= l.opts.Backlog {
		return false
	}
	r := &Request{l: l, ev: ev, remote: netip.AddrPortFrom(h.Src(), h.SrcPort()),
		local: netip.AddrPortFrom(ev.Path.Local, l.addr.Port()), privateData: ev.PrivateData[mad.CMAHeaderSize:]}
	if l.accepting {
		// Accept answers every request itself, so it starts the
		// handshake now, half-open, as a SYN enters the SYN queue: a
		// burst of requests handled in one go by the agent must not
		// overflow the backlog before Accept's goroutine runs.
		r.answered.Store(true)
		r.slotFreed = true
		l.startLocked(r, l.ctx)
		go l.background(r)
		return true
	}
	l.pending++
	l.reqs <- r
	return true
}

// releaseSlot frees the backlog slot of a connection Accept returns.
func (l *Listener) releaseSlot() {
	l.a.mu.Lock()
	l.pending--
	l.a.mu.Unlock()
}

// receive takes the next request for Request.
func (l *Listener) receive(ctx context.Context) (*Request, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closed:
		return nil, ErrClosed
	case r := <-l.reqs:
		if !l.admit(r, true) {
			return nil, ErrClosed
		}
		return r, nil
	}
}

// admit records a request taken from the queue: handed out to the caller
// of Request (answered later) or claimed by Accept's background handshake.
// It reports false, refusing r, if Close ran between the receive and the
// lock and so could not see r in the queue.
func (l *Listener) admit(r *Request, handOut bool) bool {
	a := l.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.shut {
		if r.answered.CompareAndSwap(false, true) {
			a.refuseLocked(r.ev)
			l.pending--
		}
		a.poke()
		return false
	}
	if handOut {
		l.taken[r] = struct{}{}
	} else {
		r.answered.Store(true)
		l.startLocked(r, l.ctx)
	}
	return true
}

// Request waits for the next connection request and hands it out
// unanswered, like rdma_get_request: the caller inspects it and answers
// with Request.Accept (its own QP options and private data) or
// Request.Reject. Until answered it holds a backlog slot; once
// Request.Accept is called it is half-open instead (ListenOptions.MaxHalfOpen,
// HalfOpenTimeout) until the RTU. Answer each
// request in its own goroutine when peers may be slow: Request.Accept
// returns only once the handshake completes.
func (l *Listener) Request(ctx context.Context) (*Request, error) {
	return l.receive(ctx)
}

// Accept returns the next established connection, accepting requests with
// the ListenOptions: it creates the QP, moves it to RTS with the
// negotiated attributes, sends the REP and returns once the RTU came (RC),
// or answers the SIDR_REQ with the UD QP (UDP port space). Handshakes run
// in the background, so one peer that never finishes its handshake does
// not delay the others. From the first call on, the listener starts each
// handshake as its request arrives (half-open, bounded by MaxHalfOpen and
// HalfOpenTimeout); at most Backlog established connections wait for
// Accept before further requests are refused.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	l.a.mu.Lock()
	l.accepting = true
	l.a.mu.Unlock()
	for {
		select {
		case c := <-l.ready:
			l.releaseSlot()
			return c, nil
		default:
		}
		select {
		case c := <-l.ready:
			l.releaseSlot()
			return c, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closed:
			return nil, ErrClosed
		case r := <-l.reqs:
			if l.admit(r, false) {
				go l.background(r)
			}
		}
	}
}

// background runs one handshake for Accept. The established connection
// takes a backlog slot again and waits in ready until Accept returns it;
// it may pass Backlog (ready has room for the half-open ones too), and
// new requests are refused until Accept catches up.
func (l *Listener) background(r *Request) {
	c, err := r.accept(&AcceptOptions{QP: l.opts.QP, ResponderResources: l.opts.ResponderResources,
		InitiatorDepth: l.opts.InitiatorDepth, RNRRetryCount: l.opts.RNRRetryCount, PrivateData: l.opts.PrivateData})
	if err != nil {
		return // the peer gave up or rejected our REP, or we closed; accept freed the slot
	}
	l.a.mu.Lock()
	if !l.shut {
		select {
		case l.ready <- c:
			l.pending++
			l.a.mu.Unlock()
			return
		default:
		}
	}
	l.a.mu.Unlock()
	_ = c.Close()
}

// Close stops listening: requests not yet answered are rejected,
// handshakes in progress are abandoned (REJ), and connections established
// but not yet returned by Accept are closed. A second Close, and Accept or
// Request after Close, return ErrClosed.
func (l *Listener) Close() error {
	err := error(ErrClosed)
	l.once.Do(func() {
		err = nil
		close(l.closed)
		l.cancel()
		var conns []*Conn
		_ = l.a.do(func(e *Engine) error {
			l.shut = true
			e.Unlisten(l.sid)
			if l.a.listeners[l.sid] == l {
				delete(l.a.listeners, l.sid)
			}
			for r := range l.taken {
				if r.answered.CompareAndSwap(false, true) {
					l.a.refuseLocked(r.ev)
					l.pending--
				}
			}
			clear(l.taken)
			for {
				select {
				case r := <-l.reqs:
					if r.answered.CompareAndSwap(false, true) {
						l.a.refuseLocked(r.ev)
						l.pending--
					}
				case c := <-l.ready:
					conns = append(conns, c)
					l.pending--
				default:
					return nil
				}
			}
		})
		for _, c := range conns {
			_ = c.Close()
		}
		l.a.release()
	})
	return err
}

// Request is a connection request (REQ) or SIDR request received by a
// Listener and not yet answered: rdma_cm's RDMA_CM_EVENT_CONNECT_REQUEST.
type Request struct {
	l             *Listener
	ev            Event
	remote, local netip.AddrPort
	privateData   []byte
	answered      atomic.Bool

	// guarded by a.mu
	slotFreed bool          // its backlog slot is returned
	halfOpen  *list.Element // in l.halfOpen
	// repQueued: its peer's address resolved and the REP is on its way
	// (a.mu), so its RTU may come at any moment; a flood is dropped first.
	repQueued bool
	hctx      context.Context         // of its handshake (startLocked)
	cancel    context.CancelCauseFunc // ends its handshake
}

// RemoteAddr returns the peer's address and rdma_cm port (from the
// rdma_cm header).
func (r *Request) RemoteAddr() netip.AddrPort { return r.remote }

// LocalAddr returns the address the request came to and the listener's
// port.
func (r *Request) LocalAddr() netip.AddrPort { return r.local }

// PrivateData returns the user part of the request's private data (after
// the rdma_cm header): 56 bytes for a REQ, 180 for a SIDR_REQ, zero-padded
// past what the peer wrote.
func (r *Request) PrivateData() []byte { return r.privateData }

// SIDR reports whether the request is a SIDR_REQ (UDP port space).
func (r *Request) SIDR() bool { return r.ev.Type == EventSIDRRequest }

// REQ returns the fields of the REQ (nil for SIDR): the offered responder
// resources and initiator depth, path MTU, retry counts, timeouts.
func (r *Request) REQ() *mad.REQFields { return r.ev.REQ }

// ResponderResources returns the RDMA reads and atomics the peer accepts
// at once (0 for SIDR); it bounds our initiator depth.
func (r *Request) ResponderResources() uint8 {
	if r.ev.REQ == nil {
		return 0
	}
	return r.ev.REQ.ResponderResources
}

// InitiatorDepth returns the RDMA reads and atomics the peer issues at
// once (0 for SIDR); it bounds our responder resources.
func (r *Request) InitiatorDepth() uint8 {
	if r.ev.REQ == nil {
		return 0
	}
	return r.ev.REQ.InitiatorDepth
}

// PathMTU returns the path MTU of the request (0 for SIDR).
func (r *Request) PathMTU() ib.MTU {
	if r.ev.REQ == nil {
		return 0
	}
	return r.ev.REQ.PathMTU
}

// AcceptOptions configure Request.Accept (rdma_accept's conn_param).
type AcceptOptions struct {
	// QP says how the connection's QP is made, including its access flags
	// and the Prepare hook.
	QP QPOptions
	// ResponderResources / InitiatorDepth: the most we grant (0: 16), each
	// capped by the peer's offer (its initiator depth / responder
	// resources).
	ResponderResources, InitiatorDepth uint8
	// RNRRetryCount for the peer's QP (0: 7).
	RNRRetryCount uint8
	// PrivateData is sent in the REP (at most 196 bytes) or SIDR_REP (136).
	PrivateData []byte
}

// claim makes the caller the one who answers r.
func (r *Request) claim() bool {
	l := r.l
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	if !r.answered.CompareAndSwap(false, true) {
		return false
	}
	delete(l.taken, r)
	return true
}

// Accept accepts the request with the connection's own options: it
// creates the QP, moves it to RTS, sends the REP and returns once the RTU
// came (RC), or answers the SIDR_REQ with the UD QP. If ctx ends first,
// the handshake is abandoned with a REJ.
func (r *Request) Accept(ctx context.Context, o AcceptOptions) (*Conn, error) {
	ps := mad.PortSpaceTCP
	if r.SIDR() {
		ps = mad.PortSpaceUDP
	}
	if err := checkReplyData(ps, o.PrivateData); err != nil {
		return nil, err
	}
	if !r.claim() {
		return nil, errAnswered
	}
	r.l.a.mu.Lock()
	r.l.startLocked(r, ctx)
	r.l.a.mu.Unlock()
	return r.accept(&o)
}

// Reject refuses the request like rdma_reject: a REJ with reason (0:
// mad.RejConsumerDefined) and up to 148 bytes of private data, or for a
// SIDR request a SIDR_REP REJECT with up to 136 bytes.
func (r *Request) Reject(reason mad.RejectReason, privateData []byte) error {
	if reason == 0 {
		reason = mad.RejConsumerDefined
	}
	limit := mad.REJPrivateDataSize
	if r.SIDR() {
		limit = mad.SIDRREPPrivateDataSize
	}
	if len(privateData) > limit {
		return fmt.Errorf("%w: %d bytes of reject private data, at most %d", ErrInvalid, len(privateData), limit)
	}
	if !r.claim() {
		return errAnswered
	}
	a := r.l.a
	return a.do(func(e *Engine) error {
		r.l.freeSlotLocked(r)
		if r.SIDR() {
			return e.SIDRReply(r.ev.ID, mad.SIDRReject, 0, 0, privateData)
		}
		// errUnknownID: the peer gave up already.
		return e.Reject(r.ev.ID, reason, nil, privateData)
	})
}

// accept answers r (claimed by the caller, and half-open: startLocked)
// and waits for the RTU.
func (r *Request) accept(o *AcceptOptions) (*Conn, error) {
	l, ev := r.l, r.ev
	a := l.a
	ctx, cancel := r.hctx, r.cancel
	defer func() {
		cancel(nil)
		a.mu.Lock()
		l.leaveHalfOpenLocked(r)
		l.freeSlotLocked(r)
		a.mu.Unlock()
	}()
	c := &Conn{a: a, id: ev.ID, st: newIDState(), remote: r.remote, local: r.local, privateData: r.privateData}
	a.mu.Lock()
	a.refs++
	a.mu.Unlock()
	refuse := func(err error) (*Conn, error) {
		_ = a.do(func(e *Engine) error {
			if ev.Type == EventSIDRRequest {
				_ = e.SIDRReply(ev.ID, mad.SIDRReject, 0, 0, nil)
			} else {
				_ = e.Destroy(ev.ID)
			}
			delete(a.ids, ev.ID)
			return nil
		})
		return c.fail(err)
	}
	typ := roce.RC
	if ev.Type == EventSIDRRequest {
		typ = roce.UD
	}
	if err := c.newQP(a.dev, &o.QP, typ); err != nil {
		return refuse(err)
	}
	if _, err := a.dev.ResolveNeighbour(ctx, ev.Path.Remote); err != nil {
		return refuse(err)
	}
	if typ == roce.UD {
		if err := c.readyUD(ctx, ev.Path.Local, ev.Path.Remote); err != nil {
			return refuse(err)
		}
		if err := a.do(func(e *Engine) error {
			return e.SIDRReply(ev.ID, mad.SIDRSuccess, c.qp.QPN(), mad.UDPQKey, o.PrivateData)
		}); err != nil {
			return refuse(err)
		}
		return c, nil
	}
	req := ev.REQ
	var qerr error
	err := a.do(func(e *Engine) error {
		a.ids[c.id] = c.st
		c.startPSN = randPSN()
		err := e.Accept(c.id, &AcceptParams{QPN: c.qp.QPN(), StartingPSN: c.startPSN,
			ResponderResources: min(defaultU8(o.ResponderResources, 16), req.InitiatorDepth),
			InitiatorDepth:     min(defaultU8(o.InitiatorDepth, 16), req.ResponderResources),
			RNRRetryCount:      defaultU8(o.RNRRetryCount, 7), PrivateData: o.PrivateData,
			REPLifetime: l.opts.HalfOpenTimeout})
		if err != nil {
			return err
		}
		// RTR and RTS before the REP leaves (it is only queued), as
		// cma_accept_ib does, so the peer's first packets find the QP ready.
		if qerr = c.modifyFromCM(ctx, e); qerr != nil {
			_ = e.Reject(c.id, mad.RejConsumerDefined, nil, nil)
			return nil
		}
		r.repQueued = true
		return nil
	})
	if err != nil || qerr != nil {
		return refuse(errors.Join(err, qerr))
	}
	for {
		select {
		case <-ctx.Done():
			return refuse(context.Cause(ctx))
		case ev := <-c.st.events:
			switch ev.Type {
			case EventEstablished:
				return c, nil
			case EventTimeout:
				a.mu.Lock()
				l.stats.HalfOpenTimedOut++
				a.mu.Unlock()
				return refuse(fmt.Errorf("cm: accept from %v: %w", c.remote, ev.Err))
			case EventRejected:
				return refuse(fmt.Errorf("cm: accept from %v: %w", c.remote, ev.Err))
			case EventDisconnected:
				// The RTU was lost and the peer already hung up.
				return refuse(fmt.Errorf("cm: accept from %v: %w", c.remote, ErrClosed))
			}
		}
	}
}
