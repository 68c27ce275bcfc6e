package cm

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
)

type fakeClock struct{ t time.Duration }

func (c *fakeClock) Now() time.Duration { return c.t }

// side is one engine with its address and the events it reported.
type side struct {
	e      *Engine
	addr   netip.Addr
	events []Event
}

// pair is two engines joined by a lossless, in-order network that a test
// can filter (drop, duplicate, inspect).
type pair struct {
	t      testing.TB
	clock  *fakeClock
	a, b   *side
	filter func(from *side, o *Outbound) []Outbound // nil: deliver as is
	sent   map[*side][]Outbound                     // every MAD each side sent
}

func newEngine(t testing.TB, clk *fakeClock, seed uint64, guid uint64) *Engine {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	e, err := NewEngine(Config{Clock: clk, Rand: r.Uint32, LocalCAGUID: guid, HiTID: uint32(seed),
		MRAServiceTimeout: DefaultMRAServiceTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func newPair(t testing.TB) *pair {
	clk := &fakeClock{t: time.Hour}
	return &pair{
		t: t, clock: clk,
		a:    &side{e: newEngine(t, clk, 1, 0x505400fffe000001), addr: netip.MustParseAddr("10.0.0.1")},
		b:    &side{e: newEngine(t, clk, 2, 0x505400fffe000002), addr: netip.MustParseAddr("10.0.0.2")},
		sent: map[*side][]Outbound{},
	}
}

func (p *pair) peer(s *side) *side {
	if s == p.a {
		return p.b
	}
	return p.a
}

// pump moves MADs and events until both engines are quiet.
func (p *pair) pump() {
	p.t.Helper()
	for moved := true; moved; {
		moved = false
		for _, s := range []*side{p.a, p.b} {
			for {
				o, ok := s.e.PollOutbound()
				if !ok {
					break
				}
				moved = true
				p.sent[s] = append(p.sent[s], o)
				if o.Path.Local != s.addr {
					p.t.Fatalf("MAD from %v carries local address %v", s.addr, o.Path.Local)
				}
				out := []Outbound{o}
				if p.filter != nil {
					out = p.filter(s, &o)
				}
				dst := p.peer(s)
				for _, d := range out {
					if err := dst.e.Receive(Path{Local: dst.addr, Remote: s.addr}, d.MAD[:]); err != nil {
						p.t.Fatalf("receive: %v", err)
					}
				}
			}
			for {
				ev, ok := s.e.PollEvent()
				if !ok {
					break
				}
				s.events = append(s.events, ev)
			}
		}
	}
}

// advance moves the clock to the next deadline (of either engine) and
// fires it; it returns false when no timer is pending.
func (p *pair) advance() bool {
	d1, ok1 := p.a.e.NextDeadline()
	d2, ok2 := p.b.e.NextDeadline()
	switch {
	case !ok1 && !ok2:
		return false
	case !ok2 || (ok1 && d1 <= d2):
		p.clock.t = max(p.clock.t, d1)
	default:
		p.clock.t = max(p.clock.t, d2)
	}
	p.a.e.Advance()
	p.b.e.Advance()
	p.pump()
	return true
}

// drain runs every timer until none is left (bounded).
func (p *pair) drain() {
	p.t.Helper()
	for i := 0; p.advance(); i++ {
		if i > 10000 {
			p.t.Fatal("timers never settle")
		}
	}
}

// take removes and returns the first event of type typ of s, failing if none.
func (s *side) take(t testing.TB, typ EventType) Event {
	t.Helper()
	for i, ev := range s.events {
		if ev.Type == typ {
			s.events = append(s.events[:i], s.events[i+1:]...)
			return ev
		}
	}
	t.Fatalf("%v: no %v event in %v", s.addr, typ, typesOf(s.events))
	return Event{}
}

func typesOf(evs []Event) []EventType {
	var ts []EventType
	for _, ev := range evs {
		ts = append(ts, ev.Type)
	}
	return ts
}

func (p *pair) connectParams(sid uint64) *ConnectParams {
	return &ConnectParams{
		ServiceID: sid, Path: Path{Local: p.a.addr, Remote: p.b.addr, FlowLabel: 0x83CA0},
		QPN: 0x11, StartingPSN: 0x123456, ResponderResources: 4, InitiatorDepth: 8,
		RetryCount: 7, RNRRetryCount: 6, PathMTU: 3, PrivateData: []byte("hello"),
	}
}

func acceptParams() *AcceptParams {
	return &AcceptParams{QPN: 0x22, StartingPSN: 0xABCDEF, ResponderResources: 8, InitiatorDepth: 2,
		RNRRetryCount: 5, PrivateData: []byte("welcome")}
}

var testSID = mad.ServiceID(mad.PortSpaceTCP, 20001)

// establish runs a full connection setup and returns both IDs.
func (p *pair) establish() (aID, bID uint32) {
	p.t.Helper()
	aID, err := p.a.e.Connect(p.connectParams(testSID))
	if err != nil {
		p.t.Fatal(err)
	}
	p.pump()
	req := p.b.take(p.t, EventRequest)
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		p.t.Fatal(err)
	}
	p.pump()
	p.a.take(p.t, EventReply)
	if err := p.a.e.RTU(aID, nil); err != nil {
		p.t.Fatal(err)
	}
	p.pump()
	p.b.take(p.t, EventEstablished)
	return aID, req.ID
}

func (p *pair) assertEmpty() {
	p.t.Helper()
	for _, s := range []*side{p.a, p.b} {
		if !s.e.tablesEmpty() {
			p.t.Errorf("%v: engine still holds %d IDs (%d remote, %d QPN, %d SIDR)", s.addr,
				len(s.e.conns), len(s.e.byRemote), len(s.e.byQPN), len(s.e.sidrIn))
		}
		if _, ok := s.e.NextDeadline(); ok {
			p.t.Errorf("%v: timer still pending", s.addr)
		}
		if err := s.e.checkTimers(); err != nil {
			p.t.Errorf("%v: %v", s.addr, err)
		}
		if len(s.e.out) != 0 || len(s.e.events) != 0 {
			p.t.Errorf("%v: queues not drained", s.addr)
		}
	}
}

// checkTimers verifies the timer heap: exactly the waiting IDs are in it,
// each at the position it records, in heap order.
func (e *Engine) checkTimers() error {
	for i, c := range e.timers {
		if c.theap != i+1 || !c.waiting || e.conns[c.id] != c {
			return fmt.Errorf("timer %d: ID %#x at %d, waiting %v, known %v", i, c.id, c.theap, c.waiting, e.conns[c.id] == c)
		}
		if i > 0 && e.timers[(i-1)/2].deadline > c.deadline {
			return fmt.Errorf("timer %d: deadline before its parent's", i)
		}
	}
	for id, c := range e.conns {
		if c.waiting != (c.theap > 0) {
			return fmt.Errorf("ID %#x: waiting %v, heap position %d", id, c.waiting, c.theap)
		}
	}
	return nil
}
