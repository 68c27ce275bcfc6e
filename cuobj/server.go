package cuobj

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// ServerOptions configure NewServer.
type ServerOptions struct {
	// Proto is the descriptor protocol (default ProtoRC).
	Proto Proto
	// Tunables (nil: DefaultTunables()).
	Tunables *Tunables
	// Manager is the CM to dial clients with (nil: the package-level
	// cm.Dial on the device).
	Manager *cm.Manager
	// Telemetry (nil: errors to slog.Default()).
	Telemetry *Telemetry
	// PathMTU of the RC connections or DCIs (0: rdma_cm's choice from
	// the device's netdev MTU for RC, the port's active MTU for DC). The
	// client's side must carry it too: set it when the two ends' links
	// differ.
	PathMTU ib.MTU
}

// Server is a cuObject server endpoint (cuObjServer). Channel allocation
// and buffer registration are safe for concurrent use; a channel is used
// by one goroutine at a time (a second one is refused with ErrChannel).
// A request whose token names, by the client's QPN, the connection of
// another channel (a memory window bound to that QP) runs on that channel
// for its duration: the channel's own user waits meanwhile
// (ServerStats.Borrowed counts such requests).
type Server struct {
	dev   *roce.Device
	addr  netip.AddrPort
	local netip.Addr // source address for clients; invalid: by family
	proto Proto
	t     Tunables
	pd    *roce.PD
	rcq   *roce.CQ
	tr    transport
	telem *telemetry

	mu        sync.Mutex // channel allocation
	chans     []*channel
	perClient map[netip.Addr]int // channels held per client address (AllocateChannelFor)
	held      atomic.Int64       // bytes reserved (Reserve)
	closed    atomic.Bool

	stats ServerStats
}

// ServerStats counts what a server did.
type ServerStats struct {
	Gets, Puts         atomic.Uint64 // requests completed successfully, asynchronous ones too
	GetBytes, PutBytes atomic.Uint64
	Failed             atomic.Uint64 // failed completions
	Resets             atomic.Uint64 // QP resets after failures
	Refused            atomic.Uint64 // requests refused before submission
	// Admission refusals (each also an ErrOverloaded or
	// ErrConnectTimeout to the caller).
	RefusedClientChannels atomic.Uint64 // a client address at MaxChannelsPerClient
	RefusedNoChannel      atomic.Uint64 // AllocateChannelFor with every channel in use
	RefusedMemory         atomic.Uint64 // Reserve past MaxHeldBytes
	ConnectTimeouts       atomic.Uint64 // clients that did not answer within ConnectTimeout
	Stray                 atomic.Uint64 // completions with no request outstanding on their channel, ignored
	// Borrowed counts requests carried by another channel's connection:
	// their token names its client QPN (a memory window bound to it).
	Borrowed atomic.Uint64
}

// NewServer starts a server endpoint on dev at addr (the cuObjServer
// constructor plus startRDMASession). addr is an IPv4 or IPv6 address of
// the device, or unspecified to serve clients of either family from the
// device's address of their family; its port names the endpoint (RC
// connects out from rdma_cm ports of its own). Errors match ENODEV (the
// address is not the device's, the device is closed), EINVAL (tunables)
// or ErrUnsupported (an unknown protocol).
func NewServer(dev *roce.Device, addr netip.AddrPort, o ServerOptions) (*Server, error) {
	const op = "NewServer"
	if dev == nil {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "no device")
	}
	switch o.Proto {
	case 0:
		o.Proto = ProtoRC
	case ProtoRC, ProtoDC:
	default:
		return nil, newErr(op, syscall.EPROTONOSUPPORT, ErrUnsupported, "%v", o.Proto)
	}
	t := DefaultTunables()
	if o.Tunables != nil {
		t = *o.Tunables
	}
	t, notes, err := t.normalize()
	if err != nil {
		return nil, err
	}
	s := &Server{dev: dev, addr: addr, proto: o.Proto, t: t, telem: newTelemetry(o.Telemetry, "cuobj-server")}
	for _, n := range notes {
		s.telem.error("tunable", "note", n)
	}
	a := addr.Addr().Unmap()
	if !a.IsValid() {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "invalid endpoint address")
	}
	if !a.IsUnspecified() {
		if _, err := dev.GIDIndex(a); err != nil {
			return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "%v is not an address of the device: %v", a, err)
		}
		s.local = a
	}
	if s.pd, err = dev.AllocPD(); err != nil {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "%v", err)
	}
	if s.rcq, err = dev.CreateCQ(1); err != nil {
		_ = s.pd.Close()
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "%v", err)
	}
	if o.Proto == ProtoDC {
		s.tr = newDCTransport(s.pd, s.local, &s.t, o.PathMTU)
	} else {
		s.tr = s.rcTransport(o)
	}
	s.chans = make([]*channel, t.NumDCIs)
	s.perClient = map[netip.Addr]int{}
	s.telem.info("server started", "addr", addr, "proto", s.proto, "channels", t.NumDCIs)
	return s, nil
}

func (s *Server) rcTransport(o ServerOptions) *rcTransport {
	dev := s.dev
	dial := func(ctx context.Context, raddr netip.AddrPort, d cm.DialOptions) (*cm.Conn, error) {
		return cm.Dial(ctx, dev, raddr, d)
	}
	if o.Manager != nil {
		dial = o.Manager.Dial
	}
	return &rcTransport{dial: dial, pd: s.pd, rcq: s.rcq, local: s.local, t: &s.t, mtu: o.PathMTU, byPeer: map[rcPeer]*rcConn{}}
}

// Addr returns the endpoint address.
func (s *Server) Addr() netip.AddrPort { return s.addr }

// Tunables returns the tunables in effect, after the caps
// (getConfigTunableParam).
func (s *Server) Tunables() Tunables { return s.t }

// Stats returns the server's counters.
func (s *Server) Stats() *ServerStats { return &s.stats }

// IsConnected reports whether the server is usable: started, not closed,
// and its device's port active.
func (s *Server) IsConnected() bool {
	return s != nil && !s.closed.Load() && s.dev.QueryPort().State == roce.PortActive
}

// channel is one channel (DCI): its completion queue and path to clients.
type channel struct {
	id        uint16
	allocated atomic.Bool
	// mu is held by the goroutine using the channel: its holder, or a
	// request of another channel's whose token names this channel's
	// connection (borrow), counted in lent while it waits or holds it.
	mu   chanLock
	lent atomic.Int32
	// stale: freed while lent; its next holder forgets the asynchronous
	// requests and events of the one before.
	stale atomic.Bool
	cq    *roce.CQ
	p     path
	// The rest is guarded by mu.
	pending     map[uint64]asyncReq // asynchronous requests by WR ID
	nextID      uint64
	outstanding int
	events      []AsyncEvent // asynchronous completions not yet polled
	owner       netip.Addr   // the client AllocateChannelFor counted it to; guarded by Server.mu
	wc          [MaxPollEvents]roce.WorkCompletion
	sge         [roce.MaxSGE]roce.SGE
	wr          roce.SendWR
	tok         Token // the request's token, kept here so it does not escape
}

// AllocateChannel allocates a channel (allocateChannelId): the lowest free
// ID, 0 first. With none free it returns InvalidChannelID and ErrNoChannel.
// It counts the channel to no client: front ends that serve untrusted
// clients use AllocateChannelFor.
func (s *Server) AllocateChannel() (uint16, error) {
	return s.allocate("AllocateChannel", netip.Addr{})
}

// AllocateChannelFor allocates a channel for a request of the client at
// peer (the front end's view of it: the HTTP peer's address, say). A
// client address holds at most Tunables.MaxChannelsPerClient channels at
// once, so that one address cannot take them all. Refusals match
// ErrOverloaded (an *OverloadError with the time to retry after) and
// EBUSY; with every channel in use the error also matches ErrNoChannel.
func (s *Server) AllocateChannelFor(peer netip.Addr) (uint16, error) {
	return s.allocate("AllocateChannelFor", peer.Unmap())
}

func (s *Server) allocate(op string, peer netip.Addr) (uint16, error) {
	if !s.IsConnected() {
		return InvalidChannelID, newErr(op, syscall.ENODEV, ErrNoDevice, "")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if peer.IsValid() && s.perClient[peer] >= s.t.MaxChannelsPerClient {
		s.stats.RefusedClientChannels.Add(1)
		return InvalidChannelID, newErr(op, syscall.EBUSY,
			&OverloadError{Limit: "channels per client", RetryAfter: time.Second}, "%v holds %d", peer, s.perClient[peer])
	}
	for i, ch := range s.chans {
		if ch != nil && ch.allocated.Load() {
			continue
		}
		if ch == nil {
			cq, err := s.dev.CreateCQ(int(s.t.CQDepth))
			if err != nil {
				return InvalidChannelID, newErr(op, syscall.ENOMEM, ErrInvalid, "%v", err)
			}
			p, err := s.tr.openPath(uint16(i), cq)
			if err != nil {
				_ = cq.Close()
				return InvalidChannelID, newErr(op, syscall.ENOMEM, ErrInvalid, "%v", err)
			}
			ch = &channel{id: uint16(i), mu: newChanLock(), cq: cq, p: p, pending: map[uint64]asyncReq{}}
			s.chans[i] = ch
		}
		ch.allocated.Store(true)
		ch.owner = peer
		if peer.IsValid() {
			s.perClient[peer]++
		}
		return uint16(i), nil
	}
	if !peer.IsValid() {
		return InvalidChannelID, newErr(op, syscall.EBUSY, ErrNoChannel, "all %d in use", len(s.chans))
	}
	s.stats.RefusedNoChannel.Add(1)
	return InvalidChannelID, newErr(op, syscall.EBUSY,
		fmt.Errorf("%w: %w", ErrNoChannel, &OverloadError{Limit: "channels", RetryAfter: time.Second}), "all %d in use", len(s.chans))
}

// Reserve accounts n bytes the caller is about to hold for RDMA (the
// buffer of a request) against Tunables.MaxHeldBytes; release returns
// them and may be called more than once. Past the budget it fails with
// ErrOverloaded and ENOMEM, allocating nothing.
func (s *Server) Reserve(n int64) (release func(), err error) {
	if n < 0 {
		return func() {}, newErr("Reserve", syscall.EINVAL, ErrInvalid, "%d bytes", n)
	}
	for {
		h := s.held.Load()
		if n > s.t.MaxHeldBytes-h {
			s.stats.RefusedMemory.Add(1)
			return func() {}, newErr("Reserve", syscall.ENOMEM,
				&OverloadError{Limit: "held bytes", RetryAfter: time.Second}, "%d bytes with %d of %d held", n, h, s.t.MaxHeldBytes)
		}
		if s.held.CompareAndSwap(h, h+n) {
			break
		}
	}
	var once sync.Once
	return func() { once.Do(func() { s.held.Add(-n) }) }, nil
}

// HeldBytes returns the bytes reserved with Reserve and not yet released.
func (s *Server) HeldBytes() int64 { return s.held.Load() }

// ChannelsInUse returns how many channels are allocated.
func (s *Server) ChannelsInUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ch := range s.chans {
		if ch != nil && ch.allocated.Load() {
			n++
		}
	}
	return n
}

// Connect makes sure the channel can reach the client the token names:
// RC connects (or finds the connection kept from an earlier request, or
// the live connection of any channel that the token names by the
// client's QPN), DC resolves the client's address. A front end calls it before it
// allocates a buffer or reads a file for the request, so that a token
// naming a client that does not answer costs a channel for at most
// Tunables.ConnectTimeout and no memory. Errors as HandleGetObject's,
// and ETIMEDOUT with ErrConnectTimeout.
func (s *Server) Connect(ctx context.Context, channel uint16, token string) error {
	const op = "Connect"
	if !s.IsConnected() {
		_, err := s.refuse(op, syscall.ENODEV, ErrNoDevice, "")
		return err
	}
	tok, err := ParseToken(token)
	if err != nil {
		_, err = s.refuse(op, syscall.EIO, err, "")
		return err
	}
	if _, err := s.checkPeer(op, &tok); err != nil {
		return err
	}
	ch, err := s.channelWait(ctx, channel)
	if err != nil {
		_, err = s.refuse(op, syscall.EIO, err, "")
		return err
	}
	defer ch.mu.Unlock()
	ch.tok = tok
	if _, ok := s.tr.route(&ch.tok); ok {
		// The token names a kept connection by its client QPN: nothing to
		// reach (the request runs on that connection's channel).
		return nil
	}
	if err := ch.p.prepare(ctx, &ch.tok); err != nil {
		return s.submitFailed(op, token, err)
	}
	return nil
}

// checkPeer checks that the token names a client this endpoint can reach.
func (s *Server) checkPeer(op string, tok *Token) (int64, error) {
	peer, ok := tok.IPAddr()
	if !ok {
		return s.refuse(op, syscall.EIO, ErrToken, "the token names no GID, which RoCE needs")
	}
	if s.local.IsValid() && s.local.Is4() != peer.Is4() {
		return s.refuse(op, syscall.EAFNOSUPPORT, ErrInvalid, "%s client, %s endpoint", familyOf(peer), familyOf(s.local))
	}
	return 0, nil
}

// submitFailed turns a failure to reach the client or post into the
// operation's error, and counts it.
func (s *Server) submitFailed(op, key string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		e.Op = op
		if errors.Is(err, roceNoAddress) {
			e.Errno = syscall.EAFNOSUPPORT
		}
	} else {
		err = newErr(op, syscall.EIO, ErrSubmit, "%v", err)
	}
	if errors.Is(err, ErrConnectTimeout) {
		s.stats.ConnectTimeouts.Add(1)
	}
	s.stats.Refused.Add(1)
	s.telem.error("submission failed", "op", op, "key", key, "err", err)
	return err
}

// FreeChannel releases a channel (freeChannelId); IDs outside the range
// are ignored. Completions of requests still outstanding on it are
// discarded.
func (s *Server) FreeChannel(id uint16) {
	if int(id) >= len(s.chans) {
		return
	}
	s.mu.Lock()
	ch := s.chans[id]
	if ch == nil || !ch.allocated.Load() {
		s.mu.Unlock()
		return
	}
	if ch.owner.IsValid() {
		if s.perClient[ch.owner]--; s.perClient[ch.owner] <= 0 {
			delete(s.perClient, ch.owner)
		}
		ch.owner = netip.Addr{}
	}
	s.mu.Unlock()
	switch {
	case ch.mu.TryLock():
		ch.forget()
		ch.mu.Unlock()
	case ch.lent.Load() > 0:
		// Lent to another channel's request, which may meet this holder's
		// completions: the next holder forgets them (channelWait).
		ch.stale.Store(true)
	case ch.mu.TryLock(): // a borrower left between the two looks
		ch.forget()
		ch.mu.Unlock()
	}
	ch.allocated.Store(false)
}

// chanLock is a mutex whose waiter can give up (lockCtx).
type chanLock chan struct{}

func newChanLock() chanLock { return make(chanLock, 1) }

func (l chanLock) Lock() { l <- struct{}{} }

func (l chanLock) Unlock() { <-l }

func (l chanLock) TryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l chanLock) lockCtx(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// errLent says that a channel is lent to another channel's request for
// now (see borrow).
var errLent = fmt.Errorf("%w: lent to a request on another channel", ErrChannel)

// channel returns an allocated channel, locked, or errLent when it is
// lent to another channel's request.
func (s *Server) channel(id uint16) (*channel, error) { return s.channelWait(nil, id) }

// channelWait returns an allocated channel, locked. A channel lent to
// another channel's request is waited for until ctx ends (nil ctx: errLent
// at once); one held by another goroutine of its own is refused.
func (s *Server) channelWait(ctx context.Context, id uint16) (*channel, error) {
	if int(id) >= len(s.chans) {
		return nil, fmt.Errorf("%w: channel %d of %d", ErrChannel, id, len(s.chans))
	}
	s.mu.Lock()
	ch := s.chans[id]
	s.mu.Unlock()
	if ch == nil || !ch.allocated.Load() {
		return nil, fmt.Errorf("%w: channel %d is not allocated", ErrChannel, id)
	}
	if !ch.mu.TryLock() {
		// A borrower unlocks before it leaves lent: with lent seen 0, a
		// borrower's hold has ended, so a failed second try is a holder's.
		if ch.lent.Load() == 0 {
			if !ch.mu.TryLock() {
				return nil, fmt.Errorf("%w: channel %d is in use by another goroutine", ErrChannel, id)
			}
		} else if ctx == nil {
			return nil, errLent
		} else if err := ch.mu.lockCtx(ctx); err != nil {
			return nil, fmt.Errorf("%w: channel %d: %w", ErrChannel, id, err)
		}
	}
	if ch.stale.Swap(false) {
		ch.forget()
	}
	return ch, nil
}

// forget drops the asynchronous requests and events of a channel's
// holder that let it go (ch.mu held).
func (ch *channel) forget() {
	clear(ch.pending)
	ch.events = ch.events[:0]
}

// borrow locks channel id for one request of another channel's whose
// token names id's connection to the client (its memory window is bound
// to that QP, so no other carries it); giveBack ends the loan. Whether id
// is allocated does not matter: its connections are kept either way.
func (s *Server) borrow(ctx context.Context, id uint16) (*channel, error) {
	s.mu.Lock()
	ch := s.chans[id]
	s.mu.Unlock()
	ch.lent.Add(1)
	if err := ch.mu.lockCtx(ctx); err != nil {
		ch.lent.Add(-1)
		return nil, fmt.Errorf("%w: channel %d: %w", ErrChannel, id, err)
	}
	return ch, nil
}

func (ch *channel) giveBack() {
	ch.mu.Unlock()
	ch.lent.Add(-1)
}

// Request is one GET or PUT to serve (the arguments of
// handleGetObject/handlePutObject).
type Request struct {
	Key         string  // request identifier for telemetry
	Local       *Buffer // registered server memory (source of a GET, destination of a PUT)
	LocalOffset uint64
	RemoteAddr  uint64 // remote_buf_start: inside the token's region
	Size        uint64 // 1 … MaxOpSize
	Token       string // the client's descriptor
	Channel     uint16 // from AllocateChannel
	// PollDelay is the poll_delay of the C API (0: Tunables.DelayInterval).
	// goroce's completion queues wake the waiting goroutine when the
	// completion arrives, so it does not change when a request returns.
	PollDelay time.Duration
	// Async, when non-nil, makes the request asynchronous: the call
	// returns 0 after submission and Poll reports Async with the status.
	Async any
}

// AsyncEvent is one completion of an asynchronous request
// (cuObjAsyncEvent_t).
type AsyncEvent struct {
	Handle any
	Status roce.WCStatus // WCSuccess, or the ibv_wc_status of the failure
}

// HandleGetObject serves a GET: RDMA WRITE of r.Size bytes at
// r.LocalOffset of r.Local into the client's memory at r.RemoteAddr. It
// returns r.Size when synchronous and 0 after an asynchronous submission.
// Errors match ENODEV, EIO (invalid request, token, channel or range;
// submission or completion failure, then with the completion status),
// ENOMEM (the channel's queue is full) or EAFNOSUPPORT (the token's
// address family is not the endpoint's).
func (s *Server) HandleGetObject(ctx context.Context, r *Request) (int64, error) {
	return s.handle(ctx, "HandleGetObject", r, roce.WRRDMAWrite)
}

// HandlePutObject serves a PUT: RDMA READ of r.Size bytes from the client's
// memory at r.RemoteAddr into r.Local at r.LocalOffset. Results as
// HandleGetObject; with a synchronous success the data is in r.Local.
func (s *Server) HandlePutObject(ctx context.Context, r *Request) (int64, error) {
	return s.handle(ctx, "HandlePutObject", r, roce.WRRDMARead)
}

func (s *Server) refuse(op string, errno syscall.Errno, reason error, format string, args ...any) (int64, error) {
	s.stats.Refused.Add(1)
	err := newErr(op, errno, reason, format, args...)
	s.telem.error("request refused", "op", op, "err", err)
	return 0, err
}

func (s *Server) handle(ctx context.Context, op string, r *Request, opcode roce.WROpcode) (int64, error) {
	if !s.IsConnected() {
		return s.refuse(op, syscall.ENODEV, ErrNoDevice, "")
	}
	switch {
	case r == nil:
		return s.refuse(op, syscall.EIO, ErrInvalid, "no request")
	case r.Local == nil || r.Local.s != s:
		return s.refuse(op, syscall.EIO, ErrInvalid, "no local buffer of this server")
	case r.Local.closed.Load() || (r.Local.base != nil && r.Local.base.closed.Load()):
		return s.refuse(op, syscall.EIO, ErrNotRegistered, "local buffer deregistered")
	case r.RemoteAddr == 0 || r.Size == 0:
		return s.refuse(op, syscall.EIO, ErrInvalid, "remote address %#x, size %d", r.RemoteAddr, r.Size)
	case r.Size > MaxOpSize:
		return s.refuse(op, syscall.EIO, ErrRange, "%d bytes, at most %d", r.Size, MaxOpSize)
	case r.LocalOffset > r.Local.size || r.Size > r.Local.size-r.LocalOffset:
		return s.refuse(op, syscall.EIO, ErrRange, "%d bytes at local offset %d of a %d-byte buffer", r.Size, r.LocalOffset, r.Local.size)
	case r.Local.Entries() > s.t.MaxSGE:
		return s.refuse(op, syscall.EIO, ErrInvalid, "buffer of %d entries, max_sge %d", r.Local.Entries(), s.t.MaxSGE)
	}
	if r.Local.Entries() > 1 && r.LocalOffset != 0 {
		s.telem.error("local offset ignored on a scatter-gather buffer", "key", r.Key, "offset", r.LocalOffset)
	}
	tok, err := ParseToken(r.Token)
	if err != nil {
		return s.refuse(op, syscall.EIO, err, "")
	}
	if !tok.Contains(r.RemoteAddr, r.Size) {
		return s.refuse(op, syscall.EIO, ErrRange, "%d bytes at %#x outside the token's %d bytes at %#x", r.Size, r.RemoteAddr, tok.Size, tok.Addr)
	}
	if _, err := s.checkPeer(op, &tok); err != nil {
		return 0, err
	}
	ch, err := s.channelWait(ctx, r.Channel)
	if err != nil {
		return s.refuse(op, syscall.EIO, err, "")
	}
	ch.tok = tok
	owner, routed := s.tr.route(&ch.tok)
	if !routed || owner == ch.id {
		defer ch.mu.Unlock()
		return s.submit(ctx, op, ch, r, &tok, opcode, r.Async)
	}
	// The token names another channel's connection: its memory window
	// works on that QP alone. The request runs there, one at a time with
	// that channel's own (this channel's lock is let go first, so no two
	// requests wait for each other's channels).
	ch.mu.Unlock()
	lender, err := s.borrow(ctx, owner)
	if err != nil {
		return s.refuse(op, syscall.EIO, err, "")
	}
	s.stats.Borrowed.Add(1)
	n, err := s.submit(ctx, op, lender, r, &tok, opcode, nil)
	lender.giveBack()
	if r.Async == nil {
		return n, err
	}
	// An asynchronous request ran to its end on the lender; its event is
	// the caller's channel's, for its Poll.
	st := roce.WCSuccess
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || !e.HasStatus {
			return 0, err
		}
		st = e.Status
	}
	if ch, err = s.channelWait(ctx, r.Channel); err != nil {
		return s.refuse(op, syscall.EIO, err, "")
	}
	ch.events = append(ch.events, AsyncEvent{Handle: r.Async, Status: st})
	ch.mu.Unlock()
	return 0, nil
}

// submit posts a request on ch (locked) and, unless async is set, waits
// for its completion.
func (s *Server) submit(ctx context.Context, op string, ch *channel, r *Request, tok *Token, opcode roce.WROpcode, async any) (int64, error) {
	if ch.outstanding >= int(s.t.CQDepth) {
		return s.refuse(op, syscall.ENOMEM, ErrSubmit, "%d requests outstanding on channel %d", ch.outstanding, ch.id)
	}
	ch.nextID++
	id := ch.nextID
	ch.wr = roce.SendWR{ID: id, Opcode: opcode, Flags: roce.SendSignaled,
		SGL: r.Local.sgl(ch.sge[:0], r.LocalOffset, r.Size), RemoteAddr: r.RemoteAddr, RKey: tok.RKey}
	if async != nil {
		ch.pending[id] = asyncReq{handle: async, get: opcode == roce.WRRDMAWrite, size: r.Size}
	}
	ch.tok = *tok
	qpn, err := ch.p.post(ctx, &ch.tok, &ch.wr)
	ch.wr.SGL = nil
	if err != nil {
		delete(ch.pending, id)
		return 0, s.submitFailed(op, r.Key, err)
	}
	ch.outstanding++
	if s.telem.on(LogPathDebug) { // the arguments would allocate even unused
		s.telem.debug("submitted", "op", op, "key", r.Key, "size", r.Size, "channel", ch.id, "qpn", qpn)
	}
	if async != nil {
		return 0, nil
	}
	wc, err := s.await(ctx, ch, id, qpn)
	if err != nil {
		return 0, newErr(op, syscall.EIO, ErrCompletion, "%v", err)
	}
	if wc.Status != roce.WCSuccess {
		s.telem.error("completion failed", "op", op, "key", r.Key, "status", StatusName(wc.Status))
		return 0, &Error{Op: op, Errno: syscall.EIO, Status: wc.Status, HasStatus: true, Err: ErrCompletion}
	}
	s.count(opcode == roce.WRRDMAWrite, r.Size)
	return int64(r.Size), nil
}

// asyncReq is an asynchronous request in flight: what Poll reports and
// what its success counts.
type asyncReq struct {
	handle any
	get    bool
	size   uint64
}

// count accounts a request completed successfully.
func (s *Server) count(get bool, size uint64) {
	if get {
		s.stats.Gets.Add(1)
		s.stats.GetBytes.Add(size)
	} else {
		s.stats.Puts.Add(1)
		s.stats.PutBytes.Add(size)
	}
}

var roceNoAddress = roce.ErrNoAddress

// await waits for the completion of WR id, keeping the asynchronous ones
// it meets for Poll. If ctx ends first the connection is reset so that the
// request is flushed and can no longer touch either side's memory.
func (s *Server) await(ctx context.Context, ch *channel, id uint64, qpn uint32) (roce.WorkCompletion, error) {
	var cancelled error
	for {
		n := ch.cq.Poll(ch.wc[:])
		var mine roce.WorkCompletion
		found := false
		for i := range ch.wc[:n] {
			wc := ch.wc[i]
			if ev, async := s.complete(ch, &wc); async {
				ch.events = append(ch.events, ev)
			} else if wc.WRID == id {
				mine, found = wc, true
			}
		}
		if found {
			if cancelled != nil {
				return mine, cancelled
			}
			return mine, nil
		}
		if n > 0 {
			continue
		}
		err := waitCQUntil(ctx, ch.cq, time.Now().Add(peerCheck))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// A client that hung up mid-request leaves its work requests
			// to the QP's retries, which at retry_cnt 7 never end (as
			// rxe's): reset the connection so that they flush now.
			if cancelled == nil && ch.p.gone(qpn) {
				cancelled = errPeerGone
				ch.p.failed(qpn, true)
				s.stats.Resets.Add(1)
			}
			continue
		}
		if err != nil {
			if cancelled != nil || !s.IsConnected() {
				return mine, errors.Join(cancelled, err)
			}
			cancelled = err
			ch.p.failed(qpn, true)
			s.stats.Resets.Add(1)
			// The flush completes the request at once; bound the wait anyway.
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
		}
	}
}

// complete accounts for one completion; for an asynchronous request it
// returns its event.
func (s *Server) complete(ch *channel, wc *roce.WorkCompletion) (AsyncEvent, bool) {
	if ch.outstanding == 0 {
		// More completions than requests: a count below zero would admit
		// more requests than the CQ holds and keep PollWait waiting.
		s.stats.Stray.Add(1)
		return AsyncEvent{}, false
	}
	ch.outstanding--
	ch.p.completed(wc.QPN)
	if wc.Status != roce.WCSuccess {
		s.stats.Failed.Add(1)
		if s.t.QPResetOnFailure {
			ch.p.failed(wc.QPN, true)
			s.stats.Resets.Add(1)
		}
	}
	a, ok := ch.pending[wc.WRID]
	if !ok {
		return AsyncEvent{}, false
	}
	delete(ch.pending, wc.WRID)
	if wc.Status == roce.WCSuccess {
		s.count(a.get, a.size)
	}
	return AsyncEvent{Handle: a.handle, Status: wc.Status}, true
}

// waitCQ blocks until cq has completions or ctx ends. Every wait of the
// package goes through here.
func waitCQ(ctx context.Context, cq *roce.CQ) error { return cq.Wait(ctx) }

// waitCQUntil is waitCQ bounded by a deadline too.
func waitCQUntil(ctx context.Context, cq *roce.CQ, deadline time.Time) error {
	return cq.WaitUntil(ctx, deadline)
}

// errPeerGone ends a request whose client ended the connection.
var errPeerGone = errors.New("cuobj: the client ended the connection during the request")

// peerCheck is how often a request waiting for its completion looks
// whether its client has ended the connection.
const peerCheck = time.Second

// Poll returns completed asynchronous requests of a channel (poll): at
// most min(len(events), MaxPollEvents), without blocking; 0 when there are
// none. Errors match ENODEV, EINVAL (nil events; channel out of range, not
// allocated or busy) or EIO when a completion failed: then n still counts
// the events filled, the failed one last, and the channel's connection to
// that client was reset if QPResetOnFailure.
func (s *Server) Poll(channel uint16, events []AsyncEvent) (int, error) {
	const op = "Poll"
	if !s.IsConnected() {
		return 0, newErr(op, syscall.ENODEV, ErrNoDevice, "")
	}
	if events == nil {
		return 0, newErr(op, syscall.EINVAL, ErrInvalid, "nil events")
	}
	ch, err := s.channel(channel)
	if errors.Is(err, errLent) {
		return 0, nil // for now; the lender's events stay for the next Poll
	}
	if err != nil {
		return 0, newErr(op, syscall.EINVAL, err, "")
	}
	defer ch.mu.Unlock()
	return s.poll(ch, events[:min(len(events), MaxPollEvents)])
}

func (s *Server) poll(ch *channel, out []AsyncEvent) (int, error) {
	n := 0
	failed := func() (int, error) {
		ev := out[n-1]
		return n, &Error{Op: "Poll", Errno: syscall.EIO, Status: ev.Status, HasStatus: true, Err: ErrCompletion}
	}
	for len(ch.events) > 0 && n < len(out) {
		out[n] = ch.events[0]
		ch.events = append(ch.events[:0], ch.events[1:]...)
		n++
		if out[n-1].Status != roce.WCSuccess {
			return failed()
		}
	}
	for n < len(out) {
		k := ch.cq.Poll(ch.wc[:len(out)-n])
		if k == 0 {
			break
		}
		bad := false
		for i := range ch.wc[:k] {
			ev, async := s.complete(ch, &ch.wc[i])
			if !async {
				continue // a cancelled synchronous request
			}
			if bad || n == len(out) {
				ch.events = append(ch.events, ev) // after a failure: for the next Poll
				continue
			}
			out[n] = ev
			n++
			bad = ev.Status != roce.WCSuccess
		}
		if bad {
			return failed()
		}
	}
	return n, nil
}

// PollWait is Poll that blocks until at least one event is there or ctx
// ends.
func (s *Server) PollWait(ctx context.Context, channel uint16, events []AsyncEvent) (int, error) {
	for {
		n, err := s.Poll(channel, events)
		if n > 0 || err != nil || len(events) == 0 {
			return n, err
		}
		ch, err := s.channelWait(ctx, channel)
		if err != nil {
			return 0, newErr("Poll", syscall.EINVAL, err, "")
		}
		if ch.outstanding == 0 && len(ch.events) == 0 {
			ch.mu.Unlock()
			return 0, nil // nothing to wait for
		}
		err = waitCQ(ctx, ch.cq)
		ch.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
}

// Close closes the server: outstanding requests are flushed, connections
// to clients closed, channels and registrations released.
func (s *Server) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.mu.Lock()
	chans := append([]*channel(nil), s.chans...)
	s.mu.Unlock()
	var errs []error
	for _, ch := range chans {
		if ch != nil {
			ch.p.abort()
		}
	}
	for _, ch := range chans {
		if ch == nil {
			continue
		}
		ch.mu.Lock()
		errs = append(errs, ch.p.close(), ch.cq.Close())
		ch.mu.Unlock()
	}
	errs = append(errs, s.tr.close(), s.rcq.Close())
	if err := s.pd.Close(); err != nil && !errors.Is(err, roce.ErrBusy) {
		errs = append(errs, err)
	}
	s.telem.info("server closed", "addr", s.addr)
	return errors.Join(errs...)
}
