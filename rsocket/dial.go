package rsocket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// Stats are counters of the package, for all devices.
type Stats struct {
	// Conns is the number of open connections.
	Conns int64
	// RejectedVersion counts connection requests refused (REJ) because
	// their rs_conn_data was not version 1, RejectedConnData those refused
	// for other malformed conn data.
	RejectedVersion, RejectedConnData uint64
	// ProtocolErrors counts connections ended because the peer broke the
	// protocol (ProtocolError).
	ProtocolErrors uint64
	// CloseTimeouts counts Closes that stopped waiting for the peer to
	// acknowledge their DISCONNECT at the QP's retry timeout.
	CloseTimeouts uint64
	// HandshakeTimeouts counts accept handshakes abandoned at the
	// listener's HandshakeTimeout, or by the CM's bound on half-open
	// handshakes (cm.ListenOptions.HalfOpenTimeout, MaxHalfOpen): peers
	// that never sent their RTU.
	HandshakeTimeouts uint64
}

var stats struct {
	conns                      atomic.Int64
	rejVersion, rejConnData    atomic.Uint64
	protocolErrors, acceptFail atomic.Uint64
	closeTimeouts              atomic.Uint64
	handshakeTimeouts          atomic.Uint64
}

// ReadStats returns the package's counters.
func ReadStats() Stats {
	return Stats{Conns: stats.conns.Load(), RejectedVersion: stats.rejVersion.Load(),
		RejectedConnData: stats.rejConnData.Load(), ProtocolErrors: stats.protocolErrors.Load(),
		CloseTimeouts: stats.closeTimeouts.Load(), HandshakeTimeouts: stats.handshakeTimeouts.Load()}
}

// ErrVersion reports a peer whose rs_conn_data is not version 1
// (librdmacm's rconnect fails with ENOTSUP).
var ErrVersion = fmt.Errorf("rsocket: peer speaks another rsocket version: %w", syscall.ENOTSUP)

// Dialer connects rsockets with Options.
type Dialer struct {
	Options
	// LocalAddr is the source address (default: the device's address of
	// the destination's family).
	LocalAddr netip.Addr
}

// Dial connects to the rsocket listener at address ("host:port") through
// dev, with librdmacm's defaults. network is "tcp", "tcp4" or "tcp6".
func Dial(ctx context.Context, dev *roce.Device, network, address string) (*Conn, error) {
	var d Dialer
	return d.Dial(ctx, dev, network, address)
}

// Dial connects as rconnect does: it makes the QP and buffers, sends a REQ
// carrying its rs_conn_data and checks the one in the REP.
func (d *Dialer) Dial(ctx context.Context, dev *roce.Device, network, address string) (*Conn, error) {
	raddr, err := resolve(ctx, network, address, false)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	c, err := d.dial(ctx, dev, raddr)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: net.TCPAddrFromAddrPort(raddr), Err: err}
	}
	return c, nil
}

func (d *Dialer) dial(ctx context.Context, dev *roce.Device, raddr netip.AddrPort) (*Conn, error) {
	ep, err := newEndpoint(dev, d.Options.resolve())
	if err != nil {
		return nil, err
	}
	// rs_do_connect's conn_param: retry 7, RNR retry 7 (infinite). Its
	// responder resources and initiator depth of 0 cannot be asked of
	// package cm; they only matter for RDMA READ, which rsockets never use.
	opts := cm.DialOptions{QP: ep.qpOptions(), LocalAddr: d.LocalAddr,
		RetryCount: 7, RNRRetryCount: 7, PrivateData: ep.privateData()}
	cmc, err := cm.Dial(ctx, dev, raddr, opts)
	if err != nil {
		ep.free()
		return nil, err
	}
	peer, err := wire.ParseConnData(cmc.PrivateData())
	if err == nil {
		var c *Conn
		if c, err = newConn(ep, cmc, peer); err == nil {
			return c, nil
		}
	}
	if wire.ReasonOf(err) == "version" {
		err = ErrVersion
	}
	cmc.Close()
	ep.free()
	return nil, err
}

// resolve turns "host:port" into an address of the network's family.
func resolve(ctx context.Context, network, address string, listen bool) (netip.AddrPort, error) {
	fam := ""
	switch network {
	case "tcp":
	case "tcp4":
		fam = "4"
	case "tcp6":
		fam = "6"
	default:
		return netip.AddrPort{}, net.UnknownNetworkError(network)
	}
	host, ps, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		p, lerr := net.DefaultResolver.LookupPort(ctx, "tcp", ps)
		if lerr != nil {
			return netip.AddrPort{}, err
		}
		port = uint64(p)
	}
	var ip netip.Addr
	switch {
	case host == "" && listen:
		ip = netip.IPv4Unspecified()
		if fam == "6" {
			ip = netip.IPv6Unspecified()
		}
	case host == "":
		return netip.AddrPort{}, &net.AddrError{Err: "missing address", Addr: address}
	default:
		if ip, err = netip.ParseAddr(host); err != nil {
			ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip"+fam, host)
			if lerr != nil {
				return netip.AddrPort{}, lerr
			}
			if len(ips) == 0 {
				return netip.AddrPort{}, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			ip = ips[0]
		}
	}
	ip = ip.Unmap()
	if (fam == "4" && !ip.Is4()) || (fam == "6" && ip.Is4()) {
		return netip.AddrPort{}, &net.AddrError{Err: "address of the wrong family", Addr: host}
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

// ListenConfig listens for rsockets with Options, which every accepted
// connection inherits (as accepted rsockets inherit the listening
// socket's options).
type ListenConfig struct {
	Options
	// Backlog bounds the connection requests waiting for Accept (0: 16).
	// Handshakes in progress are bounded apart, by MaxHalfOpen, so that
	// peers that never finish theirs cannot fill it; together with the
	// connections established and not yet accepted they are at most
	// Backlog+MaxHalfOpen.
	Backlog int
	// MaxHalfOpen bounds the handshakes in progress (0:
	// cm.DefaultMaxHalfOpen, at least Backlog); past it the CM abandons
	// the oldest (cm.ListenOptions.MaxHalfOpen).
	MaxHalfOpen int
	// HandshakeTimeout bounds each accept handshake (0: 10 s; the CM
	// ends one whose RTU does not come within
	// cm.DefaultHalfOpenTimeout sooner).
	HandshakeTimeout time.Duration
}

// Listen listens for rsocket connections on address ("host:port"; an
// empty host means every address of dev; port 0 picks one) with
// librdmacm's defaults.
func Listen(ctx context.Context, dev *roce.Device, network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.Listen(ctx, dev, network, address)
}

// Listen is rbind + rlisten.
func (lc *ListenConfig) Listen(ctx context.Context, dev *roce.Device, network, address string) (*Listener, error) {
	laddr, err := resolve(ctx, network, address, true)
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	backlog := lc.Backlog
	if backlog <= 0 {
		backlog = 16
	}
	halfOpen := lc.MaxHalfOpen
	if halfOpen <= 0 {
		halfOpen = max(cm.DefaultMaxHalfOpen, backlog)
	}
	opts := cm.ListenOptions{Backlog: backlog, MaxHalfOpen: halfOpen}
	var cl *cm.Listener
	if laddr.Port() != 0 {
		cl, err = cm.Listen(ctx, dev, laddr, opts)
	} else {
		// rdma_bind_addr with port 0 takes a free ephemeral port.
		for i := 0; i < 32; i++ {
			a := netip.AddrPortFrom(laddr.Addr(), uint16(32768+rand.IntN(60999-32768+1)))
			if cl, err = cm.Listen(ctx, dev, a, opts); err == nil {
				laddr = a
				break
			}
		}
	}
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Addr: net.TCPAddrFromAddrPort(laddr), Err: err}
	}
	// A slot per handshake in progress or connection not yet accepted:
	// the CM's half-open bound keeps handshakes from taking them all.
	l := &Listener{cl: cl, dev: dev, cfg: lc.Options.resolve(), addr: net.TCPAddrFromAddrPort(laddr),
		timeout: lc.HandshakeTimeout, slots: make(chan struct{}, backlog+halfOpen), ready: make(chan *Conn, backlog+halfOpen),
		loopDone: make(chan struct{})}
	if l.timeout <= 0 {
		l.timeout = 10 * time.Second
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// SetOptions changes the options of connections whose handshake starts
// later, as rsetsockopt on a listening rsocket does (rstream's server sets
// them before each raccept; librdmacm too may have accepted the next
// connection in the background already).
func (l *Listener) SetOptions(o Options) {
	l.mu.Lock()
	l.cfg = o.resolve()
	l.mu.Unlock()
}

// Listener accepts rsocket connections. It implements net.Listener.
//
// Handshakes run concurrently, as librdmacm accepts in the background: a
// peer that is slow to finish its handshake (or never does) delays no
// other. They start with the first Accept, so options set before it
// (SetOptions) apply to the first connection.
type Listener struct {
	cl      *cm.Listener
	dev     *roce.Device
	mu      sync.Mutex
	cfg     config
	addr    net.Addr
	timeout time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	once    sync.Once

	start    sync.Once
	slots    chan struct{} // one per handshake in progress or connection in ready
	ready    chan *Conn    // established, not yet accepted
	loopDone chan struct{} // closed when acceptLoop ends
	loopErr  error         // why it ended (before loopDone is closed)
	hs       sync.WaitGroup
}

// Accept waits for the next connection (raccept). A request whose
// rs_conn_data is not version 1 is rejected, as librdmacm rejects it, and
// counted; so is one with malformed conn data.
func (l *Listener) Accept() (net.Conn, error) { return l.AcceptRsocket(l.ctx) }

// AcceptRsocket is Accept returning the *Conn, bounded by ctx as well.
func (l *Listener) AcceptRsocket(ctx context.Context) (*Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	select {
	case c := <-l.ready:
		<-l.slots
		return c, nil
	case <-ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: l.addr, Err: ctx.Err()}
	case <-l.loopDone:
	}
	select {
	case c := <-l.ready:
		<-l.slots
		return c, nil
	default:
	}
	err := l.loopErr
	if l.ctx.Err() != nil {
		err = net.ErrClosed
	}
	return nil, &net.OpError{Op: "accept", Net: "rsocket", Addr: l.addr, Err: err}
}

// acceptLoop takes connection requests while there is room in the backlog
// and runs each handshake in its own goroutine.
func (l *Listener) acceptLoop() {
	defer close(l.loopDone)
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.ctx.Done():
			l.loopErr = net.ErrClosed
			return
		}
		r, err := l.cl.Request(l.ctx)
		if err != nil {
			<-l.slots
			l.loopErr = err
			return
		}
		peer, err := wire.ParseConnData(r.PrivateData())
		if err != nil {
			if wire.ReasonOf(err) == "version" {
				stats.rejVersion.Add(1)
			} else {
				stats.rejConnData.Add(1)
			}
			// rs_accept: rdma_reject without private data.
			_ = r.Reject(mad.RejConsumerDefined, nil)
			<-l.slots
			continue
		}
		l.hs.Add(1)
		go func() {
			defer l.hs.Done()
			c, err := l.accept(l.ctx, r, peer)
			if err != nil {
				// That peer's handshake failed; the others go on.
				stats.acceptFail.Add(1)
				if l.ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, cm.ErrTimeout) ||
					errors.Is(err, cm.ErrHalfOpenDropped)) {
					stats.handshakeTimeouts.Add(1)
				}
				<-l.slots
				return
			}
			// ready has room: a slot is held for c.
			l.ready <- c
		}()
	}
}

func (l *Listener) accept(ctx context.Context, r *cm.Request, peer wire.ConnData) (*Conn, error) {
	l.mu.Lock()
	cfg := l.cfg
	l.mu.Unlock()
	ep, err := newEndpoint(l.dev, cfg)
	if err != nil {
		_ = r.Reject(mad.RejNoResources, nil)
		return nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	// rs_accept copies the request's conn params back: the peer's initiator
	// depth and responder resources bound ours (package cm caps them).
	cmc, err := r.Accept(hctx, cm.AcceptOptions{QP: ep.qpOptions(), RNRRetryCount: 7, PrivateData: ep.privateData()})
	if err != nil {
		ep.free()
		return nil, err
	}
	c, err := newConn(ep, cmc, peer)
	if err != nil {
		cmc.Close()
		ep.free()
		return nil, err
	}
	return c, nil
}

// Close stops listening; pending Accepts return net.ErrClosed, handshakes
// in progress are abandoned and connections not yet accepted are closed.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		l.cancel()
		err = l.cl.Close()
		l.start.Do(func() { close(l.loopDone) }) // no loop was started
		<-l.loopDone
		l.hs.Wait()
		for {
			select {
			case c := <-l.ready:
				c.Close()
				continue
			default:
			}
			break
		}
	})
	return err
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.addr }
