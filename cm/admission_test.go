package cm

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// spoofer makes REQ MADs that claim any source address, as a host that
// forges the GRH of its UD packets to QP1 can.
type spoofer struct {
	e *Engine
	n uint32
}

func newSpoofer(t testing.TB) *spoofer {
	t.Helper()
	e, err := NewEngine(Config{Clock: monoClock{time.Now()}, Rand: rand.Uint32, LocalCAGUID: 0x0200_5eff_fe00_0bad,
		REQRate: -1})
	if err != nil {
		t.Fatal(err)
	}
	return &spoofer{e: e}
}

// req returns a REQ from src for port of devAddrB that asks for the
// longest response timeout and most retries and will never be followed
// by an RTU.
func (s *spoofer) req(t testing.TB, src netip.Addr, port uint16) []byte {
	t.Helper()
	s.n++
	pd := make([]byte, mad.CMAHeaderSize)
	mad.CMAHeader(pd).Encode(&mad.CMAHeaderFields{SrcPort: 4242, Src: src, Dst: devAddrB})
	if _, err := s.e.Connect(&ConnectParams{ServiceID: mad.ServiceID(mad.PortSpaceTCP, port),
		Path: Path{Local: src, Remote: devAddrB}, QPN: s.n%0xFFFFFF + 1, StartingPSN: 1,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: ib.MTU1024,
		CMResponseTimeout: 31, MaxCMRetries: 15, PrivateData: pd}); err != nil {
		t.Fatal(err)
	}
	o, ok := s.e.PollOutbound()
	if !ok {
		t.Fatal("the spoofer sent no REQ")
	}
	// The spoofer's own ID is never looked at again: forget it.
	clear(s.e.conns)
	clear(s.e.byRemote)
	clear(s.e.byQPN)
	s.e.timers = s.e.timers[:0]
	return o.MAD[:]
}

// inject hands m to a's engine as if it came from src. Like QP1's
// receive queue, it drops m (reporting false) while the agent has a
// queue's worth of events not yet handled: the agent's goroutine, not
// the flood, sets the pace, as it does with packets off the wire.
func inject(a *agent, src netip.Addr, m []byte) bool {
	a.mu.Lock()
	ok := len(a.eng.events) < gsiRecvBuffers
	if ok {
		_ = a.eng.Receive(Path{Local: devAddrB, Remote: src}, m)
	}
	a.mu.Unlock()
	a.poke()
	return ok
}

// spoofedAddrs returns n source addresses 10.9.x.y.
func spoofedAddrs(n int) []netip.Addr {
	as := make([]netip.Addr, n)
	for i := range as {
		as[i] = netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})
	}
	return as
}

// devPairReaching is devPair whose B also reaches the addresses extra (at
// A's MAC, where A drops what is not for it), so that B answers spoofed
// requests from them as it would on a real network.
func devPairReaching(t testing.TB, extra []netip.Addr) (*roce.Device, *roce.Device) {
	t.Helper()
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{devAddrA},
		Neighbours: map[netip.Addr]net.HardwareAddr{devAddrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	nb := map[netip.Addr]net.HardwareAddr{devAddrA: la.HardwareAddr()}
	for _, a := range extra {
		nb[a] = la.HardwareAddr()
	}
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{devAddrB}, Neighbours: nb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// flood injects rate spoofed REQs a second into a, cycling through srcs,
// until ctx ends; it returns how many it sent and how many of them the
// receive queue dropped.
func flood(ctx context.Context, t testing.TB, a *agent, srcs []netip.Addr, port uint16, rate int) (sent, dropped int) {
	sp := newSpoofer(t)
	const tick = 10 * time.Millisecond
	per := max(rate*int(tick)/int(time.Second), 1)
	tk := time.NewTicker(tick)
	defer tk.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return sent, dropped
		case <-tk.C:
		}
		// Catch up with the rate if a tick came late on a busy machine.
		due := int(time.Since(start).Seconds() * float64(rate))
		for n := 0; sent < due && n < 4*per; n++ {
			src := srcs[sent%len(srcs)]
			sent++
			if !inject(a, src, sp.req(t, src, port)) {
				dropped++
			}
		}
	}
}

// TestHalfOpenFlood: REQs from a thousand spoofed sources, at 2,000 a
// second (300 under the race detector), none of them ever completed, do not keep a real client out:
// it connects within seconds while the flood runs, the half-open table
// stays bounded and its oldest entries are the ones dropped.
func TestHalfOpenFlood(t *testing.T) {
	srcs := spoofedAddrs(1024)
	da, db := devPairReaching(t, srcs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := NewManager(db, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const port = 7210
	l, err := m.Listen(ctx, netip.AddrPortFrom(devAddrB, port), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptLoop(ctx, l)

	rate, bound := 2000, 5*time.Second
	if raceEnabled {
		// The race detector slows a handshake tenfold: a flood of 2,000 a
		// second then tests the machine, not the listener.
		rate, bound = 300, 15*time.Second
	}
	fctx, stop := context.WithTimeout(ctx, 20*time.Second) // bounded, whatever happens below
	defer stop()
	var wg sync.WaitGroup
	var sent, dropped int
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, dropped = flood(fctx, t, m.a, srcs, port, rate)
	}()
	// Let the flood fill the half-open table first (a slow machine, or
	// the race detector, may not fill it: the client then dials into
	// the flood as it is).
	if !pollUntil(5*time.Second, func() bool { return l.Stats().HalfOpenDropped > 0 }) {
		t.Logf("the flood did not fill the half-open table in 5 s: %+v", l.Stats())
	}

	start := time.Now()
	dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
	cc, err := Dial(dctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{})
	dcancel()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a real client during the flood: %v after %v (listener %+v)", err, took, l.Stats())
	}
	defer cc.Close()
	var sc *Conn
	for sc == nil {
		select {
		case c := <-accepted:
			if c == nil {
				t.Fatal("Accept failed")
			}
			if c.RemoteAddr() == cc.LocalAddr() {
				sc = c
			} else {
				t.Errorf("Accept returned %v, a flood request", c.RemoteAddr())
				c.Close()
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the real client's connection was not accepted")
		}
	}
	defer sc.Close()
	// Keep flooding a little longer: the established connection stays.
	time.Sleep(300 * time.Millisecond)
	stop()
	wg.Wait()
	st := l.Stats()
	t.Logf("a real client connected in %v during a flood of %d spoofed REQs (%d a second from %d sources, %d dropped by a full receive queue); listener %+v; engine %+v",
		took, sent, rate, len(srcs), dropped, st, m.Stats())
	if took > bound {
		t.Errorf("the real client took %v to connect", took)
	}
	if st.HalfOpen > DefaultMaxHalfOpen {
		t.Errorf("%d half-open handshakes, more than %d", st.HalfOpen, DefaultMaxHalfOpen)
	}
	select {
	case <-cc.Done():
		t.Errorf("the real connection ended: %v", cc.Err())
	case <-sc.Done():
		t.Errorf("the accepted connection ended: %v", sc.Err())
	default:
	}
}

// TestREQRateLimitPerSource: one source sending REQs far faster than the
// limit gets a burst's worth through and the rest dropped and counted; a
// real client from another address is not affected.
func TestREQRateLimitPerSource(t *testing.T) {
	src := netip.MustParseAddr("10.9.9.9")
	da, db := devPairReaching(t, []netip.Addr{src})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := NewManager(db, ManagerOptions{REQRate: 20, REQBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const port = 7211
	l, err := m.Listen(ctx, netip.AddrPortFrom(devAddrB, port), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptLoop(ctx, l)
	sp := newSpoofer(t)
	start := time.Now()
	const n = 500
	for range n {
		for !inject(m.a, src, sp.req(t, src, port)) {
			time.Sleep(time.Millisecond)
		}
	}
	// At most the burst, plus what the bucket refilled while we sent.
	limit := 10 + int(time.Since(start).Seconds()*20) + 1
	if got := m.Stats().RateLimited; got < n-uint64(limit) {
		t.Errorf("%d of %d REQs from one source rate-limited, want at least %d", got, n, n-limit)
	}
	cc, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{})
	if err != nil {
		t.Fatalf("a real client from another address: %v", err)
	}
	defer cc.Close()
	for {
		select {
		case c := <-accepted:
			if c == nil {
				t.Fatal("Accept failed")
			}
			c.Close()
			if c.RemoteAddr() == cc.LocalAddr() {
				t.Logf("engine %+v, listener %+v", m.Stats(), l.Stats())
				return
			}
		case <-ctx.Done():
			t.Fatal("the real client was not accepted")
		}
	}
}

// TestREQRateLimitEngine: the token bucket with the engine's clock; the
// table of sources stays within REQSources.
func TestREQRateLimitEngine(t *testing.T) {
	p := newPair(t)
	var err error
	p.b.e, err = NewEngine(Config{Clock: p.clock, Rand: rand.New(rand.NewPCG(3, 4)).Uint32, LocalCAGUID: 2,
		REQRate: 1, REQBurst: 2, REQSources: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.b.e.Listen(testSID); err != nil {
		t.Fatal(err)
	}
	connect := func() {
		t.Helper()
		cp := p.connectParams(testSID)
		cp.QPN = uint32(len(p.a.e.conns) + 1)
		if _, err := p.a.e.Connect(cp); err != nil {
			t.Fatal(err)
		}
		p.pump()
	}
	requests := func() int {
		n := 0
		for _, ev := range p.b.events {
			if ev.Type == EventRequest {
				n++
			}
		}
		return n
	}
	for range 3 {
		connect()
	}
	if r, l := requests(), p.b.e.Stats().RateLimited; r != 2 || l != 1 {
		t.Fatalf("%d requests, %d rate-limited; want 2, 1", r, l)
	}
	p.clock.t += time.Second
	connect()
	if r, l := requests(), p.b.e.Stats().RateLimited; r != 3 || l != 1 {
		t.Fatalf("after a second: %d requests, %d rate-limited; want 3, 1", r, l)
	}
	for i := range 5 {
		p.b.e.reqLimit.allow(netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), p.clock.t)
	}
	if n := len(p.b.e.reqLimit.buckets); n != 2 {
		t.Errorf("%d sources remembered, want 2", n)
	}
}
