package cuobj

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"syscall"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// transport is how a server reaches clients: it opens one path per
// channel. RC is rcTransport; DC is dcTransport, whose path is one DCI
// posting to the token's DCT number (dc.go).
type transport interface {
	// openPath opens channel id's path.
	openPath(id uint16, cq *roce.CQ) (path, error)
	// route returns the channel whose connection carries the requests of
	// tok, when tok names one of the transport's live connections by the
	// client's QPN (a memory window is bound to it; see Token).
	route(tok *Token) (uint16, bool)
	// close releases what the transport shares between paths, after
	// every path is closed.
	close() error
}

// path is one channel's way to the clients. Only the goroutine that holds
// the channel calls post, completed and failed; abort may come from
// Server.Close at any time.
type path interface {
	// post posts wr to the client tok names and returns the local QPN its
	// completion will carry.
	post(ctx context.Context, tok *Token, wr *roce.SendWR) (uint32, error)
	// prepare reaches the client tok names (RC: connects; DC: resolves
	// its address) without posting, within Tunables.ConnectTimeout.
	prepare(ctx context.Context, tok *Token) error
	// gone reports whether the peer of qpn's connection has ended it
	// (RC: a DREQ or the connection's failure), so that work requests
	// still outstanding on it will complete only when the QP gives up.
	gone(qpn uint32) bool
	// completed notes that a work request posted on qpn completed.
	completed(qpn uint32)
	// failed notes a failed completion on qpn; reset asks for the QP to be
	// replaced (qp_reset_on_failure).
	failed(qpn uint32, reset bool)
	// abort moves every QP to the error state, flushing what is
	// outstanding, so that waiters wake.
	abort()
	close() error
}

// dialer is cm.Dial on a device or a *cm.Manager's Dial.
type dialer func(ctx context.Context, raddr netip.AddrPort, o cm.DialOptions) (*cm.Conn, error)

// rcTransport connects to clients with rdma_cm: one RC connection per
// (channel, client endpoint), made by the first request and kept.
type rcTransport struct {
	dial  dialer
	pd    *roce.PD
	rcq   *roce.CQ // receive CQ of every connection: nothing is ever received
	local netip.Addr
	t     *Tunables
	mtu   ib.MTU

	mu sync.Mutex // guards byPeer; taken after an rcPath's mu, never before
	// byPeer holds every channel's live connections by the client's end:
	// a token whose qp field is the client's QPN of one of them names it.
	byPeer map[rcPeer]*rcConn
}

// rcPeer is the client's end of a connection: its address, port and QPN.
type rcPeer struct {
	gid  ib.GID
	port uint16
	qpn  uint32
}

func (rt *rcTransport) openPath(id uint16, cq *roce.CQ) (path, error) {
	return &rcPath{rt: rt, id: id, cq: cq, conns: map[rcKey]*rcConn{}, byQPN: map[uint32]*rcConn{}}, nil
}

func (rt *rcTransport) close() error { return nil }

// peer returns the live connection whose client end tok names, if any:
// the same GID and port, and the client's QPN in tok's qp field. A QPN of
// another client's connection (another GID) or of no live one names none.
func (rt *rcTransport) peer(tok *Token) *rcConn {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	c := rt.byPeer[rcPeer{gid: tok.GID, port: tok.LID, qpn: tok.QPN}]
	if c == nil || c.c.Err() != nil {
		return nil
	}
	return c
}

func (rt *rcTransport) route(tok *Token) (uint16, bool) {
	if c := rt.peer(tok); c != nil {
		return c.p.id, true
	}
	return 0, false
}

type rcKey struct {
	gid      ib.GID
	port     uint16
	endpoint uint32
}

type rcConn struct {
	key         rcKey
	p           *rcPath
	peer        rcPeer
	c           *cm.Conn
	qpn         uint32
	outstanding int
	retired     bool // replaced: closed once nothing is outstanding
}

type rcPath struct {
	rt *rcTransport
	id uint16 // the channel's
	cq *roce.CQ
	mu sync.Mutex // guards the maps against abort
	// conns holds the live connection per client; byQPN every connection
	// with completions still to come.
	conns map[rcKey]*rcConn
	byQPN map[uint32]*rcConn
	dead  bool
}

func (p *rcPath) post(ctx context.Context, tok *Token, wr *roce.SendWR) (uint32, error) {
	c, err := p.conn(ctx, tok)
	if err != nil {
		return 0, err
	}
	if err := c.c.QP().PostSend(wr); err != nil {
		return 0, newErr("post", syscall.EIO, ErrSubmit, "%v", err)
	}
	c.outstanding++
	return c.qpn, nil
}

func (p *rcPath) prepare(ctx context.Context, tok *Token) error {
	_, err := p.conn(ctx, tok)
	return err
}

// conn returns the live connection to the client tok names: the one of
// this channel whose client QPN is tok's qp field (the server routes such
// a token to its channel), else the one to the client's endpoint of that
// number, dialling it if there is none.
func (p *rcPath) conn(ctx context.Context, tok *Token) (*rcConn, error) {
	key := rcKey{gid: tok.GID, port: tok.LID, endpoint: tok.QPN}
	byPeer := p.rt.peer(tok)
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	c := p.conns[key]
	if byPeer != nil && byPeer.p == p && !byPeer.retired {
		c = byPeer
	}
	if c != nil {
		if qerr := c.c.QP().Err(); qerr != nil && !p.rt.t.QPResetOnFailure {
			// Without qp_reset_on_failure a failed QP stays failed, even
			// once the client has hung up on it.
			p.mu.Unlock()
			return nil, newErr("post", syscall.EIO, ErrSubmit, "%v", qerr)
		} else if err := c.c.Err(); err != nil {
			// The client disconnected, the connection timed out, or its QP
			// failed and is reset by dialling again.
			p.retireLocked(c)
			c = nil
		}
	}
	p.mu.Unlock()
	if c == nil {
		return p.connect(ctx, tok, key)
	}
	return c, nil
}

func (p *rcPath) connect(ctx context.Context, tok *Token, key rcKey) (*rcConn, error) {
	// Connections of clients that have gone are closed here, when a new
	// one is made, so that a channel holds no more than its live clients'.
	p.mu.Lock()
	for _, c := range p.conns {
		if c.c.Err() != nil {
			p.retireLocked(c)
		}
	}
	p.mu.Unlock()
	t := p.rt.t
	plt := t.Timeout
	if plt > 1 {
		plt-- // rdma_cm's local ACK timeout is the packet life time + 1
	}
	raddr := netip.AddrPortFrom(netip.AddrFrom16(tok.GID).Unmap(), tok.LID)
	// A token may name a client that never answers: bound the wait so
	// that it holds the channel for ConnectTimeout, not cm's full retries.
	dctx, cancel := context.WithTimeout(ctx, t.ConnectTimeout)
	defer cancel()
	conn, err := p.rt.dial(dctx, raddr, cm.DialOptions{
		QP: cm.QPOptions{PD: p.rt.pd, SendCQ: p.cq, RecvCQ: p.rt.rcq,
			Cap:    roce.QPCap{MaxSendWR: int(t.CQDepth), MaxRecvWR: 1, MaxSendSGE: t.MaxSGE, MaxRecvSGE: 1},
			Access: roce.AccessLocalWrite}, // the server's memory is never remote-accessible
		LocalAddr:      p.rt.local,
		InitiatorDepth: uint8(t.MaxRdAtomic), ResponderResources: 1,
		RetryCount: t.RetryCount, RNRRetryCount: 7,
		PacketLifeTime: plt, TrafficClass: uint8(t.TrafficClass), PathMTU: p.rt.mtu,
		PrivateData: appendHello(nil, ProtoRC, tok.QPN),
	})
	if err != nil {
		var rej *mad.RejectError
		if errors.As(err, &rej) {
			return nil, newErr("connect", syscall.EIO, ErrSubmit, "client %v refused the connection (stale token, or none live for this server?): %w", raddr, err)
		}
		if ctx.Err() == nil && dctx.Err() != nil {
			return nil, newErr("connect", syscall.ETIMEDOUT, ErrConnectTimeout, "client %v, %v: %v", raddr, t.ConnectTimeout, err)
		}
		return nil, newErr("connect", syscall.EIO, ErrSubmit, "client %v: %v", raddr, err)
	}
	if _, _, err := parseHello(conn.PrivateData()); err != nil {
		_ = conn.Close()
		return nil, newErr("connect", syscall.EIO, ErrSubmit, "client %v: %v", raddr, err)
	}
	c := &rcConn{key: key, p: p, c: conn, qpn: conn.QP().QPN(),
		peer: rcPeer{gid: tok.GID, port: tok.LID, qpn: conn.RemoteQPN()}}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		_ = conn.Close()
		return nil, ErrClosed
	}
	p.conns[key] = c
	p.byQPN[c.qpn] = c
	p.rt.mu.Lock()
	p.rt.byPeer[c.peer] = c
	p.rt.mu.Unlock()
	return c, nil
}

// retireLocked takes c out of use; it is closed when its last
// completion came.
func (p *rcPath) retireLocked(c *rcConn) {
	if p.conns[c.key] == c {
		delete(p.conns, c.key)
	}
	p.unpeer(c)
	c.retired = true
	if c.outstanding == 0 {
		delete(p.byQPN, c.qpn)
		_ = c.c.Close()
	}
}

// unpeer takes c out of the transport's index (p.mu held).
func (p *rcPath) unpeer(c *rcConn) {
	p.rt.mu.Lock()
	if p.rt.byPeer[c.peer] == c {
		delete(p.rt.byPeer, c.peer)
	}
	p.rt.mu.Unlock()
}

func (p *rcPath) gone(qpn uint32) bool {
	p.mu.Lock()
	c := p.byQPN[qpn]
	p.mu.Unlock()
	return c != nil && c.c.Err() != nil
}

func (p *rcPath) completed(qpn uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.byQPN[qpn]
	if c == nil {
		return
	}
	if c.outstanding > 0 {
		c.outstanding--
	}
	if c.retired && c.outstanding == 0 {
		delete(p.byQPN, c.qpn)
		_ = c.c.Close()
	}
}

func (p *rcPath) failed(qpn uint32, reset bool) {
	p.mu.Lock()
	c := p.byQPN[qpn]
	p.mu.Unlock()
	if c == nil || !reset {
		return
	}
	// RC has no reset that keeps the peer: the QP is flushed (its other
	// work requests complete with WR_FLUSH_ERR), the connection closed,
	// and the next request dials again.
	_ = c.c.QP().Modify(context.Background(), &roce.QPAttr{State: roce.StateErr}, roce.AttrState)
	p.mu.Lock()
	p.retireLocked(c)
	p.mu.Unlock()
}

func (p *rcPath) abort() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	for _, c := range p.byQPN {
		_ = c.c.QP().Modify(context.Background(), &roce.QPAttr{State: roce.StateErr}, roce.AttrState)
	}
}

func (p *rcPath) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	var errs []error
	for _, c := range p.byQPN {
		p.unpeer(c)
		errs = append(errs, c.c.Close())
	}
	for _, c := range p.conns {
		if _, ok := p.byQPN[c.qpn]; !ok {
			p.unpeer(c)
			errs = append(errs, c.c.Close())
		}
	}
	clear(p.byQPN)
	clear(p.conns)
	return errors.Join(errs...)
}

// family returns "IPv4" or "IPv6" for an address.
func familyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return "IPv4"
	}
	return "IPv6"
}
