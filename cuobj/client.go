package cuobj

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// MemoryType is the kind of memory a pointer refers to (cuObjMemoryType_t).
type MemoryType int

// Memory types. Only MemorySystem exists on machines without GPUs; the
// CUDA types are refused with ErrUnsupported.
const (
	MemorySystem      MemoryType = 0
	MemoryCUDAManaged MemoryType = 1
	MemoryCUDADevice  MemoryType = 2
	MemoryUnknown     MemoryType = 3
	MemoryInvalid     MemoryType = 4
)

func (m MemoryType) String() string {
	switch m {
	case MemorySystem:
		return "system"
	case MemoryCUDAManaged:
		return "CUDA managed"
	case MemoryCUDADevice:
		return "CUDA device"
	case MemoryUnknown:
		return "unknown"
	}
	return "invalid"
}

// MemoryTypeOf returns the type of buf's memory (getMemoryType): Go
// memory is host memory, MemorySystem; an empty or nil slice is
// MemoryInvalid.
func MemoryTypeOf(buf []byte) MemoryType {
	if len(buf) == 0 {
		return MemoryInvalid
	}
	return MemorySystem
}

// RDMAInfo is what a callback gets to pass on the control path
// (cufileRDMAInfo_t): the descriptor of exactly the callback's chunk. It is
// valid only during the callback.
type RDMAInfo struct {
	Desc  string // the descriptor string (the x-amz-rdma-token value)
	Token Token  // Desc, parsed

	c *Client
	g *grant
}

// AllowServer names the address of the server the callback hands the
// descriptor to (the address it resolved for the request): while the
// token lives, the client's listener accepts connections from it. Call it
// before sending the descriptor. A callback that names no server relies
// on ClientOptions.Servers (see the package documentation).
//
// An RC token is, where it can be, a memory window bound through one of
// a's connections (see the package documentation's threat model): a
// token bound through another server's connection, or a region where a
// has a connection to bind through, is replaced here. Desc and Token
// change, so read them after the call. A callback's token is bound, before
// the callback runs, through a connection of the server the last
// callback named (or of the one ClientOptions.Servers names): callbacks
// of a client that name their servers should all name them.
func (i *RDMAInfo) AllowServer(a netip.Addr) {
	if i == nil || i.c == nil || i.g == nil {
		return
	}
	a = a.Unmap()
	c, g := i.c, i.g
	if !a.IsValid() {
		return
	}
	c.mu.Lock()
	c.lastNamed = a
	c.mu.Unlock()
	c.allow(g, a)
	if g.wc != nil && g.wc.from == a {
		return
	}
	sc := c.windowConn(g.rail, a, false)
	if sc == nil && g.wc == nil {
		return // a region, as a new grant would be
	}
	tok, ng, err := c.grantThrough(sc, g.rail, g.reg, g.off, g.size, g.op)
	if err != nil {
		c.telem.error("grant", "err", err)
		return // the token stays as it is
	}
	c.allow(ng, a)
	if err := c.revoke(g); err != nil {
		c.telem.error("revoke", "err", err)
	}
	i.g, i.Token, i.Desc = ng, tok, tok.String()
}

// Handle identifies one callback invocation (the callback's handle).
type Handle struct {
	ctx  context.Context
	user any
	Op   OpType
}

// Context returns the context of the Get or Put that made the callback.
func (h *Handle) Context() context.Context {
	if h == nil {
		return context.Background()
	}
	return h.ctx
}

// GetCtx returns the user context passed to Get or Put (getCtx), nil for
// a nil handle.
func GetCtx(h *Handle) any {
	if h == nil {
		return nil
	}
	return h.user
}

// Callback moves one chunk on the application's control path: it hands
// info.Desc to the server and returns the number of bytes the server
// moved, or an error. Errors that match a retryable errno
// (RetryableErrnos) are retried. Callbacks run on goroutines other than
// the caller's, possibly several at once for one request.
type Callback func(h *Handle, chunk []byte, offset int64, info *RDMAInfo) (int, error)

// Ops are the client's callbacks (CUObjOps_t).
type Ops struct {
	Get Callback
	Put Callback
}

// RetryableErrnos are the callback errors that are retried (the seed's
// list); any other error, ENOTSUP included, ends the request.
var RetryableErrnos = []syscall.Errno{
	syscall.EPERM, syscall.ETIMEDOUT, syscall.ECONNRESET, syscall.ENETUNREACH, syscall.EHOSTUNREACH,
	syscall.ECONNREFUSED, syscall.ENETDOWN, syscall.ENOBUFS, syscall.EAGAIN, syscall.EWOULDBLOCK,
	syscall.EINTR, syscall.EIO, syscall.ENODEV, syscall.ENOLINK, errnoECOMM, syscall.EPROTO,
	syscall.EACCES, syscall.ENOTCONN, syscall.ECONNABORTED,
}

// Retryable reports whether a callback error is retried.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, syscall.ENOTSUP) {
		return false
	}
	for _, e := range RetryableErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ClientOptions configure NewClient.
type ClientOptions struct {
	// Proto (default: ProtoDC when the configuration's
	// rdma_transport_type is "dc", else ProtoRC).
	Proto Proto
	// Addr is where the client listens for servers: an address of the
	// device (default: its first IPv4 address, else IPv6) and, for RC,
	// an rdma_cm port (0: a random free one). Tokens carry both; a DC
	// client's port is always 0 (its token's lid field is 0).
	Addr netip.AddrPort
	// MaxRequestCallbackSize caps the chunk of one callback (default and
	// maximum MaxOpSize, what one server request moves).
	MaxRequestCallbackSize int64
	// Parallel is how many callbacks of one request run at once (default 4).
	Parallel int
	// Config is the JSON configuration (nil: LoadConfig()).
	Config *Config
	// Manager is the CM to listen with (nil: the package-level cm.Listen).
	Manager *cm.Manager
	// Telemetry (nil: errors to slog.Default()).
	Telemetry *Telemetry
	// Servers are the addresses of the servers this client hands tokens
	// to when a callback does not name its server (RDMAInfo.AllowServer):
	// the listener accepts them while any such token lives. Empty, such a
	// token admits any address while it lives (weaker; see the package
	// documentation).
	Servers []netip.Addr
	// RegionTokens makes an RC client grant every token as a memory
	// region of its own over the token's range, as DC always does (a DCT
	// posts no binds). By default an RC token is, where the client can
	// bind one, a type 2 memory window over the token's range, bound
	// through a connection of the server the token is for, usable
	// through that QP alone and invalidated when the token dies; the
	// token's qp field is then that connection's QPN, which the server
	// uses to find it (see the package documentation's threat model;
	// ClientStats.WindowGrants and RegionGrants say which a token was).
	RegionTokens bool
	// Backups are the backup devices of a multipath client
	// (rdma_multipath_enabled; see multipath.go): each listens on its
	// first address and Addr's port (RC) or has a DCT (DC). With
	// rdma_dev_addr_list set, the list selects and orders dev and these
	// by address or interface name.
	Backups []*roce.Device
	// HandshakeTimeout bounds each server connection's accept handshake
	// on the client's listener, from the REQ to the RTU (0: 10 s, as
	// rsocket's listener; the CM also ends any half-open handshake after
	// its own bound). A handshake that runs out is counted in
	// ClientStats.HandshakeFailures.
	HandshakeTimeout time.Duration
}

// Client is a cuObject client (cuObjClient). Its methods are safe for
// concurrent use.
type Client struct {
	ops      Ops
	proto    Proto
	rails    []*rail // the primary device first; see multipath.go
	cur      atomic.Int32
	endpoint uint32 // RC: every rail's; DC: the primary's DCT number
	cfg      Config
	maxCB    int64
	parallel int
	hsTime   time.Duration // ClientOptions.HandshakeTimeout
	telem    *telemetry
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	servers []netip.Addr // ClientOptions.Servers, unmapped
	windows bool         // RC without ClientOptions.RegionTokens

	mu      sync.RWMutex
	regions map[uintptr]*region
	conns   map[*cm.Conn]*serverConn
	tokens  map[string]*grant // issued by GetRDMAToken, not yet put
	// allowed counts the live grants naming each server address; unnamed
	// those naming none.
	allowed map[netip.Addr]int
	unnamed int
	// lastNamed is the server a callback last named (AllowServer): the
	// guess for the next callback's token.
	lastNamed netip.Addr
	// ambiguous is set once a window token guessed for one server reached
	// another (see windowConn): no more guesses from connections.
	ambiguous atomic.Bool
	closed    atomic.Bool

	stats ClientStats
}

// ClientStats counts what a client did.
type ClientStats struct {
	Gets, Puts         atomic.Uint64
	GetBytes, PutBytes atomic.Uint64
	Callbacks, Retries atomic.Uint64
	Connections        atomic.Uint64 // servers accepted
	Refused            atomic.Uint64 // connection requests refused (stale or malformed)
	// Strangers counts connection requests refused because no live token
	// was handed to their address.
	Strangers atomic.Uint64
	// HandshakeFailures counts accepted connection requests whose
	// handshake did not complete (no RTU within
	// ClientOptions.HandshakeTimeout, or the CM abandoned it).
	HandshakeFailures atomic.Uint64
	// Grants and Revokes count the per-token grants made and destroyed;
	// Grants − Revokes are live. WindowGrants of the grants were memory
	// windows (RC by default), RegionGrants memory regions (DC,
	// ClientOptions.RegionTokens, or no connection to bind through).
	Grants, Revokes            atomic.Uint64
	WindowGrants, RegionGrants atomic.Uint64
	// AccessErrors counts server connections ended by a remote access
	// error: an access outside every live token's range or with a dead
	// token's rkey.
	AccessErrors atomic.Uint64
	// Failures counts server connections whose QP failed on the client's
	// side (a NAK it sent, retries run out): the client ends them, so
	// that the server learns and dials again.
	Failures atomic.Uint64
	// Failovers and Failbacks count moves of a multipath client from one
	// device to another.
	Failovers, Failbacks atomic.Uint64
}

// region is one registration. Its memory regions (one per rail) grant
// no remote access: their keys never leave the client. Remote access is
// granted per token (grant). With windows on, the regions allow binding
// windows (AccessMWBind), which still grants no remote access by itself.
type region struct {
	buf    []byte
	start  uintptr
	mrs    []*roce.MR          // per rail, local access only
	grants map[*grant]struct{} // live grants over the registration; guarded by Client.mu
}

// grant is one token's access over exactly the token's range, remote
// WRITE for a GET and remote READ for a PUT, destroyed (revoke) when the
// request ends or the token is put back: a memory region of its own, or a
// type 2 memory window bound through one server connection and
// invalidated at the end.
type grant struct {
	mr     *roce.MR    // region path
	mw     *roce.MW    // window path
	wc     *serverConn // window path: the connection it is bound through
	rkey   uint32      // window path: its key while bound
	rail   *rail
	reg    *region
	off    uint64
	size   uint64
	op     OpType
	server netip.Addr // named by AllowServer; invalid: none
	done   bool       // revoked; guarded by Client.mu
}

// serverConn is an accepted server connection. Windows are bound and
// invalidated by local work requests on its QP, one at a time.
type serverConn struct {
	conn *cm.Conn
	rail *rail
	from netip.Addr // the server's address, unmapped
	qpn  uint32     // the client's QPN: a window token's qp field
	// windows counts the live windows bound through the connection (and
	// binds under way); guarded by Client.mu.
	windows int
	// heard is set once the server has sent a request on the
	// connection (see heardFrom).
	heard atomic.Bool

	mu  sync.Mutex // one local work request at a time; guards seq and wc
	seq uint64
	wc  [4]roce.WorkCompletion
}

// localTimeout bounds a bind or an invalidation: they complete as soon as
// the device's send queue reaches them, unless the device is stuck.
const localTimeout = 10 * time.Second

// DefaultHandshakeTimeout is ClientOptions.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 10 * time.Second

// local posts a local work request (BIND_MW, LOCAL_INV) on the
// connection's QP and waits for its completion.
func (s *serverConn) local(wr *roce.SendWR) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), localTimeout)
	defer cancel()
	s.seq++
	wr.ID, wr.Flags = s.seq, wr.Flags|roce.SendSignaled
	if err := s.conn.QP().PostSend(wr); err != nil {
		return err
	}
	cq := s.conn.SendCQ()
	for {
		n := cq.Poll(s.wc[:])
		for _, wc := range s.wc[:n] {
			// Older IDs are of requests whose wait timed out.
			if wc.WRID != wr.ID {
				continue
			}
			if wc.Status != roce.WCSuccess {
				return fmt.Errorf("%v: %v", wr.Opcode, wc.Status)
			}
			return nil
		}
		if n > 0 {
			continue
		}
		if err := cq.Wait(ctx); err != nil {
			return fmt.Errorf("%v: %w", wr.Opcode, err)
		}
	}
}

// live reports whether the connection can still carry a server's access.
func (s *serverConn) live() bool { return s.conn.Err() == nil && s.conn.QP().Err() == nil }

// heardFrom reports whether the server has sent a request on the
// connection. The client's accept completes when the server's RTU
// arrives, before the server has taken the connection into the index by
// which it routes window tokens (it does so before it first posts on it):
// a window bound through a connection the server has not used yet may
// reach it first, and the server would take its qp field for an endpoint
// number. So windows are bound only through connections the server has
// used: their QP's expected PSN has moved from the one it started at.
func (s *serverConn) heardFrom() bool {
	if s.heard.Load() {
		return true
	}
	if s.conn.QP().ExpectedPSN() == s.conn.StartingPSN() {
		return false
	}
	s.heard.Store(true)
	return true
}

// NewClient creates a client on dev with the application's callbacks and
// starts listening for servers.
func NewClient(dev *roce.Device, ops Ops, o ClientOptions) (*Client, error) {
	const op = "NewClient"
	if dev == nil {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "no device")
	}
	switch o.Proto {
	case 0, ProtoRC, ProtoDC:
	default:
		return nil, newErr(op, syscall.EPROTONOSUPPORT, ErrUnsupported, "%v", o.Proto)
	}
	c := &Client{ops: ops, proto: o.Proto, telem: newTelemetry(o.Telemetry, "cuobj-client"),
		regions: map[uintptr]*region{}, conns: map[*cm.Conn]*serverConn{}, tokens: map[string]*grant{},
		allowed:  map[netip.Addr]int{},
		endpoint: 1 + rand.Uint32N(0xFFFFFE)}
	if o.Config != nil {
		c.cfg = *o.Config
	} else {
		cfg, err := LoadConfig()
		if err != nil {
			return nil, newErr(op, syscall.EINVAL, ErrInvalid, "%v", err)
		}
		c.cfg = *cfg
	}
	if c.proto == 0 {
		c.proto = ProtoRC
		if strings.EqualFold(c.cfg.Properties.TransportType, "dc") {
			c.proto = ProtoDC
		}
	}
	c.windows = !o.RegionTokens && c.proto == ProtoRC
	for _, a := range o.Servers {
		c.servers = append(c.servers, a.Unmap())
	}
	c.maxCB = o.MaxRequestCallbackSize
	if c.maxCB <= 0 || c.maxCB > MaxOpSize {
		c.maxCB = MaxOpSize
	}
	c.parallel = o.Parallel
	if c.parallel <= 0 {
		c.parallel = 4
	}
	c.hsTime = o.HandshakeTimeout
	if c.hsTime <= 0 {
		c.hsTime = DefaultHandshakeTimeout
	}
	var dcKey uint64
	if c.proto == ProtoDC {
		var err error
		if dcKey, err = parseDCKey(c.cfg.Properties.DCKey); err != nil {
			return nil, newErr(op, syscall.EINVAL, ErrInvalid, "%v", err)
		}
	}
	devs, addrs, err := c.orderRails(dev, o.Backups, o.Addr.Addr().Unmap())
	if err != nil {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "%v", err)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for i, d := range devs {
		r, err := c.openRail(d, addrs[i], o, d == dev, dcKey)
		if err != nil {
			c.cancel()
			for _, r := range c.rails {
				_ = r.close()
			}
			return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "%v", err)
		}
		r.idx = i
		c.rails = append(c.rails, r)
	}
	if c.proto == ProtoDC {
		c.endpoint = c.rails[0].endpoint
	}
	for _, r := range c.rails {
		if r.ln != nil {
			c.wg.Add(1)
			go c.serve(r)
		}
		c.telem.info("client started", "addr", r.addr, "endpoint", r.endpoint, "proto", c.proto)
	}
	if len(c.rails) > 1 {
		if c.cfg.Properties.AsyncEventMonitor {
			for _, r := range c.rails {
				// The subscription ends with c.ctx (Close) or the device.
				if events, err := r.dev.Events(c.ctx); err == nil {
					c.wg.Add(1)
					go c.monitor(r, events)
				}
			}
		}
		c.wg.Add(1)
		go c.health()
	}
	return c, nil
}

// openRail opens the client's side on one device: at address a (invalid
// or unspecified: the device's first IPv4 address, else IPv6), a PD and a
// listener on o.Addr's port (RC) or a DCT (DC). o.Manager is dev's when
// dev is the device NewClient was given.
func (c *Client) openRail(dev *roce.Device, a netip.Addr, o ClientOptions, own bool, dcKey uint64) (*rail, error) {
	if dev == nil {
		return nil, errors.New("no device")
	}
	if !a.IsValid() || a.IsUnspecified() {
		g, err := dev.SourceGID(netip.IPv4Unspecified())
		if err != nil {
			g, err = dev.SourceGID(netip.IPv6Unspecified())
		}
		if err != nil {
			return nil, fmt.Errorf("no address: %v", err)
		}
		a = g.Addr()
	} else if _, err := dev.GIDIndex(a); err != nil {
		return nil, fmt.Errorf("%v is not an address of the device", a)
	}
	r := &rail{dev: dev, gid: ib.GIDFromAddr(a), endpoint: c.endpoint}
	var err error
	if r.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.proto == ProtoDC {
		// The DCT is the client's only endpoint: servers' DCIs reach it
		// with no connection setup, so nothing listens.
		if r.dct, err = newDCTarget(r.pd, dcKey); err != nil {
			_ = r.pd.Close()
			return nil, fmt.Errorf("DC target: %v", err)
		}
		r.endpoint = r.dct.qp.QPN()
		r.addr = netip.AddrPortFrom(a, 0)
		return r, nil
	}
	listen := func(ap netip.AddrPort) (*cm.Listener, error) {
		lo := cm.ListenOptions{Backlog: 256}
		if o.Manager != nil && own {
			return o.Manager.Listen(c.ctx, ap, lo)
		}
		return cm.Listen(c.ctx, dev, ap, lo)
	}
	port := o.Addr.Port()
	for try := 0; ; try++ {
		p := port
		if p == 0 {
			p = uint16(32768 + rand.IntN(28232))
		}
		r.ln, err = listen(netip.AddrPortFrom(a, p))
		if err == nil {
			r.addr = netip.AddrPortFrom(a, p)
			return r, nil
		}
		if port != 0 || try == 16 {
			_ = r.pd.Close()
			return nil, fmt.Errorf("listen: %v", err)
		}
	}
}

func (r *rail) closeListener() error {
	var err error
	r.lnOnce.Do(func() {
		if r.ln != nil {
			err = r.ln.Close()
		}
	})
	return err
}

func (r *rail) close() error {
	errs := []error{r.closeListener()}
	if r.dct != nil {
		// A server still writing gets an unknown-target NAK from now on.
		errs = append(errs, r.dct.close())
	}
	return errors.Join(append(errs, r.pd.Close())...)
}

// Addr returns where the client listens for servers.
func (c *Client) Addr() netip.AddrPort { return c.rails[0].addr }

// ActiveAddr returns the address the next token names: the primary's, or
// a multipath client's current device's.
func (c *Client) ActiveAddr() netip.AddrPort { return c.rails[c.cur.Load()].addr }

// Endpoint returns the client's endpoint number (the qp field of its
// region tokens; a window token names its connection's QPN instead): for
// DC, its DCT number.
func (c *Client) Endpoint() uint32 { return c.endpoint }

// Stats returns the client's counters.
func (c *Client) Stats() *ClientStats { return &c.stats }

// IsConnected reports whether the client is ready: listening, not closed,
// the port of one of its devices active.
func (c *Client) IsConnected() bool {
	if c == nil || c.closed.Load() {
		return false
	}
	for _, r := range c.rails {
		if r.portUp() {
			return true
		}
	}
	return false
}

// serve answers the connection requests of servers.
func (c *Client) serve(r *rail) {
	defer c.wg.Done()
	for {
		req, err := r.ln.Request(c.ctx)
		if err != nil {
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.answer(r, req)
		}()
	}
}

func (c *Client) answer(r *rail, req *cm.Request) {
	proto, ep, err := parseHello(req.PrivateData())
	if err == nil && (proto != c.proto || ep != c.endpoint) {
		err = fmt.Errorf("stale token: endpoint %#x protocol %d, this client is %#x protocol %d", ep, proto, c.endpoint, c.proto)
		c.misdirected(r, req.RemoteAddr().Addr().Unmap(), ep)
	}
	if err == nil && !c.admits(req.RemoteAddr().Addr()) {
		c.stats.Strangers.Add(1)
		err = errors.New("no live token was handed to this address")
	}
	if err != nil {
		c.stats.Refused.Add(1)
		c.telem.error("connection refused", "from", req.RemoteAddr(), "err", err)
		// The REJ says nothing the peer did not send: the reason is
		// logged here, not told to a peer that may be guessing.
		_ = req.Reject(0, nil)
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.hsTime)
	defer cancel()
	conn, err := req.Accept(ctx, cm.AcceptOptions{
		QP: cm.QPOptions{PD: r.pd, Access: roce.AccessLocalWrite | roce.AccessRemoteWrite | roce.AccessRemoteRead,
			// The send queue carries the binds and invalidations of
			// windows (one at a time) and nothing else.
			Cap: roce.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}},
		PrivateData: appendHello(nil, c.proto, c.endpoint),
	})
	if err != nil {
		if c.ctx.Err() == nil {
			c.stats.HandshakeFailures.Add(1)
		}
		c.telem.error("accept failed", "from", req.RemoteAddr(), "err", err)
		return
	}
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		_ = conn.Close()
		return
	}
	c.conns[conn] = &serverConn{conn: conn, rail: r, from: conn.RemoteAddr().Addr().Unmap(), qpn: conn.QP().QPN()}
	c.mu.Unlock()
	c.stats.Connections.Add(1)
	c.telem.info("server connected", "from", conn.RemoteAddr(), "qpn", conn.QP().QPN())
	failed := conn.QP().Failed()
	counted := false
	// count counts a remote access error once, whichever of the QP's
	// failure and the connection's end is seen first.
	count := func() {
		var qe *roce.QPError
		if !counted && errors.As(conn.QP().Err(), &qe) && qe.Status == roce.WCRemAccessErr {
			counted = true
			c.stats.AccessErrors.Add(1)
			c.telem.error("server access refused", "from", conn.RemoteAddr(), "err", qe)
		}
	}
	select {
	case <-failed:
		// The QP failed on its own (a NAK it sent, such as the access
		// error a stale duplicate READ of a deregistered buffer draws, or
		// its retries ran out): it drops everything from now on. A server
		// that did not get the NAK would resend its WRITE or READ for
		// ever (retry_cnt 7 never ends, as with rxe) and never learn;
		// the DREQ tells it, and its next request dials again.
		count()
		c.stats.Failures.Add(1)
		c.telem.error("connection failed: disconnecting", "from", conn.RemoteAddr(), "err", conn.QP().Err())
		disconnect(conn)
	case <-conn.Done():
	case <-c.ctx.Done():
		// Wait (briefly) for the DREP, so the server learns the
		// connection is over before this process may exit; otherwise
		// its CM would take a later client's QP for a stale connection.
		disconnect(conn)
	}
	count()
	c.mu.Lock()
	delete(c.conns, conn)
	c.mu.Unlock()
	_ = conn.Close()
}

// disconnect ends conn with a DREQ, waiting briefly for the DREP.
func disconnect(conn *cm.Conn) {
	dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
	_ = conn.Disconnect(dctx)
	dcancel()
}

// misdirected handles a server at from that dialled a QPN of one of the
// client's connections as an endpoint number: it has no such connection.
// If the connection is another server's, a window token whose server the
// client guessed (windowConn) went elsewhere: the client guesses no more.
// If it is from's own, from has lost it (a failure it reset, a path that
// died) while the client's end lives on: the client closes it, so that no
// more windows are bound through it.
func (c *Client) misdirected(r *rail, from netip.Addr, qpn uint32) {
	var lost *serverConn
	c.mu.RLock()
	for _, sc := range c.conns {
		if sc.rail != r || sc.qpn != qpn {
			continue
		}
		if sc.from == from {
			lost = sc
		} else if !c.ambiguous.Swap(true) {
			c.telem.error("a window token reached another server than its connection's: tokens that name no server are regions from now on",
				"bound", sc.from, "reached", from)
		}
		break
	}
	c.mu.RUnlock()
	if lost != nil {
		c.telem.error("the server has lost a connection the client still holds: closing it", "from", from, "qpn", qpn)
		_ = lost.conn.Close() // answer forgets it
	}
}

// Register registers host memory for RDMA (cuMemObjGetDescriptor): 1 …
// MaxRegSize bytes, not overlapping an earlier registration.
func (c *Client) Register(buf []byte) error { return c.RegisterMemory(buf, MemorySystem) }

// RegisterMemory registers memory of a given type; only MemorySystem is
// supported here (CUDA memory fails with ErrUnsupported).
func (c *Client) RegisterMemory(buf []byte, t MemoryType) error {
	const op = "Register"
	switch {
	case t == MemoryCUDADevice || t == MemoryCUDAManaged:
		return newErr(op, syscall.ENOTSUP, ErrUnsupported, "%v memory: this build has no CUDA", t)
	case t != MemorySystem:
		return newErr(op, syscall.EINVAL, ErrUnsupported, "%v memory", t)
	case len(buf) == 0:
		return newErr(op, syscall.EINVAL, ErrInvalid, "empty buffer")
	case uint64(len(buf)) > MaxRegSize:
		return newErr(op, syscall.EINVAL, ErrInvalid, "%d bytes, at most %d", len(buf), uint64(MaxRegSize))
	case c.closed.Load():
		return newErr(op, syscall.ENODEV, ErrClosed, "")
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	end := start + uintptr(len(buf))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.regions {
		if start < r.start+uintptr(len(r.buf)) && r.start < end {
			return newErr(op, syscall.EINVAL, ErrInvalid, "overlaps a registration")
		}
	}
	reg := &region{buf: buf, start: start, grants: map[*grant]struct{}{}}
	access := roce.AccessLocalWrite
	if c.windows {
		access |= roce.AccessMWBind
	}
	for _, r := range c.rails {
		mr, err := r.pd.RegisterMR(buf, access)
		if err != nil {
			_ = reg.close()
			return newErr(op, syscall.ENOMEM, ErrInvalid, "%v", err)
		}
		reg.mrs = append(reg.mrs, mr)
	}
	c.regions[start] = reg
	c.telem.debug("registered", "bytes", len(buf))
	return nil
}

// Deregister releases the registration that starts at buf
// (cuMemObjPutDescriptor). A nil buffer is a no-op; a buffer that starts
// no registration fails with ErrNotRegistered. Server requests still
// using the memory then fail with a remote access error.
func (c *Client) Deregister(buf []byte) error {
	if buf == nil {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	c.mu.Lock()
	r := c.regions[start]
	delete(c.regions, start)
	var gs []*grant
	if r != nil {
		gs = c.detachLocked(r)
	}
	c.mu.Unlock()
	if r == nil {
		return newErr("Deregister", syscall.EINVAL, ErrNotRegistered, "")
	}
	return errors.Join(c.destroy(gs), r.close())
}

func (r *region) close() error {
	var errs []error
	for _, m := range r.mrs {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// sync makes the memory operations of either side visible to the other
// (see MR.Sync), on every rail.
func (r *region) sync(OpType) {
	for _, m := range r.mrs {
		m.Sync()
	}
}

// grantRange gives remote access to exactly size bytes at off of the
// registration on one rail, for op, and returns the token naming it. The
// rkey is the grant's own: it dies with revoke, and the registration's
// keys never leave the client. With windows on, the grant is a type 2
// window bound through a connection of server (see windowConn; guess: a
// callback's token, whose server may be named later) when there is one
// to bind through; otherwise a region.
func (c *Client) grantRange(rl *rail, r *region, off, size uint64, op OpType, server netip.Addr, guess bool) (Token, *grant, error) {
	return c.grantThrough(c.windowConn(rl, server, guess), rl, r, off, size, op)
}

// grantThrough grants a window bound through sc (reserved by
// windowConn), or a region when sc is nil or the bind fails.
func (c *Client) grantThrough(sc *serverConn, rl *rail, r *region, off, size uint64, op OpType) (Token, *grant, error) {
	if sc != nil {
		tok, g, err := c.grantWindow(sc, r, off, size, op)
		if err == nil {
			return tok, g, nil
		}
		if errors.Is(err, ErrNotRegistered) {
			return Token{}, nil, err
		}
		// The connection failed under the bind, or the device has no
		// windows left: a region does the same.
		c.telem.error("window bind failed, granting a region", "err", err)
	}
	return c.grantMR(rl, r, off, size, op)
}

// grantAccess is the remote access a token grants for op.
func grantAccess(op OpType) roce.Access {
	if op == OpPut {
		return roce.AccessRemoteRead
	}
	return roce.AccessRemoteWrite
}

// grantMR grants the range as a memory region of its own.
func (c *Client) grantMR(rl *rail, r *region, off, size uint64, op OpType) (Token, *grant, error) {
	access := grantAccess(op)
	if op == OpGet {
		access |= roce.AccessLocalWrite
	}
	mr, err := rl.pd.RegisterMR(r.buf[off:off+size:off+size], access)
	if err != nil {
		return Token{}, nil, newErr("grant", syscall.ENOMEM, ErrInvalid, "%v", err)
	}
	g := &grant{mr: mr, rail: rl, reg: r, off: off, size: size, op: op}
	if err := c.addGrant(g); err != nil {
		_ = mr.Close()
		return Token{}, nil, err
	}
	c.stats.RegionGrants.Add(1)
	return c.token(rl, mr.Addr(), size, mr.RKey(), rl.endpoint), g, nil
}

// grantWindow grants the range as a type 2 window of the registration's
// region, bound through sc, reserved by windowConn: the reservation
// becomes the grant's, or is released.
func (c *Client) grantWindow(sc *serverConn, r *region, off, size uint64, op OpType) (Token, *grant, error) {
	rl := sc.rail
	mw, err := rl.pd.AllocMW(roce.MWType2)
	if err != nil {
		c.release(sc)
		return Token{}, nil, err
	}
	mr := r.mrs[rl.idx]
	// A type 2 bind names the window's next key: the same index, the
	// consumer key (the low 8 bits) one on.
	key := mw.RKey()
	key = key&^0xFF | (key+1)&0xFF
	wr := roce.SendWR{Opcode: roce.WRBindMW, MW: mw, RKey: key,
		Bind: roce.MWBindInfo{MR: mr, Addr: mr.Addr() + off, Length: size, Access: grantAccess(op)}}
	if err := sc.local(&wr); err != nil {
		_ = mw.Close()
		c.release(sc)
		return Token{}, nil, err
	}
	g := &grant{mw: mw, wc: sc, rkey: key, rail: rl, reg: r, off: off, size: size, op: op}
	if err := c.addGrant(g); err != nil {
		_ = c.unbind(g)
		c.release(sc)
		return Token{}, nil, err
	}
	c.stats.WindowGrants.Add(1)
	return c.token(rl, mr.Addr()+off, size, key, sc.qpn), g, nil
}

// release gives back a reservation of windowConn's.
func (c *Client) release(sc *serverConn) {
	c.mu.Lock()
	sc.windows--
	c.mu.Unlock()
}

// addGrant records a new grant on its registration, unless the
// registration has gone.
func (c *Client) addGrant(g *grant) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() || c.regions[g.reg.start] != g.reg {
		return newErr("grant", syscall.EINVAL, ErrNotRegistered, "deregistered")
	}
	g.reg.grants[g] = struct{}{}
	c.unnamed++
	c.stats.Grants.Add(1)
	return nil
}

// token names a grant: qpn is the rail's endpoint number (a region) or
// the QPN of the connection a window is bound through.
func (c *Client) token(rl *rail, addr, size uint64, rkey, qpn uint32) Token {
	return Token{Addr: addr, Size: uint32(size), RKey: rkey, LID: rl.addr.Port(),
		QPN: qpn, HasGID: true, GID: rl.gid}
}

// windowConn picks, and reserves (see release), the connection to bind a
// window through for a token handed to server: a live connection of that
// server's on rl that no other live window is bound through, so that the
// server's requests of concurrent tokens run on as many QPs (and
// channels) as there are tokens. It returns nil, and the token is a
// region, when windows are off, the server is not known, or it has no
// such connection: the first request, or more tokens at once than it has
// connections (a region request then runs on the channel the server
// picks, which connects to the client if it has not yet). A connection
// whose QPN is the rail's endpoint number is never picked, so that a
// token's qp field names either the endpoint or a QPN.
//
// An invalid server is the one ClientOptions.Servers names alone, else,
// for a callback's token (guess), the one the last callback named
// (AllowServer corrects a wrong guess), else, with no ClientOptions.Servers,
// the only server connected on rl. A window token guessed so but handed
// to another server is refused when that server connects with its QPN
// (see answer): the callback fails, is retried, and from then on the
// client guesses no more from connections (its tokens that name no server
// are regions).
func (c *Client) windowConn(rl *rail, server netip.Addr, guess bool) *serverConn {
	if !c.windows {
		return nil
	}
	server = server.Unmap()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !server.IsValid() {
		switch {
		case len(c.servers) == 1:
			server = c.servers[0]
		case !guess:
		case c.lastNamed.IsValid():
			server = c.lastNamed
		case len(c.servers) == 0 && !c.ambiguous.Load():
			server = c.onlyServerLocked(rl)
		}
		if !server.IsValid() {
			return nil
		}
	}
	for _, sc := range c.conns {
		if sc.rail == rl && sc.from == server && sc.windows == 0 && sc.qpn != rl.endpoint && sc.live() && sc.heardFrom() {
			sc.windows++
			return sc
		}
	}
	return nil
}

// onlyServerLocked returns the address of the servers connected on rl,
// when they all have one (invalid otherwise).
func (c *Client) onlyServerLocked(rl *rail) netip.Addr {
	var only netip.Addr
	for _, sc := range c.conns {
		if sc.rail != rl || !sc.live() {
			continue
		}
		if only.IsValid() && sc.from != only {
			return netip.Addr{}
		}
		only = sc.from
	}
	return only
}

// unbind invalidates a grant's window (LOCAL_INV through the connection
// it was bound through) and deallocates it, which revokes its key even
// where the invalidation could not run (the connection failed).
func (c *Client) unbind(g *grant) error {
	inv := roce.SendWR{Opcode: roce.WRLocalInv, InvalidateRKey: g.rkey}
	if err := g.wc.local(&inv); err != nil && g.wc.live() {
		c.telem.error("window invalidation failed", "err", err)
	}
	return g.mw.Close()
}

// allow records the server a grant's token is handed to.
func (c *Client) allow(g *grant, a netip.Addr) {
	a = a.Unmap()
	if !a.IsValid() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.done || g.server.IsValid() {
		return
	}
	g.server = a
	c.unnamed--
	c.allowed[a]++
}

// admits reports whether a server at a may connect: a live token was
// handed to it (or, for tokens that name no server, it is one of
// ClientOptions.Servers, or there are none).
func (c *Client) admits(a netip.Addr) bool {
	a = a.Unmap()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.allowed[a] > 0 {
		return true
	}
	if c.unnamed == 0 {
		return false
	}
	if len(c.servers) == 0 {
		return true
	}
	for _, s := range c.servers {
		if s == a {
			return true
		}
	}
	return false
}

// revoke ends a grant: its rkey is never honoured again. It may be called
// more than once.
func (c *Client) revoke(g *grant) error {
	c.mu.Lock()
	gs := c.detachOneLocked(g)
	c.mu.Unlock()
	return c.destroy(gs)
}

func (c *Client) detachOneLocked(g *grant) []*grant {
	if g.done {
		return nil
	}
	g.done = true
	delete(g.reg.grants, g)
	if g.wc != nil {
		g.wc.windows--
	}
	if g.server.IsValid() {
		if c.allowed[g.server]--; c.allowed[g.server] <= 0 {
			delete(c.allowed, g.server)
		}
	} else {
		c.unnamed--
	}
	return []*grant{g}
}

// detachLocked takes every grant of r out of use (Deregister).
func (c *Client) detachLocked(r *region) []*grant {
	var gs []*grant
	for g := range r.grants {
		gs = append(gs, c.detachOneLocked(g)...)
	}
	for s, g := range c.tokens {
		if g.reg == r {
			delete(c.tokens, s)
		}
	}
	return gs
}

// destroy deregisters detached grants' regions.
func (c *Client) destroy(gs []*grant) error {
	var errs []error
	for _, g := range gs {
		if g.mw != nil {
			errs = append(errs, c.unbind(g))
		} else {
			errs = append(errs, g.mr.Close())
		}
		c.stats.Revokes.Add(1)
	}
	return errors.Join(errs...)
}

// find returns the registration holding all of buf and buf's offset in it.
func (c *Client) find(buf []byte) (*region, uint64, bool) {
	if len(buf) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, r := range c.regions {
		if p >= r.start && p-r.start <= uintptr(len(r.buf)) && uintptr(len(buf)) <= uintptr(len(r.buf))-(p-r.start) {
			return r, uint64(p - r.start), true
		}
	}
	return nil, 0, false
}

// MaxRequestCallbackSize returns the largest chunk one callback gets for
// buf (cuMemObjGetMaxRequestCallbackSize), or -1 when buf is not inside a
// registration.
func (c *Client) MaxRequestCallbackSize(buf []byte) int64 {
	r, off, ok := c.find(buf)
	if !ok {
		return -1
	}
	return min(c.maxCB, int64(uint64(len(r.buf))-off), MaxRegSize)
}

// GetRDMAToken returns the descriptor of size bytes at offset of the
// registration that starts at buf, for op (cuMemObjGetRDMAToken). Its
// rkey grants exactly that range until PutRDMAToken, Deregister or Close.
// The token names no server: see ClientOptions.Servers, or use
// GetRDMATokenFor.
func (c *Client) GetRDMAToken(buf []byte, size, offset uint64, op OpType) (string, error) {
	return c.GetRDMATokenFor(buf, size, offset, op, netip.Addr{})
}

// GetRDMATokenFor is GetRDMAToken for a token handed to the server at
// server: the listener accepts connections from it while the token lives.
func (c *Client) GetRDMATokenFor(buf []byte, size, offset uint64, op OpType, server netip.Addr) (string, error) {
	const name = "GetRDMAToken"
	if op != OpGet && op != OpPut {
		return "", newErr(name, syscall.EINVAL, ErrInvalid, "%v", op)
	}
	if len(buf) == 0 {
		return "", newErr(name, syscall.EINVAL, ErrInvalid, "empty buffer")
	}
	c.mu.RLock()
	r := c.regions[uintptr(unsafe.Pointer(unsafe.SliceData(buf)))]
	c.mu.RUnlock()
	if r == nil {
		return "", newErr(name, syscall.EINVAL, ErrNotRegistered, "")
	}
	n := uint64(len(r.buf))
	if size == 0 || offset > n || size > n-offset {
		return "", newErr(name, syscall.EINVAL, ErrRange, "%d bytes at offset %d of a %d-byte registration", size, offset, n)
	}
	tok, g, err := c.grantRange(c.pick(), r, offset, size, op, server, false)
	if err != nil {
		err.(*Error).Op = name
		return "", err
	}
	c.allow(g, server)
	s := tok.String()
	c.mu.Lock()
	c.tokens[s] = g
	c.mu.Unlock()
	return s, nil
}

// PutRDMAToken releases a descriptor from GetRDMAToken
// (cuMemObjPutRDMAToken); one this client did not issue (or already
// released) fails with ErrInvalid.
// Its rkey is dead from then on: a server still using it gets a remote
// access error.
func (c *Client) PutRDMAToken(desc string) error {
	c.mu.Lock()
	g, ok := c.tokens[desc]
	if !ok {
		c.mu.Unlock()
		return newErr("PutRDMAToken", syscall.EINVAL, ErrInvalid, "not an outstanding token of this client")
	}
	delete(c.tokens, desc)
	gs := c.detachOneLocked(g)
	c.mu.Unlock()
	return c.destroy(gs)
}

// Get fills buf with an object through the Get callback (cuObjGet): buf
// must lie inside a registration; it is cut into chunks of at most
// MaxRequestCallbackSize bytes, one callback each, object offsets from
// offset. user is returned by GetCtx in the callback. It returns the bytes
// the callbacks reported. Invalid arguments fail with ErrInvalid before
// any callback; callback errors are returned (after the configured
// retries for retryable ones).
func (c *Client) Get(ctx context.Context, user any, buf []byte, offset, bufOffset int64) (int64, error) {
	return c.io(ctx, "Get", OpGet, c.ops.Get, user, buf, offset, bufOffset)
}

// Put sends buf as an object through the Put callback (cuObjPut); as Get.
func (c *Client) Put(ctx context.Context, user any, buf []byte, offset, bufOffset int64) (int64, error) {
	return c.io(ctx, "Put", OpPut, c.ops.Put, user, buf, offset, bufOffset)
}

func (c *Client) io(ctx context.Context, name string, op OpType, cb Callback, user any, buf []byte, offset, bufOffset int64) (int64, error) {
	switch {
	case user == nil:
		return 0, newErr(name, syscall.EINVAL, ErrInvalid, "nil user context")
	case len(buf) == 0:
		return 0, newErr(name, syscall.EINVAL, ErrInvalid, "empty buffer")
	case offset < 0 || bufOffset < 0:
		return 0, newErr(name, syscall.EINVAL, ErrInvalid, "negative offset")
	case bufOffset >= int64(len(buf)):
		return 0, newErr(name, syscall.EINVAL, ErrInvalid, "buffer offset %d of %d bytes", bufOffset, len(buf))
	case c.closed.Load():
		return 0, newErr(name, syscall.ENODEV, ErrClosed, "")
	}
	buf = buf[bufOffset:]
	r, roff, ok := c.find(buf)
	if !ok {
		return 0, newErr(name, syscall.EINVAL, ErrNotRegistered, "system memory must be registered")
	}
	if cb == nil {
		return 0, newErr(name, syscall.ENOTSUP, ErrNoCallback, "")
	}
	chunk := c.MaxRequestCallbackSize(buf)
	type result struct {
		n   int
		err error
	}
	if op == OpPut {
		// The caller's writes happen before the server's READs (Go's
		// memory model needs the device lock as the edge: no local
		// completion reports a remote access).
		r.sync(OpPut)
	}
	nchunks := (int64(len(buf)) + chunk - 1) / chunk
	results := make([]result, nchunks)
	sem := make(chan struct{}, c.parallel)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range nchunks {
		off := i * chunk
		n := min(chunk, int64(len(buf))-off)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			results[i].err = ctx.Err()
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			h := &Handle{ctx: ctx, user: user, Op: op}
			got, err := c.call(ctx, cb, h, buf[off:off+n], offset+off, r, roff+uint64(off), op)
			results[i] = result{got, err}
			if err != nil {
				cancel() // the request failed: start no more chunks
			}
		}()
	}
	wg.Wait()
	if op == OpGet {
		r.sync(OpGet) // the server's WRITEs happen before the caller's reads
	}
	var total int64
	for _, res := range results {
		if res.err != nil {
			c.telem.error("request failed", "op", name, "err", res.err)
			errno := Errno(res.err)
			if errno == 0 {
				errno = syscall.EIO
			}
			return total, &Error{Op: name, Errno: errno, Err: res.err}
		}
		total += int64(res.n)
	}
	if op == OpGet {
		c.stats.Gets.Add(1)
		c.stats.GetBytes.Add(uint64(total))
	} else {
		c.stats.Puts.Add(1)
		c.stats.PutBytes.Add(uint64(total))
	}
	return total, nil
}

// call runs one callback with the configured retries; each attempt's
// token names the rail pick chooses then, so a retry may fail over.
func (c *Client) call(ctx context.Context, cb Callback, h *Handle, chunk []byte, off int64, r *region, roff uint64, op OpType) (int, error) {
	retries := c.cfg.Properties.IORetryCount
	for attempt := 0; ; attempt++ {
		c.stats.Callbacks.Add(1)
		rl := c.pick()
		tok, g, err := c.grantRange(rl, r, roff, uint64(len(chunk)), op, netip.Addr{}, true)
		if err != nil {
			return 0, err
		}
		info := RDMAInfo{Desc: tok.String(), Token: tok, c: c, g: g}
		n, err := cb(h, chunk, off, &info)
		// The attempt is over, whatever its outcome: its token dies, so a
		// replay (or a server still at work after a timeout) gets a remote
		// access error. AllowServer may have replaced the grant.
		if rerr := c.revoke(info.g); rerr != nil {
			c.telem.error("revoke", "err", rerr)
		}
		if Retryable(err) {
			c.attempted(rl, err)
		} else {
			c.attempted(rl, nil)
		}
		if err == nil {
			if n < 0 || n > len(chunk) {
				return 0, fmt.Errorf("%w: callback reported %d bytes for a %d-byte chunk", ErrInvalid, n, len(chunk))
			}
			return n, nil
		}
		if !Retryable(err) || attempt >= int(retries) {
			return 0, err
		}
		c.stats.Retries.Add(1)
		c.telem.info("retrying callback", "err", err, "attempt", attempt+1)
		t := time.NewTimer(time.Duration(c.cfg.Properties.IORetryDelayMS) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, errors.Join(err, ctx.Err())
		}
	}
}

// Close stops listening, disconnects the servers and deregisters what is
// still registered.
func (c *Client) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.cancel()
	var errs []error
	for _, r := range c.rails {
		errs = append(errs, r.closeListener())
	}
	c.wg.Wait()
	for _, r := range c.rails {
		if r.dct != nil {
			// A server still writing gets an unknown-target NAK from now on.
			errs = append(errs, r.dct.close())
			r.dct = nil
		}
	}
	c.mu.Lock()
	var gs []*grant
	for _, r := range c.regions {
		gs = append(gs, c.detachLocked(r)...)
	}
	regs := c.regions
	c.regions = map[uintptr]*region{}
	c.mu.Unlock()
	errs = append(errs, c.destroy(gs))
	for _, r := range regs {
		errs = append(errs, r.close())
	}
	for _, r := range c.rails {
		errs = append(errs, r.close())
	}
	return errors.Join(errs...)
}
