package cm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// ErrClosed reports use of a closed Listener or Conn.
var ErrClosed = errors.New("cm: closed")

// QPOptions say which PD and CQs a connection's QP uses and how large it
// is. Zero values make the CM create its own PD and CQs (closed with the
// Conn) and use the device's default capacities.
type QPOptions struct {
	PD             *roce.PD
	SendCQ, RecvCQ *roce.CQ
	Cap            roce.QPCap
	SigAll         bool
	// Prepare, if set, runs once the QP is in INIT and before the CM sends
	// anything that lets the peer start sending: the place to post
	// receives (rdma_cm applications post them before rdma_connect and
	// rdma_accept). An error aborts the connection.
	Prepare func(c *Conn) error
}

// DialOptions configure Dial. The zero value dials like rdma_cm with
// RDMA_PS_TCP and conn_param defaults.
type DialOptions struct {
	QP QPOptions
	// PortSpace is mad.PortSpaceTCP (RC, default) or mad.PortSpaceUDP (a UD
	// QP resolved with SIDR).
	PortSpace mad.PortSpace
	// LocalAddr is the source address (default: the device address of the
	// destination's family).
	LocalAddr netip.Addr
	// ResponderResources / InitiatorDepth offered (0: 16). RetryCount and
	// RNRRetryCount (0: 7, as librdmacm without conn_param).
	ResponderResources, InitiatorDepth uint8
	RetryCount, RNRRetryCount          uint8
	// PathMTU (0: rdma_cm's iboe_get_mtu of the netdev MTU).
	PathMTU ib.MTU
	// PacketLifeTime (0: 18) and TrafficClass of the path.
	PacketLifeTime, TrafficClass uint8
	// PrivateData is sent after the rdma_cm header (at most 56 bytes for RC,
	// 180 for SIDR).
	PrivateData []byte
}

// ListenOptions configure Listen.
type ListenOptions struct {
	QP        QPOptions
	PortSpace mad.PortSpace // default TCP
	// ResponderResources / InitiatorDepth: the most we grant (0: 16), each
	// capped by the peer's offer. RNRRetryCount for the peer's QP (0: 7).
	ResponderResources, InitiatorDepth uint8
	RNRRetryCount                      uint8
	// Backlog of requests not yet accepted (0: 16); more are rejected.
	Backlog int
	// PrivateData is sent in every REP (at most 196 bytes).
	PrivateData []byte
}

// Conn is one end of a CM-established connection: an RC QP in RTS
// (or, for the UDP port space, a UD QP and the peer's QPN and Q_Key).
type Conn struct {
	a             *agent
	id            uint32
	st            *idState
	qp            *roce.QP
	pd            *roce.PD
	scq, rcq      *roce.CQ
	ownPD, ownCQs bool
	local, remote netip.AddrPort
	privateData   []byte
	// UD
	remoteQPN, remoteQKey uint32
	ah                    *roce.AH

	closeOnce sync.Once
	closeErr  error
}

// QP returns the connection's queue pair.
func (c *Conn) QP() *roce.QP { return c.qp }

// PD returns the protection domain of the QP.
func (c *Conn) PD() *roce.PD { return c.pd }

// SendCQ returns the QP's send completion queue.
func (c *Conn) SendCQ() *roce.CQ { return c.scq }

// RecvCQ returns the QP's receive completion queue.
func (c *Conn) RecvCQ() *roce.CQ { return c.rcq }

// LocalAddr returns the local address and rdma_cm port.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// RemoteAddr returns the peer's address and rdma_cm port.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.remote }

// PrivateData returns the peer's private data: the REP's for Dial, the
// REQ's user part (after the rdma_cm header) for Accept.
func (c *Conn) PrivateData() []byte { return c.privateData }

// RemoteQPN returns the peer's QPN (the UD QP to send to for SIDR).
func (c *Conn) RemoteQPN() uint32 { return c.remoteQPN }

// RemoteQKey returns the peer UD QP's Q_Key (SIDR).
func (c *Conn) RemoteQKey() uint32 { return c.remoteQKey }

// AH returns the address handle of the peer (UD connections).
func (c *Conn) AH() *roce.AH { return c.ah }

// Done is closed when the connection ends from the other side (DREQ, REJ)
// or the device closes.
func (c *Conn) Done() <-chan struct{} { return c.st.closed }

// Disconnect sends a DREQ and waits for the DREP (or the CM's retries to
// run out, or ctx). The QP is moved to the error state. Close still has to
// be called.
func (c *Conn) Disconnect(ctx context.Context) error {
	err := c.a.do(func(e *Engine) error {
		if s, err := e.State(c.id); err != nil || s != StateEstablished {
			return nil // already going or gone
		}
		return e.Disconnect(c.id, nil)
	})
	if err != nil {
		return err
	}
	c.toError()
	select {
	case <-c.st.closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Conn) toError() {
	if c.qp != nil {
		_ = c.qp.Modify(context.Background(), &roce.QPAttr{State: roce.StateErr}, roce.AttrState)
	}
}

// Close disconnects (DREQ, without waiting for the answer), and destroys
// the QP and the PD/CQs the CM created.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		_ = c.a.do(func(e *Engine) error {
			if s, err := e.State(c.id); err == nil && s != StateTimewait && s != StateDREQSent {
				_ = e.Destroy(c.id)
			}
			delete(c.a.ids, c.id)
			return nil
		})
		c.toError()
		c.closeErr = c.freeQP()
		c.a.release()
	})
	return c.closeErr
}

func (c *Conn) freeQP() error {
	var errs []error
	if c.ah != nil {
		errs = append(errs, c.ah.Close())
	}
	if c.qp != nil {
		errs = append(errs, c.qp.Close())
	}
	if c.ownCQs {
		errs = append(errs, c.scq.Close(), c.rcq.Close())
	}
	if c.ownPD {
		errs = append(errs, c.pd.Close())
	}
	return errors.Join(errs...)
}

// newQP creates the connection's QP (and PD/CQs if not given) in INIT.
func (c *Conn) newQP(dev *roce.Device, o *QPOptions, typ roce.QPType) error {
	var err error
	c.pd = o.PD
	if c.pd == nil {
		if c.pd, err = dev.AllocPD(); err != nil {
			return err
		}
		c.ownPD = true
	}
	c.scq, c.rcq = o.SendCQ, o.RecvCQ
	if c.scq == nil || c.rcq == nil {
		// Sized to the QP's queues, as librdmacm's rdma_create_qp sizes
		// the CQs it creates: no more completions can be outstanding.
		if c.scq, err = dev.CreateCQ(capOr(o.Cap.MaxSendWR, defaultQueueWRs)); err != nil {
			return err
		}
		if c.rcq, err = dev.CreateCQ(capOr(o.Cap.MaxRecvWR, defaultQueueWRs)); err != nil {
			_ = c.scq.Close()
			return err
		}
		c.ownCQs = true
	}
	if c.qp, err = c.pd.CreateQP(&roce.QPInitAttr{Type: typ, SendCQ: c.scq, RecvCQ: c.rcq, Cap: o.Cap, SigAll: o.SigAll}); err != nil {
		return err
	}
	attr := roce.QPAttr{State: roce.StateInit, Port: 1}
	mask := roce.AttrState | roce.AttrPKeyIndex | roce.AttrPort
	if typ == roce.UD {
		attr.QKey = mad.UDPQKey
		mask |= roce.AttrQKey
	} else {
		attr.AccessFlags = roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic
		mask |= roce.AttrAccessFlags
	}
	if err := c.qp.Modify(context.Background(), &attr, mask); err != nil {
		return err
	}
	if o.Prepare != nil {
		return o.Prepare(c)
	}
	return nil
}

// defaultQueueWRs is the queue depth roce.CreateQP gives a zero capacity.
const defaultQueueWRs = 128

func capOr(n, d int) int {
	if n > 0 {
		return n
	}
	return d
}

// modifyFromCM applies the CM's RTR and RTS attributes to the QP.
func (c *Conn) modifyFromCM(ctx context.Context, e *Engine) error {
	for _, st := range []roce.QPState{roce.StateRTR, roce.StateRTS} {
		attr, mask, err := e.QPAttr(c.id, st)
		if err != nil {
			return err
		}
		if err := c.qp.Modify(ctx, &attr, mask); err != nil {
			return err
		}
	}
	return nil
}

// IBoEMTU is rdma_cm's path MTU for a netdev MTU (iboe_get_mtu): the MTU
// minus the largest RoCEv2 headers (96 bytes), rounded down to an IB MTU.
func IBoEMTU(netdevMTU int) ib.MTU {
	m := netdevMTU - 40 - 8 - 12 - 4 - 28 - 4
	for code := ib.MTU4096; code > ib.MTU256; code-- {
		if m >= code.Bytes() {
			return code
		}
	}
	return ib.MTU256
}

func randPSN() uint32 { return rand.Uint32() & ib.PSNMask }

// ephemeralPort picks an rdma_cm source port like the kernel's
// ip_local_port_range default.
func ephemeralPort() uint16 { return uint16(32768 + rand.IntN(60999-32768+1)) }

func defaultU8(v, d uint8) uint8 {
	if v == 0 {
		return d
	}
	return v
}

// Dial connects to the rdma_cm listener at raddr through dev, like
// rdma_resolve_addr + rdma_resolve_route + rdma_connect. For the TCP port
// space it returns an RC connection in RTS; for the UDP port space it
// resolves the peer's UD QP with SIDR. ctx bounds the whole exchange; when
// it ends first the pending REQ is cancelled with a REJ.
func Dial(ctx context.Context, dev *roce.Device, raddr netip.AddrPort, opts *DialOptions) (*Conn, error) {
	if opts == nil {
		opts = &DialOptions{}
	}
	ps := opts.PortSpace
	if ps == 0 {
		ps = mad.PortSpaceTCP
	}
	if ps != mad.PortSpaceTCP && ps != mad.PortSpaceUDP {
		return nil, fmt.Errorf("%w: port space %v", ErrInvalid, ps)
	}
	limit := mad.CMAUserDataSize
	if ps == mad.PortSpaceUDP {
		limit = mad.SIDRREQPrivateDataSize - mad.CMAHeaderSize
	}
	if len(opts.PrivateData) > limit {
		return nil, fmt.Errorf("%w: %d bytes of private data, at most %d", ErrInvalid, len(opts.PrivateData), limit)
	}
	remote := raddr.Addr().Unmap()
	local := opts.LocalAddr
	if !local.IsValid() {
		g, err := dev.SourceGID(remote)
		if err != nil {
			return nil, fmt.Errorf("cm: no source address for %v: %w", remote, err)
		}
		local = g.Addr()
	}
	// Address resolution first: a peer without a MAC fails here, before any MAD.
	if _, err := dev.ResolveNeighbour(ctx, remote); err != nil {
		return nil, fmt.Errorf("cm: resolve %v: %w", remote, err)
	}
	a, err := acquire(dev)
	if err != nil {
		return nil, err
	}
	sport := ephemeralPort()
	c := &Conn{a: a, st: newIDState(), local: netip.AddrPortFrom(local, sport), remote: netip.AddrPortFrom(remote, raddr.Port())}
	fail := func(err error) (*Conn, error) {
		_ = c.freeQP()
		a.release()
		return nil, err
	}
	typ := roce.RC
	if ps == mad.PortSpaceUDP {
		typ = roce.UD
	}
	if err := c.newQP(dev, &opts.QP, typ); err != nil {
		return fail(err)
	}
	pd := make([]byte, mad.CMAHeaderSize, mad.CMAHeaderSize+len(opts.PrivateData))
	mad.CMAHeader(pd).Encode(&mad.CMAHeaderFields{SrcPort: sport, Src: local, Dst: remote})
	pd = append(pd, opts.PrivateData...)
	sid := mad.ServiceID(ps, raddr.Port())
	path := Path{Local: local, Remote: remote, TrafficClass: opts.TrafficClass,
		FlowLabel: (uint32(sport)*31 + uint32(raddr.Port())) & 0xFFFFF}
	err = a.do(func(e *Engine) error {
		var err error
		if ps == mad.PortSpaceUDP {
			c.id, err = e.SIDRRequest(&SIDRParams{ServiceID: sid, Path: path, PrivateData: pd})
		} else {
			mtu := opts.PathMTU
			if mtu == 0 {
				mtu = IBoEMTU(dev.Info().NetdevMTU)
			}
			c.id, err = e.Connect(&ConnectParams{ServiceID: sid, Path: path, QPN: c.qp.QPN(),
				StartingPSN: randPSN(), ResponderResources: defaultU8(opts.ResponderResources, 16),
				InitiatorDepth: defaultU8(opts.InitiatorDepth, 16), RetryCount: defaultU8(opts.RetryCount, 7),
				RNRRetryCount: defaultU8(opts.RNRRetryCount, 7), PathMTU: mtu,
				PacketLifeTime: opts.PacketLifeTime, PrivateData: pd})
		}
		if err == nil {
			a.ids[c.id] = c.st
		}
		return err
	})
	if err != nil {
		return fail(err)
	}
	abandon := func(err error) (*Conn, error) {
		_ = a.do(func(e *Engine) error {
			_ = e.Destroy(c.id)
			delete(a.ids, c.id)
			return nil
		})
		return fail(err)
	}
	for {
		var ev Event
		select {
		case <-ctx.Done():
			return abandon(ctx.Err())
		case ev = <-c.st.events:
		}
		switch ev.Type {
		case EventSIDRReply:
			if ev.Err != nil {
				return abandon(ev.Err)
			}
			c.remoteQPN, c.remoteQKey = ev.SIDRREP.QPN, ev.SIDRREP.QKey
			c.privateData = ev.SIDRREP.PrivateData
			if c.ah, err = c.pd.CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(remote), SGID: ib.GIDFromAddr(local)}); err != nil {
				return abandon(err)
			}
			for _, st := range []roce.QPState{roce.StateRTR, roce.StateRTS} {
				attr := roce.QPAttr{State: st, SQPSN: randPSN()}
				mask := roce.AttrState
				if st == roce.StateRTS {
					mask |= roce.AttrSQPSN
				}
				if err := c.qp.Modify(ctx, &attr, mask); err != nil {
					return abandon(err)
				}
			}
			_ = a.do(func(*Engine) error { delete(a.ids, c.id); return nil })
			return c, nil
		case EventReply:
			c.remoteQPN = ev.REP.LocalQPN
			c.privateData = ev.REP.PrivateData
			var qerr error
			err := a.do(func(e *Engine) error {
				if qerr = c.modifyFromCM(ctx, e); qerr != nil {
					return e.Reject(c.id, mad.RejConsumerDefined, nil, nil)
				}
				return e.RTU(c.id, nil)
			})
			if qerr != nil || err != nil {
				_ = a.do(func(*Engine) error { delete(a.ids, c.id); return nil })
				return fail(errors.Join(qerr, err))
			}
			return c, nil
		case EventRejected, EventTimeout:
			_ = a.do(func(*Engine) error { delete(a.ids, c.id); return nil })
			return fail(fmt.Errorf("cm: connect to %v: %w", raddr, ev.Err))
		}
	}
}

// Listener accepts rdma_cm connections on one port of one device.
type Listener struct {
	a       *agent
	addr    netip.AddrPort
	sid     uint64
	opts    ListenOptions
	backlog chan Event
	closed  chan struct{}
	once    sync.Once
}

// Listen starts accepting connection requests for addr's port (the
// rdma_cm port) on dev, like rdma_bind_addr + rdma_listen. An unspecified
// address accepts requests for any of the device's addresses.
func Listen(ctx context.Context, dev *roce.Device, addr netip.AddrPort, opts *ListenOptions) (*Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &ListenOptions{}
	}
	o := *opts
	if o.PortSpace == 0 {
		o.PortSpace = mad.PortSpaceTCP
	}
	if o.PortSpace != mad.PortSpaceTCP && o.PortSpace != mad.PortSpaceUDP {
		return nil, fmt.Errorf("%w: port space %v", ErrInvalid, o.PortSpace)
	}
	if len(o.PrivateData) > mad.REPPrivateDataSize {
		return nil, fmt.Errorf("%w: %d bytes of REP private data", ErrInvalid, len(o.PrivateData))
	}
	if o.Backlog <= 0 {
		o.Backlog = 16
	}
	a, err := acquire(dev)
	if err != nil {
		return nil, err
	}
	l := &Listener{a: a, addr: addr, sid: mad.ServiceID(o.PortSpace, addr.Port()), opts: o,
		backlog: make(chan Event, o.Backlog), closed: make(chan struct{})}
	err = a.do(func(e *Engine) error {
		if err := e.Listen(l.sid); err != nil {
			return fmt.Errorf("cm: listen on %v: %w", addr, err)
		}
		a.listeners[l.sid] = l
		return nil
	})
	if err != nil {
		a.release()
		return nil, err
	}
	return l, nil
}

// Addr returns the address the listener was created with.
func (l *Listener) Addr() netip.AddrPort { return l.addr }

// offerLocked queues a request if it is for this listener's address (the
// rdma_cm lookup by the cma_hdr destination) and the backlog has room.
func (l *Listener) offerLocked(ev Event) bool {
	h, err := mad.ParseCMAHeader(ev.PrivateData)
	if err != nil {
		return false // cma.c refuses a bad header; the IB CM then sends REJ 28
	}
	if a := l.addr.Addr(); a.IsValid() && !a.IsUnspecified() && h.Dst() != a.Unmap() {
		return false
	}
	select {
	case l.backlog <- ev:
		return true
	default:
		return false
	}
}

// Accept waits for a connection request and accepts it: it creates the
// QP, moves it to RTS with the negotiated attributes, sends the REP and
// waits for the RTU (RC), or answers the SIDR_REQ with the UD QP (UDP port
// space). One call handles one handshake at a time; call Accept from
// several goroutines to run handshakes in parallel.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	for {
		var ev Event
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closed:
			return nil, ErrClosed
		case ev = <-l.backlog:
		}
		c, err := l.accept(ctx, ev)
		if err == nil || ctx.Err() != nil {
			return c, err
		}
		// That request failed (peer gave up, rejected our REP): next one.
	}
}

func (l *Listener) accept(ctx context.Context, ev Event) (*Conn, error) {
	a := l.a
	dev := a.dev
	h, _ := mad.ParseCMAHeader(ev.PrivateData)
	c := &Conn{a: a, id: ev.ID, st: newIDState(), remote: netip.AddrPortFrom(h.Src(), h.SrcPort()),
		local: netip.AddrPortFrom(ev.Path.Local, l.addr.Port()), privateData: ev.PrivateData[mad.CMAHeaderSize:]}
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
		_ = c.freeQP()
		a.release()
		return nil, err
	}
	typ := roce.RC
	if ev.Type == EventSIDRRequest {
		typ = roce.UD
	}
	if err := c.newQP(dev, &l.opts.QP, typ); err != nil {
		return refuse(err)
	}
	if _, err := dev.ResolveNeighbour(ctx, ev.Path.Remote); err != nil {
		return refuse(err)
	}
	if typ == roce.UD {
		for _, st := range []roce.QPState{roce.StateRTR, roce.StateRTS} {
			attr := roce.QPAttr{State: st, SQPSN: randPSN()}
			mask := roce.AttrState
			if st == roce.StateRTS {
				mask |= roce.AttrSQPSN
			}
			if err := c.qp.Modify(ctx, &attr, mask); err != nil {
				return refuse(err)
			}
		}
		var err error
		if c.ah, err = c.pd.CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(ev.Path.Remote), SGID: ib.GIDFromAddr(ev.Path.Local)}); err != nil {
			return refuse(err)
		}
		if err := a.do(func(e *Engine) error {
			return e.SIDRReply(ev.ID, mad.SIDRSuccess, c.qp.QPN(), mad.UDPQKey, l.opts.PrivateData)
		}); err != nil {
			return refuse(err)
		}
		return c, nil
	}
	req := ev.REQ
	var qerr error
	err := a.do(func(e *Engine) error {
		a.ids[c.id] = c.st
		err := e.Accept(c.id, &AcceptParams{QPN: c.qp.QPN(), StartingPSN: randPSN(),
			ResponderResources: min(defaultU8(l.opts.ResponderResources, 16), req.InitiatorDepth),
			InitiatorDepth:     min(defaultU8(l.opts.InitiatorDepth, 16), req.ResponderResources),
			RNRRetryCount:      defaultU8(l.opts.RNRRetryCount, 7), PrivateData: l.opts.PrivateData})
		if err != nil {
			return err
		}
		// RTR and RTS before the REP leaves (it is only queued), as
		// cma_accept_ib does, so the peer's first packets find the QP ready.
		if qerr = c.modifyFromCM(ctx, e); qerr != nil {
			_ = e.Reject(c.id, mad.RejConsumerDefined, nil, nil)
		}
		return nil
	})
	if err != nil || qerr != nil {
		return refuse(errors.Join(err, qerr))
	}
	for {
		select {
		case <-ctx.Done():
			return refuse(ctx.Err())
		case ev := <-c.st.events:
			switch ev.Type {
			case EventEstablished:
				return c, nil
			case EventRejected, EventTimeout:
				return refuse(fmt.Errorf("cm: accept from %v: %w", c.remote, ev.Err))
			case EventDisconnected:
				// The RTU was lost and the peer already hung up.
				return refuse(fmt.Errorf("cm: accept from %v: %w", c.remote, ErrClosed))
			}
		}
	}
}

// Close stops listening; requests not yet accepted are rejected.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		_ = l.a.do(func(e *Engine) error {
			e.Unlisten(l.sid)
			delete(l.a.listeners, l.sid)
			for {
				select {
				case ev := <-l.backlog:
					l.a.refuseLocked(ev)
				default:
					return nil
				}
			}
		})
		l.a.release()
	})
	return nil
}
