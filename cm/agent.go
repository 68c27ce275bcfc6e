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
	"github.com/goroce/goroce/roce"
)

// agent runs the CM of one device: it owns the device's GSI QP (QP1), an
// Engine, and one goroutine that moves MADs between them and fires timers.
// Listeners and connections of the device share it.
type agent struct {
	dev      *roce.Device
	pd       *roce.PD
	scq, rcq *roce.CQ
	gsi      *roce.QP
	slab     *roce.RecvSlab
	inflight int // MADs posted and not yet completed (agent goroutine only)
	// unresolved counts MADs dropped for a neighbour that was not known
	// (and did not resolve in the background, or was not tried).
	unresolved atomic.Uint64

	mu        sync.Mutex // guards everything below
	eng       *Engine
	ids       map[uint32]*idState
	listeners map[uint64]*Listener
	ahs       map[[2]netip.Addr]*roce.AH
	resolving map[netip.Addr]struct{} // neighbours being resolved off the agent's goroutine (mu)
	refs      int
	stopping  bool

	kick chan struct{}
	done chan struct{}
}

// idState routes the events of one communication ID to its owner.
type idState struct {
	events chan Event
	closed chan struct{} // closed when the connection ends (peer DREQ, REJ, timeout, Close)
	err    error         // why it ended (agent.mu)
	ended  bool
}

func newIDState() *idState {
	return &idState{events: make(chan Event, 16), closed: make(chan struct{})}
}

// end records why the connection ended, the first cause only, and closes
// the Done channel. The caller holds agent.mu.
func (s *idState) end(err error) {
	if !s.ended {
		s.ended = true
		s.err = err
		close(s.closed)
	}
}

type monoClock struct{ start time.Time }

func (c monoClock) Now() time.Duration { return time.Since(c.start) }

// Linger bounds how long an agent without users keeps running so that its
// last DREQ/DREP exchanges and timewait complete.
const agentLinger = 5 * time.Second

func (a *agent) release() {
	a.mu.Lock()
	a.refs--
	if a.refs == 0 {
		a.stopping = true
	}
	a.mu.Unlock()
	a.poke()
}

func (a *agent) poke() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

const (
	// maxResolving bounds the neighbour resolutions the agent runs in the
	// background at once (resolveLater).
	maxResolving = 32
	// resolveTimeout bounds one of them.
	resolveTimeout = 3 * time.Second

	gsiRecvBuffers = 64
	gsiSendWR      = 256
)

func startAgent(dev *roce.Device, o *ManagerOptions) (_ *agent, err error) {
	a := &agent{dev: dev, ids: map[uint32]*idState{}, listeners: map[uint64]*Listener{},
		ahs: map[[2]netip.Addr]*roce.AH{}, resolving: map[netip.Addr]struct{}{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	defer func() {
		if err != nil {
			a.teardown()
		}
	}()
	if a.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if a.scq, err = dev.CreateCQ(gsiSendWR); err != nil {
		return nil, err
	}
	if a.rcq, err = dev.CreateCQ(gsiRecvBuffers * 2); err != nil {
		return nil, err
	}
	a.gsi, err = a.pd.CreateQP(&roce.QPInitAttr{Type: roce.GSI, SendCQ: a.scq, RecvCQ: a.rcq, SigAll: true,
		Cap: roce.QPCap{MaxSendWR: gsiSendWR, MaxRecvWR: gsiRecvBuffers, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: mad.Size}})
	if err != nil {
		return nil, fmt.Errorf("cm: cannot take the GSI QP (QP1) of the device: %w", err)
	}
	ctx := context.Background()
	if err = a.gsi.Modify(ctx, &roce.QPAttr{State: roce.StateInit, Port: 1, QKey: roce.GSIQKey},
		roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrQKey); err != nil {
		return nil, err
	}
	if err = a.gsi.Modify(ctx, &roce.QPAttr{State: roce.StateRTR}, roce.AttrState); err != nil {
		return nil, err
	}
	if err = a.gsi.Modify(ctx, &roce.QPAttr{State: roce.StateRTS, SQPSN: rand.Uint32() & ib.PSNMask},
		roce.AttrState|roce.AttrSQPSN); err != nil {
		return nil, err
	}
	// Room for the network-header area too: the slab adds it only for QPs
	// of type UD, and the GSI QP is type GSI.
	if a.slab, err = a.pd.NewRecvSlab(a.gsi, gsiRecvBuffers, roce.GRHSize+mad.Size); err != nil {
		return nil, err
	}
	info := dev.Info()
	clock := o.Clock
	if clock == nil {
		clock = monoClock{time.Now()}
	}
	a.eng, err = NewEngine(Config{Clock: clock, Rand: rand.Uint32,
		LocalCAGUID: info.NodeGUID, HiTID: rand.Uint32(), MaxPeerCMTimeout: o.MaxPeerCMTimeout,
		REQRate: o.REQRate, REQBurst: o.REQBurst, REQSources: o.REQSources})
	if err != nil {
		return nil, err
	}
	go a.run()
	return a, nil
}

func (a *agent) teardown() {
	if a.gsi != nil {
		_ = a.gsi.Close()
	}
	if a.slab != nil {
		_ = a.slab.Close()
	}
	for _, ah := range a.ahs {
		_ = ah.Close()
	}
	if a.scq != nil {
		_ = a.scq.Close()
	}
	if a.rcq != nil {
		_ = a.rcq.Close()
	}
	if a.pd != nil {
		_ = a.pd.Close()
	}
}

// run is the agent's goroutine.
func (a *agent) run() {
	defer close(a.done)
	defer a.leftRegistry() // before done closes: a waiting acquire then finds QP1 free
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var lingerUntil time.Time
	wcs := make([]roce.WorkCompletion, 32)
	for {
		// The registry lock is taken first so that acquire either finds
		// the agent still registered (and revives it) or not at all.
		registry.Lock()
		a.mu.Lock()
		if a.stopping {
			if lingerUntil.IsZero() {
				lingerUntil = time.Now().Add(agentLinger)
			}
			// Idle means no ID left and every queued MAD on the wire:
			// the REJ of a cancelled dial leaves no ID behind but must
			// still reach the peer, which would otherwise wait for it.
			n, _ := a.eng.Len()
			idle := n == 0 && len(a.eng.out) == 0 && a.inflight == 0
			if idle || time.Now().After(lingerUntil) {
				a.leaveRegistryLocked()
				a.mu.Unlock()
				registry.Unlock()
				a.teardown()
				return
			}
		} else {
			lingerUntil = time.Time{}
		}
		registry.Unlock()
		wait := time.Hour
		if d, ok := a.eng.NextDeadline(); ok {
			wait = max(d-a.eng.cfg.Clock.Now(), 0)
		}
		var sent <-chan struct{} // send completions wake the agent only when it waits to stop
		if a.stopping {
			wait = min(wait, time.Until(lingerUntil))
			if len(a.eng.out) > 0 {
				wait = 0
			}
			if a.inflight > 0 {
				sent = a.scq.Ready()
			}
		}
		a.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-a.rcq.Ready():
		case <-sent:
		case <-timer.C:
		case <-a.kick:
		case <-a.dev.Done():
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		err := a.step(wcs)
		select {
		case <-a.dev.Done():
			err = roce.ErrClosed // the device closed: nothing will come
		default:
		}
		if errors.Is(err, roce.ErrClosed) {
			a.mu.Lock()
			for _, s := range a.ids {
				s.end(errDeviceClosed)
			}
			a.mu.Unlock()
			a.exit()
			return
		}
	}
}

func (a *agent) exit() {
	registry.Lock()
	a.leaveRegistryLocked()
	registry.Unlock()
	a.teardown()
}

// step receives MADs, runs timers, dispatches events and sends MADs.
func (a *agent) step(wcs []roce.WorkCompletion) error {
	for {
		n := a.rcq.Poll(wcs)
		for i := range wcs[:n] {
			wc := &wcs[i]
			if !a.slab.Owns(wc) {
				continue
			}
			if wc.Status == roce.WCSuccess {
				grh, b := a.slab.GRH(wc), a.slab.Bytes(wc)
				if grh == nil && len(b) >= roce.GRHSize {
					grh, b = b[:roce.GRHSize], b[roce.GRHSize:]
				}
				if p, ok := grhPath(grh); ok {
					a.mu.Lock()
					_ = a.eng.Receive(p, b) // malformed MADs are counted and dropped
					a.mu.Unlock()
				}
			}
			if err := a.slab.Repost(wc); err != nil {
				return err
			}
		}
		if n < len(wcs) {
			break
		}
	}
	for { // send completions only free the send queue
		n := a.scq.Poll(wcs)
		if n == 0 {
			break
		}
		a.inflight = max(a.inflight-n, 0)
	}
	a.mu.Lock()
	a.eng.Advance()
	a.dispatchLocked()
	var outs []Outbound
	for {
		o, ok := a.eng.PollOutbound()
		if !ok {
			break
		}
		outs = append(outs, o)
	}
	a.mu.Unlock()
	for i := range outs {
		if err := a.sendMAD(&outs[i]); errors.Is(err, roce.ErrClosed) {
			return err
		}
	}
	return nil
}

// grhPath reads the addresses from the network-header area of a UD receive.
func grhPath(g []byte) (Path, bool) {
	if len(g) < roce.GRHSize {
		return Path{}, false
	}
	if g[20]>>4 == 4 { // 20 zero bytes, then the IPv4 header
		return Path{Remote: netip.AddrFrom4([4]byte(g[32:36])), Local: netip.AddrFrom4([4]byte(g[36:40]))}, true
	}
	if g[0]>>4 == 6 {
		return Path{Remote: netip.AddrFrom16([16]byte(g[8:24])), Local: netip.AddrFrom16([16]byte(g[24:40]))}, true
	}
	return Path{}, false
}

// sendMAD posts one MAD to the remote QP1 (inline: no send buffer to manage).
func (a *agent) sendMAD(o *Outbound) error {
	key := [2]netip.Addr{o.Path.Local, o.Path.Remote}
	a.mu.Lock()
	ah := a.ahs[key]
	a.mu.Unlock()
	if ah == nil {
		// Never wait for a neighbour here: this goroutine also receives
		// MADs and runs the retry timers, and under a flood of REQs
		// spoofed from addresses that answer nothing, each REJ would hold
		// it for seconds while real peers' RTUs overflow QP1's receive
		// queue. Only a neighbour already known makes an AH now (every
		// REP's is: the handshake resolves it first, as Dial does for a
		// REQ); any other is resolved in the background and this MAD is
		// dropped, to be sent again by its retry timer or the peer's.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		var err error
		ah, err = a.pd.CreateAH(done, roce.AddressVector{DGID: ib.GIDFromAddr(o.Path.Remote),
			SGID: ib.GIDFromAddr(o.Path.Local), TrafficClass: o.Path.TrafficClass, HopLimit: o.Path.HopLimit})
		if err != nil {
			a.resolveLater(o.Path.Remote)
			return err
		}
		a.mu.Lock()
		a.ahs[key] = ah
		a.mu.Unlock()
	}
	err := a.gsi.PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline | roce.SendSignaled,
		Inline: o.MAD[:], AH: ah, RemoteQPN: 1, RemoteQKey: roce.GSIQKey})
	if err == nil {
		a.inflight++
	}
	return err
}

// resolveLater resolves addr's neighbour in the background, unless it is
// being resolved already or maxResolving resolutions run (a flood from
// many addresses then has most of its answers dropped at once).
func (a *agent) resolveLater(addr netip.Addr) {
	a.mu.Lock()
	_, busy := a.resolving[addr]
	if busy || len(a.resolving) >= maxResolving {
		a.mu.Unlock()
		a.unresolved.Add(1)
		return
	}
	a.resolving[addr] = struct{}{}
	a.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		_, err := a.dev.ResolveNeighbour(ctx, addr)
		cancel()
		a.mu.Lock()
		delete(a.resolving, addr)
		a.mu.Unlock()
		if err != nil {
			a.unresolved.Add(1)
		}
	}()
}

// dispatchLocked hands engine events to listeners and waiting IDs.
func (a *agent) dispatchLocked() {
	for {
		ev, ok := a.eng.PollEvent()
		if !ok {
			return
		}
		switch ev.Type {
		case EventRequest, EventSIDRRequest:
			l := a.listeners[ev.ServiceID]
			if l == nil || !l.offerLocked(ev) {
				a.refuseLocked(ev)
			}
			continue
		case EventExit:
			continue
		}
		s := a.ids[ev.ID]
		if s == nil {
			continue
		}
		select {
		case s.events <- ev:
		default:
		}
		switch ev.Type {
		case EventRejected, EventTimeout:
			s.end(ev.Err)
		case EventDisconnected:
			s.end(errPeerDisconnected)
		case EventDisconnectDone:
			s.end(ErrDisconnected)
		case EventSIDRReply:
			if ev.Err != nil {
				s.end(ev.Err)
			}
		}
	}
}

func (a *agent) refuseLocked(ev Event) {
	if ev.Type == EventSIDRRequest {
		_ = a.eng.SIDRReply(ev.ID, mad.SIDRReject, 0, 0, nil)
		return
	}
	_ = a.eng.Reject(ev.ID, mad.RejConsumerDefined, nil, nil)
}

// do runs f on the engine under the lock, registers id's state if asked,
// and wakes the goroutine to send what f queued.
func (a *agent) do(f func(e *Engine) error) error {
	a.mu.Lock()
	err := f(a.eng)
	a.mu.Unlock()
	a.poke()
	return err
}
