package cm

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// testClock is a clock a test moves by hand, safe for the agent goroutine.
type testClock struct{ t atomic.Int64 }

func (c *testClock) Now() time.Duration { return time.Duration(c.t.Load()) }

// hostileREQ sends from da, through its CM, a REQ for port of devAddrB
// that announces the largest response timeout and retry count, and never
// answers the REP with an RTU (no one takes the ID's events). The
// returned function withdraws it.
func hostileREQ(t *testing.T, da *roce.Device, port uint16) func() {
	t.Helper()
	a, err := acquire(da)
	if err != nil {
		t.Fatal(err)
	}
	pd := make([]byte, mad.CMAHeaderSize)
	mad.CMAHeader(pd).Encode(&mad.CMAHeaderFields{SrcPort: 4242, Src: devAddrA, Dst: devAddrB})
	var id uint32
	if err := a.do(func(e *Engine) error {
		id, err = e.Connect(&ConnectParams{ServiceID: mad.ServiceID(mad.PortSpaceTCP, port),
			Path: Path{Local: devAddrA, Remote: devAddrB}, QPN: 0xABCDE, StartingPSN: 1,
			ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: ib.MTU1024,
			CMResponseTimeout: 31, MaxCMRetries: 15, PrivateData: pd})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = a.do(func(e *Engine) error { _ = e.Destroy(id); return nil })
		a.release()
	}
}

// repSent returns the IDs of a's engine waiting for an RTU.
func repSent(a *agent) []*conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	var cs []*conn
	for _, c := range a.eng.conns {
		if c.state == StateREPSent {
			cs = append(cs, c)
		}
	}
	return cs
}

// acceptLoop accepts on l from one goroutine, as the package example does.
func acceptLoop(ctx context.Context, l *Listener) <-chan *Conn {
	ch := make(chan *Conn, 4)
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				close(ch)
				return
			}
			ch <- c
		}
	}()
	return ch
}

// TestHalfOpenDoesNotBlockAccept: a REQ whose sender never sends the RTU,
// announcing a response timeout of 2.3 h and 15 retries, must not keep a
// listener served by one Accept loop from accepting a real client.
func TestHalfOpenDoesNotBlockAccept(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const port = 7200
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, port), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptLoop(ctx, l)

	withdraw := hostileREQ(t, da, port)
	defer withdraw()
	registry.Lock()
	b := registry.m[db]
	registry.Unlock()
	// The Accept loop has taken the hostile request once B sent its REP.
	if !pollUntil(5*time.Second, func() bool { return len(repSent(b)) == 1 }) {
		t.Fatal("the hostile REQ was never answered with a REP")
	}

	dialed := make(chan error, 1)
	var cc *Conn
	go func() {
		var err error
		cc, err = Dial(ctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{})
		dialed <- err
	}()
	select {
	case sc := <-accepted:
		if sc == nil {
			t.Fatal("Accept failed")
		}
		defer sc.Close()
		if err := <-dialed; err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if sc.RemoteAddr() != cc.LocalAddr() {
			t.Errorf("accepted %v, dialed from %v", sc.RemoteAddr(), cc.LocalAddr())
		}
	case <-time.After(time.Second):
		t.Fatal("a real client was not accepted within a second while a half-open handshake was pending")
	}
	if n := len(repSent(b)); n != 1 {
		t.Errorf("%d half-open handshakes, want the hostile one", n)
	}
}

// TestHalfOpenTornDown: the hostile handshake holds no backlog slot, its
// REP retries run at the interval the listener's HalfOpenTimeout allows
// and end within it; its QP is then freed. The CM's clock is moved by
// hand.
func TestHalfOpenTornDown(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	clk := &testClock{}
	clk.t.Store(int64(time.Hour))
	m, err := NewManager(db, ManagerOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Run the timewaits of the closed connections so that Close finds
		// the CM idle.
		pollUntil(5*time.Second, func() bool {
			clk.t.Add(int64(time.Minute))
			m.a.poke()
			m.a.mu.Lock()
			defer m.a.mu.Unlock()
			n, _ := m.a.eng.Len()
			return n == 0
		})
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}()
	const port = 7201
	l, err := m.Listen(ctx, netip.AddrPortFrom(devAddrB, port), ListenOptions{Backlog: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := acceptLoop(ctx, l)
	res0 := db.Resources()

	withdraw := hostileREQ(t, da, port)
	defer withdraw()
	b := m.a
	if !pollUntil(5*time.Second, func() bool { return len(repSent(b)) == 1 }) {
		t.Fatal("the hostile REQ was never answered with a REP")
	}
	hc := repSent(b)[0]
	b.mu.Lock()
	interval, retries, clamped := hc.interval, hc.retries, b.eng.Stats().Clamped
	b.mu.Unlock()
	if interval != DefaultHalfOpenTimeout/4 || retries != 3 || clamped == 0 {
		t.Errorf("REP retry interval %v, %d retries, %d clamped; want %v, 3, > 0", interval, retries, clamped,
			DefaultHalfOpenTimeout/4)
	}
	if s := l.Stats(); s.HalfOpen != 1 {
		t.Errorf("listener stats %+v, want one half-open", s)
	}
	// The backlog of one is free: a real client gets in while the
	// hostile handshake is half-open.
	first, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{})
	if err != nil {
		t.Fatalf("a real client beside a half-open handshake: %v", err)
	}
	select {
	case sc := <-accepted:
		if sc == nil {
			t.Fatal("Accept failed")
		}
		sc.Close()
	case <-ctx.Done():
		t.Fatal("not accepted")
	}
	first.Close()

	start := clk.Now()
	for i := 0; len(repSent(b)) > 0; i++ {
		if i > 20 {
			t.Fatal("the half-open handshake is still there after its retries")
		}
		b.mu.Lock()
		d, _ := b.eng.NextDeadline()
		b.mu.Unlock()
		clk.t.Store(int64(max(d, clk.Now())))
		b.poke()
		pollUntil(time.Second, func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			nd, ok := b.eng.NextDeadline()
			return !ok || nd > d
		})
	}
	if took := clk.Now() - start; took > DefaultHalfOpenTimeout {
		t.Errorf("the half-open handshake lasted %v", took)
	}
	if !pollUntil(5*time.Second, func() bool { return l.Stats().HalfOpenTimedOut == 1 }) {
		t.Errorf("listener stats %+v, want one half-open timed out", l.Stats())
	}
	// Its QP is freed and the slot is back: the real client gets in.
	// (The CM keeps the address handle of A it made for the REP.)
	if !pollUntil(5*time.Second, func() bool { r := db.Resources(); r.AH = res0.AH; return r == res0 }) {
		t.Errorf("resources %+v, want %+v", db.Resources(), res0)
	}
	cc, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	select {
	case sc := <-accepted:
		if sc == nil {
			t.Fatal("Accept failed")
		}
		sc.Close()
	case <-ctx.Done():
		t.Fatal("not accepted")
	}
}

// TestListenerCloseAbandonsHalfOpen: closing a listener rejects the
// handshakes Accept has in progress and frees their QPs.
func TestListenerCloseAbandonsHalfOpen(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := NewManager(db, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	const port = 7202
	l, err := m.Listen(ctx, netip.AddrPortFrom(devAddrB, port), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	accepted := acceptLoop(ctx, l)
	res0 := db.Resources()
	withdraw := hostileREQ(t, da, port)
	defer withdraw()
	if !pollUntil(5*time.Second, func() bool { return len(repSent(m.a)) == 1 }) {
		t.Fatal("the hostile REQ was never answered with a REP")
	}
	l.Close()
	if _, ok := <-accepted; ok {
		t.Error("Accept returned a connection")
	}
	// The abandoned handshake frees its QP and half-open entry before its
	// goroutine returns the backlog slot, so wait for all three.
	pending := func() int {
		m.a.mu.Lock()
		defer m.a.mu.Unlock()
		return l.pending
	}
	if !pollUntil(5*time.Second, func() bool {
		r := db.Resources()
		r.AH = res0.AH
		return r == res0 && len(repSent(m.a)) == 0 && pending() == 0
	}) {
		t.Errorf("after Close: resources %+v (want %+v), %d half-open, %d requests still held", db.Resources(), res0, len(repSent(m.a)), pending())
	}
}
