package cm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/errclosed"
	"github.com/goroce/goroce/roce"
)

var (
	// ErrClosed reports use of a closed Manager, Listener or Conn, and is
	// the Err of a connection closed here. It matches net.ErrClosed and
	// roce.ErrClosed (errors.Is), so one test covers a closed device too.
	ErrClosed = errclosed.New("cm: closed")
	// ErrDisconnected is the Err of a connection ended with a DREQ, ours
	// or (wrapped: "by the peer") the peer's.
	ErrDisconnected = errors.New("cm: disconnected")
	// errAnswered: a second answer to a Request.
	errAnswered = stateError("request already answered")

	errPeerDisconnected = fmt.Errorf("%w by the peer", ErrDisconnected)
	errDeviceClosed     = fmt.Errorf("%w: the device closed", ErrClosed)
)

// QPOptions say which PD and CQs a connection's QP uses and how large it
// is. Zero values make the CM create its own PD and CQs (closed with the
// Conn) and use the device's default capacities.
type QPOptions struct {
	PD             *roce.PD
	SendCQ, RecvCQ *roce.CQ
	Cap            roce.QPCap
	SigAll         bool
	// Access is the remote access the QP grants (qp_access_flags). Zero
	// grants what the kernel's rdma_cm does (ib_cm_init_qp_attr):
	// REMOTE_WRITE, plus REMOTE_READ and REMOTE_ATOMIC when this side's
	// negotiated responder resources are not zero (Linux 6.2 and later
	// add the FLUSH flags a device supports; goroce checks FLUSH against
	// the memory region only). roce.AccessLocalWrite alone grants no
	// remote access. Ignored for UD.
	Access roce.Access
	// Prepare, if set, runs once the QP is in INIT and before the CM sends
	// anything that lets the peer start sending: the place to post
	// receives (rdma_cm applications post them before rdma_connect and
	// rdma_accept). An error aborts the connection.
	Prepare func(c *Conn) error
	// Release, if set, runs once when the CM frees the connection's QP:
	// after a handshake that failed or was abandoned (a listener's
	// half-open handshakes displaced by a flood among them), or at Close.
	// It is the place to deregister what Prepare registered in the
	// connection's PD, which is closed right after it; a listener's
	// Prepare runs for every handshake it answers, not only the ones
	// Accept returns.
	Release func(c *Conn)
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
	// Backlog bounds the requests the listener holds before Accept or
	// Request hands them out, waiting or being answered, and the
	// connections established and not yet returned by Accept (0: 16).
	// More are rejected (REJ CONSUMER_DEFINED, SIDR_REP REJECT).
	// Half-open handshakes (being answered: QP, REP, no RTU yet) are
	// held apart, as a SYN queue is apart from the accept queue.
	Backlog int
	// MaxHalfOpen bounds the half-open handshakes of the listener (0:
	// DefaultMaxHalfOpen, and at least Backlog). A request that would
	// pass it makes the listener abandon its oldest half-open handshake
	// (REJ, QP freed): a flood of REQs that are never completed cycles
	// through the half-open table instead of filling the backlog, and a
	// real peer, whose RTU follows its REP within a round trip, gets in.
	// Established connections are never displaced.
	MaxHalfOpen int
	// HalfOpenTimeout bounds how long a handshake stays half-open,
	// whatever response timeout and retries the peer's REQ asked for
	// (0: DefaultHalfOpenTimeout): the REP is retransmitted within it
	// (AcceptParams.REPLifetime), then the handshake fails.
	HalfOpenTimeout time.Duration
	// PrivateData is sent in every REP that Accept sends (at most 196
	// bytes; 136 for SIDR). Request.Accept sends its own.
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
	startPSN      uint32      // the first PSN the QP expects (RC, UC)
	access        roce.Access // QPOptions.Access
	release       func(*Conn) // QPOptions.Release, until it ran
	// UD
	remoteQPN, remoteQKey uint32
	ah                    *roce.AH

	closeOnce sync.Once
	closed    atomic.Bool // Close began: Disconnect reports ErrClosed
}

// QP returns the connection's queue pair.
func (c *Conn) QP() *roce.QP { return c.qp }

// StartingPSN returns the first PSN the connection's QP expects to
// receive (RC and UC): the one it announced in its REQ or REP. A QP whose
// expected PSN (QP.Attr().RQPSN) has moved from it has received requests
// from the peer.
func (c *Conn) StartingPSN() uint32 { return c.startPSN }

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

// Done is closed when the connection ends: from the other side (DREQ,
// REJ), by the CM's retries running out, by Disconnect or Close here, or
// because the device closed. Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.st.closed }

// Err returns why the connection ended: a *mad.RejectError for a REJ,
// ErrTimeout, ErrDisconnected (a DREQ; "by the peer" when it sent it),
// ErrClosed, or the *roce.QPError of a QP that failed on its own (errors.Is
// roce.ErrQPFailed: retries exhausted, a NAK); nil while it is healthy.
func (c *Conn) Err() error {
	c.a.mu.Lock()
	err := c.st.err
	c.a.mu.Unlock()
	if err == nil && c.qp != nil {
		// A QP that failed on its own does not end the connection (the
		// peer may still disconnect it); QP().Failed() signals it.
		if qerr := c.qp.Err(); qerr != nil {
			return c.qpFailure(qerr)
		}
	}
	return err
}

// qpFailure is the connection's error for its QP's failure.
func (c *Conn) qpFailure(qerr error) error {
	return fmt.Errorf("cm: connection to %v: %w", c.remote, qerr)
}

// Disconnect sends a DREQ and waits for the DREP (or the CM's retries to
// run out, or ctx). The QP is moved to the error state. Close still has to
// be called.
func (c *Conn) Disconnect(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
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
// the QP and the PD/CQs the CM created. A second Close, and Disconnect
// after Close, return ErrClosed.
func (c *Conn) Close() error {
	err := error(ErrClosed)
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		_ = c.a.do(func(e *Engine) error {
			if s, err := e.State(c.id); err == nil && s != StateTimewait && s != StateDREQSent {
				_ = e.Destroy(c.id)
			}
			delete(c.a.ids, c.id)
			c.st.end(ErrClosed)
			return nil
		})
		c.toError()
		err = c.freeQP()
		c.a.release()
	})
	return err
}

func (c *Conn) freeQP() error {
	var errs []error
	if c.ah != nil {
		errs = append(errs, c.ah.Close())
	}
	if c.qp != nil {
		errs = append(errs, c.qp.Close())
	}
	if c.release != nil {
		// After the QP, which may still reach the memory, and before
		// the PD, which refuses to close while it is registered.
		release := c.release
		c.release = nil
		release(c)
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
	c.access = o.Access
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
		// No remote access until the CM knows what to grant: INIT →
		// INIT before RTR sets it (cma_init_ib_qp, cma_modify_qp_rtr).
		mask |= roce.AttrAccessFlags
	}
	if err := c.qp.Modify(context.Background(), &attr, mask); err != nil {
		return err
	}
	c.release = o.Release
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

// modifyFromCM applies the CM's attributes to the QP: INIT again with
// the access flags the negotiation allows (or QPOptions.Access), then RTR
// and RTS, as rdma_cm's cma_modify_qp_rtr/rts do.
func (c *Conn) modifyFromCM(ctx context.Context, e *Engine) error {
	for _, st := range []roce.QPState{roce.StateInit, roce.StateRTR, roce.StateRTS} {
		attr, mask, err := e.QPAttr(c.id, st)
		if err != nil {
			return err
		}
		if st == roce.StateInit && c.access != 0 {
			attr.AccessFlags = c.access
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
func Dial(ctx context.Context, dev *roce.Device, raddr netip.AddrPort, opts DialOptions) (*Conn, error) {
	return dial(ctx, dev, func() (*agent, error) { return acquire(dev) }, raddr, &opts)
}

// dialPlan is a checked Dial: the port space, addresses and the request's
// private data (rdma_cm header first).
type dialPlan struct {
	opts          *DialOptions
	ps            mad.PortSpace
	raddr         netip.AddrPort
	local, remote netip.Addr
	sport         uint16
	privateData   []byte
}

// planDial checks the options and picks the source address and port.
func planDial(dev *roce.Device, raddr netip.AddrPort, opts *DialOptions) (*dialPlan, error) {
	p := &dialPlan{opts: opts, ps: opts.PortSpace, raddr: raddr, remote: raddr.Addr().Unmap(), sport: ephemeralPort()}
	if p.ps == 0 {
		p.ps = mad.PortSpaceTCP
	}
	if p.ps != mad.PortSpaceTCP && p.ps != mad.PortSpaceUDP {
		return nil, fmt.Errorf("%w: port space %v", ErrInvalid, p.ps)
	}
	limit := mad.CMAUserDataSize
	if p.ps == mad.PortSpaceUDP {
		limit = mad.SIDRREQPrivateDataSize - mad.CMAHeaderSize
	}
	if len(opts.PrivateData) > limit {
		return nil, fmt.Errorf("%w: %d bytes of private data, at most %d", ErrInvalid, len(opts.PrivateData), limit)
	}
	p.local = opts.LocalAddr
	if !p.local.IsValid() {
		g, err := dev.SourceGID(p.remote)
		if err != nil {
			return nil, fmt.Errorf("cm: no source address for %v: %w", p.remote, err)
		}
		p.local = g.Addr()
	}
	p.privateData = make([]byte, mad.CMAHeaderSize, mad.CMAHeaderSize+len(opts.PrivateData))
	mad.CMAHeader(p.privateData).Encode(&mad.CMAHeaderFields{SrcPort: p.sport, Src: p.local, Dst: p.remote})
	p.privateData = append(p.privateData, opts.PrivateData...)
	return p, nil
}

// dial runs Dial's stages: plan, address resolution, QP, request, reply.
// get returns the CM agent with a reference the Conn keeps.
func dial(ctx context.Context, dev *roce.Device, get func() (*agent, error), raddr netip.AddrPort, opts *DialOptions) (*Conn, error) {
	p, err := planDial(dev, raddr, opts)
	if err != nil {
		return nil, err
	}
	// Address resolution first: a peer without a MAC fails here, before any MAD.
	if _, err := dev.ResolveNeighbour(ctx, p.remote); err != nil {
		return nil, fmt.Errorf("cm: resolve %v: %w", p.remote, err)
	}
	a, err := get()
	if err != nil {
		return nil, err
	}
	c := &Conn{a: a, st: newIDState(), local: netip.AddrPortFrom(p.local, p.sport), remote: netip.AddrPortFrom(p.remote, raddr.Port())}
	typ := roce.RC
	if p.ps == mad.PortSpaceUDP {
		typ = roce.UD
	}
	if err := c.newQP(dev, &p.opts.QP, typ); err != nil {
		return c.fail(err)
	}
	if err := c.request(p); err != nil {
		return c.fail(err)
	}
	return c.awaitReply(ctx, p)
}

// fail frees what a Conn that never connected holds.
func (c *Conn) fail(err error) (*Conn, error) {
	_ = c.freeQP()
	c.a.release()
	return nil, err
}

// abandon withdraws the request (REJ for a REQ) and fails.
func (c *Conn) abandon(err error) (*Conn, error) {
	_ = c.a.do(func(e *Engine) error {
		_ = e.Destroy(c.id)
		delete(c.a.ids, c.id)
		return nil
	})
	return c.fail(err)
}

// forget unregisters the ID's events; the engine keeps or ends the ID.
func (c *Conn) forget() {
	_ = c.a.do(func(*Engine) error { delete(c.a.ids, c.id); return nil })
}

// request sends the REQ (or SIDR_REQ) and registers the ID's events.
func (c *Conn) request(p *dialPlan) error {
	o := p.opts
	sid := mad.ServiceID(p.ps, p.raddr.Port())
	path := Path{Local: p.local, Remote: p.remote, TrafficClass: o.TrafficClass,
		FlowLabel: (uint32(p.sport)*31 + uint32(p.raddr.Port())) & 0xFFFFF}
	return c.a.do(func(e *Engine) error {
		var err error
		if p.ps == mad.PortSpaceUDP {
			c.id, err = e.SIDRRequest(&SIDRParams{ServiceID: sid, Path: path, PrivateData: p.privateData})
		} else {
			mtu := o.PathMTU
			if mtu == 0 {
				mtu = IBoEMTU(c.a.dev.Info().NetdevMTU)
			}
			c.startPSN = randPSN()
			c.id, err = e.Connect(&ConnectParams{ServiceID: sid, Path: path, QPN: c.qp.QPN(),
				StartingPSN: c.startPSN, ResponderResources: defaultU8(o.ResponderResources, 16),
				InitiatorDepth: defaultU8(o.InitiatorDepth, 16), RetryCount: defaultU8(o.RetryCount, 7),
				RNRRetryCount: defaultU8(o.RNRRetryCount, 7), PathMTU: mtu,
				PacketLifeTime: o.PacketLifeTime, PrivateData: p.privateData})
		}
		if err == nil {
			c.a.ids[c.id] = c.st
		}
		return err
	})
}

// awaitReply waits for the REP (then moves the QP to RTS and sends the
// RTU) or the SIDR_REP, a REJ, the CM's timeout, or ctx.
func (c *Conn) awaitReply(ctx context.Context, p *dialPlan) (*Conn, error) {
	for {
		var ev Event
		select {
		case <-ctx.Done():
			return c.abandon(ctx.Err())
		case ev = <-c.st.events:
		}
		switch ev.Type {
		case EventSIDRReply:
			if ev.Err != nil {
				return c.abandon(ev.Err)
			}
			c.remoteQPN, c.remoteQKey = ev.SIDRREP.QPN, ev.SIDRREP.QKey
			c.privateData = ev.SIDRREP.PrivateData
			if err := c.readyUD(ctx, p.local, p.remote); err != nil {
				return c.abandon(err)
			}
			c.forget()
			return c, nil
		case EventReply:
			c.remoteQPN = ev.REP.LocalQPN
			c.privateData = ev.REP.PrivateData
			var qerr error
			err := c.a.do(func(e *Engine) error {
				if qerr = c.modifyFromCM(ctx, e); qerr != nil {
					return e.Reject(c.id, mad.RejConsumerDefined, nil, nil)
				}
				return e.RTU(c.id, nil)
			})
			if qerr != nil || err != nil {
				c.forget()
				return c.fail(errors.Join(qerr, err))
			}
			return c, nil
		case EventRejected, EventTimeout:
			c.forget()
			return c.fail(fmt.Errorf("cm: connect to %v: %w", p.raddr, ev.Err))
		}
	}
}

// readyUD moves a UD QP to RTS and makes the peer's address handle.
func (c *Conn) readyUD(ctx context.Context, local, remote netip.Addr) error {
	for _, st := range []roce.QPState{roce.StateRTR, roce.StateRTS} {
		attr := roce.QPAttr{State: st, SQPSN: randPSN()}
		mask := roce.AttrState
		if st == roce.StateRTS {
			mask |= roce.AttrSQPSN
		}
		if err := c.qp.Modify(ctx, &attr, mask); err != nil {
			return err
		}
	}
	var err error
	c.ah, err = c.pd.CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(remote), SGID: ib.GIDFromAddr(local)})
	return err
}
