package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// churnPLT is the packet life time the churn test dials with: a timewait of
// 32 ms instead of rdma_cm's 2 s keeps the number of IDs in timewait, and
// so the size of the engine's tables, small and steady, and the heap
// comparison then measures leaks instead of map growth.
const churnPLT = 12

// heapSlack is the live-heap growth the leak tests allow whatever the
// number of connections (see TestConnectionChurn).
const heapSlack = 256 << 10

// churnEnd says how a churn cycle ends a connection.
type churnEnd int

const (
	clientDisconnects churnEnd = iota // Disconnect (DREQ, wait for DREP), then Close
	serverDisconnects
	clientCloses // Close alone: DREQ without waiting
	serverCloses
)

func (e churnEnd) String() string {
	return [...]string{"client Disconnect", "server Disconnect", "client Close", "server Close"}[e]
}

// churner runs connect/disconnect cycles through the public API against one
// listener.
type churner struct {
	ctx      context.Context
	da, db   *roce.Device
	raddr    netip.AddrPort
	dopts    DialOptions
	accepted chan *Conn
	qpns     []uint32 // every QPN a cycle used, both sides
}

// startChurn listens on db and accepts until ctx ends; the returned stop
// closes the listener and waits for the accepting goroutine.
func startChurn(t testing.TB, ctx context.Context, da, db *roce.Device, dopts DialOptions) (*churner, func()) {
	t.Helper()
	raddr := netip.AddrPortFrom(devAddrB, 7190)
	l, err := Listen(ctx, db, raddr, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := &churner{ctx: ctx, da: da, db: db, raddr: raddr, dopts: dopts, accepted: make(chan *Conn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			sc, err := l.Accept(ctx)
			if err != nil {
				return
			}
			select {
			case c.accepted <- sc:
			case <-ctx.Done():
				sc.Close()
				return
			}
		}
	}()
	return c, func() {
		l.Close()
		<-done
	}
}

// cycle makes one connection and ends it the way how says.
func (c *churner) cycle(how churnEnd) error {
	cc, err := Dial(c.ctx, c.da, c.raddr, c.dopts)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	var sc *Conn
	select {
	case sc = <-c.accepted:
	case <-c.ctx.Done():
		cc.Close()
		return fmt.Errorf("accept: %w", c.ctx.Err())
	}
	if c.qpns != nil {
		c.qpns = append(c.qpns, cc.QP().QPN(), sc.QP().QPN())
	}
	first, second := cc, sc
	if how == serverDisconnects || how == serverCloses {
		first, second = sc, cc
	}
	if how == clientDisconnects || how == serverDisconnects {
		if err := first.Disconnect(c.ctx); err != nil {
			cc.Close()
			sc.Close()
			return fmt.Errorf("%v: %w", how, err)
		}
	} else if err := first.Close(); err != nil {
		second.Close()
		return fmt.Errorf("%v: %w", how, err)
	}
	select {
	case <-second.Done():
	case <-c.ctx.Done():
		cc.Close()
		sc.Close()
		return fmt.Errorf("%v: the other side never saw the DREQ: %w", how, c.ctx.Err())
	}
	if err := second.Close(); err != nil {
		first.Close()
		return fmt.Errorf("%v: closing the other side: %w", how, err)
	}
	if how == clientDisconnects || how == serverDisconnects {
		if err := first.Close(); err != nil {
			return fmt.Errorf("%v: %w", how, err)
		}
	}
	return nil
}

// agentIDs returns the number of communication IDs the CM of d holds (0
// when it runs no CM).
func agentIDs(d *roce.Device) int {
	registry.Lock()
	a := registry.m[d]
	registry.Unlock()
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n, _ := a.eng.Len()
	return n
}

// agentRunning reports whether d has a CM agent.
func agentRunning(d *roce.Device) bool {
	registry.Lock()
	defer registry.Unlock()
	// A dying agent has left m but still tears its verbs objects down.
	return registry.m[d] != nil || registry.dying[d] != nil
}

// pollUntil calls cond every millisecond until it holds or timeout passes.
func pollUntil(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// quiesce waits until neither device's CM holds an ID (every timewait has
// ended).
func quiesce(t testing.TB, devs ...*roce.Device) {
	t.Helper()
	for _, d := range devs {
		if !pollUntil(10*time.Second, func() bool { return agentIDs(d) == 0 }) {
			t.Fatalf("%s: %d CM IDs left after timewait", d.Info().Name, agentIDs(d))
		}
	}
}

// settleGoroutines waits until at most want goroutines run, and fails with
// every stack if they do not.
// assertReleased checks that, with every listener closed, both CM agents
// stop and the goroutines and verbs objects are back to where they started.
func assertReleased(t testing.TB, g0 int, when string, devs [2]*roce.Device, res0 [2]roce.Resources) {
	t.Helper()
	for _, d := range devs {
		if !pollUntil(agentLinger+5*time.Second, func() bool { return !agentRunning(d) }) {
			t.Fatalf("%s: CM agent still running (%d IDs)", d.Info().Name, agentIDs(d))
		}
	}
	settleGoroutines(t, g0, when)
	if ra, rb := devs[0].Resources(), devs[1].Resources(); ra != res0[0] || rb != res0[1] {
		t.Errorf("verbs objects left: A %+v B %+v, want A %+v B %+v", ra, rb, res0[0], res0[1])
	}
}

func settleGoroutines(t testing.TB, want int, what string) int {
	t.Helper()
	if pollUntil(5*time.Second, func() bool { return runtime.NumGoroutine() <= want }) {
		return runtime.NumGoroutine()
	}
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	t.Fatalf("%s: %d goroutines, want at most %d:\n%s", what, runtime.NumGoroutine(), want, buf)
	return 0
}

// liveHeap collects garbage and returns the live heap.
func liveHeap() runtime.MemStats {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC() // a second cycle frees what finalizers of the first released
	runtime.ReadMemStats(&m)
	return m
}

// TestConnectionChurn sets up and tears down a thousand connections through
// Dial, Listen/Accept, Disconnect and Close over two devices, alternating
// which side ends them and how, and checks that nothing stays behind:
// goroutines, heap, verbs objects and QPNs of the devices, CM IDs.
func TestConnectionChurn(t *testing.T) {
	const cycles, warm = 1000, 100
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	g0 := settleGoroutines(t, runtime.NumGoroutine(), "devices open")
	resA0, resB0 := da.Resources(), db.Resources()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ch, stop := startChurn(t, ctx, da, db, DialOptions{PacketLifeTime: churnPLT})
	run := func(from, to int) time.Duration {
		start := time.Now()
		for i := from; i < to; i++ {
			if err := ch.cycle(churnEnd(i % 4)); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
		return time.Since(start)
	}

	tookWarm := run(0, warm)
	quiesce(t, da, db)
	g1 := settleGoroutines(t, g0+2, "after warm-up") // + the accepting goroutine and the listener's CM
	resA1, resB1 := da.Resources(), db.Resources()
	ch.qpns = make([]uint32, 0, 2*(cycles-warm))
	m1 := liveHeap()

	took := run(warm, cycles)
	n := cycles - warm
	quiesce(t, da, db)
	g2 := settleGoroutines(t, g1, "after the churn")
	qpns := ch.qpns
	ch.qpns = nil
	m2 := liveHeap()
	resA2, resB2 := da.Resources(), db.Resources()

	t.Logf("%d connections in %v: %v per connection (Dial, Accept, disconnect, Close on both sides); after warm-up %v",
		cycles, (tookWarm + took).Round(time.Millisecond), (tookWarm+took)/cycles, took/time.Duration(n))
	dHeap := int64(m2.HeapAlloc) - int64(m1.HeapAlloc)
	dObj := int64(m2.HeapObjects) - int64(m1.HeapObjects)
	t.Logf("live heap %d → %d bytes (%+d, %+.1f B/conn), %d → %d objects (%+d); HeapInuse %d → %d; goroutines %d/%d/%d",
		m1.HeapAlloc, m2.HeapAlloc, dHeap, float64(dHeap)/float64(n), m1.HeapObjects, m2.HeapObjects, dObj,
		m1.HeapInuse, m2.HeapInuse, g0, g1, g2)
	t.Logf("resources A %+v, B %+v", resA2, resB2)

	// A leaking connection leaves at least a Conn, an idState with two
	// channels, a QP and its queues behind: far more than 128 bytes and
	// one object. The bounds allow for growth that does not depend on the
	// number of connections: tables reaching their size (20-70 KB and
	// about 100 objects, the same after 12000 connections), and the last
	// destroyed QP, which the transport engine may keep reachable until
	// it makes the next one (with its 1024-entry CQs about 140 KB).
	if maxHeap := heapSlack + int64(n)*128; dHeap > maxHeap {
		t.Errorf("live heap grew by %d bytes over %d connections (bound %d)", dHeap, n, maxHeap)
	}
	if maxObj := int64(n) / 4; dObj > maxObj {
		t.Errorf("live objects grew by %d over %d connections (bound %d)", dObj, n, maxObj)
	}
	if resA2 != resA1 || resB2 != resB1 {
		t.Errorf("verbs objects after warm-up A %+v B %+v, after the churn A %+v B %+v", resA1, resB1, resA2, resB2)
	}
	// QPNs are handed out in order, as rxe does: each connection has new
	// ones, and Close must have freed them in the device's table.
	if len(qpns) != 2*n {
		t.Fatalf("%d QPNs recorded for %d connections", len(qpns), n)
	}
	var live []uint32
	for i, q := range qpns {
		if []*roce.Device{da, db}[i%2].HasQP(q) {
			live = append(live, q)
		}
	}
	if len(live) > 0 {
		t.Errorf("%d of %d QPNs of closed connections still in the devices' tables: %#x...", len(live), len(qpns), live[:min(len(live), 8)])
	}
	t.Logf("QPNs used: A %#x..%#x, B %#x..%#x", qpns[0], qpns[len(qpns)-2], qpns[1], qpns[len(qpns)-1])

	// With the listener closed the CMs give QP1 back and stop: every
	// goroutine and verbs object of the test is gone.
	stop()
	assertReleased(t, g0, "after the listener closed", [2]*roce.Device{da, db}, [2]roce.Resources{resA0, resB0})
}

// BenchmarkDialAccept measures one connection through the public API:
// Dial, Accept, Disconnect from the client (DREQ/DREP) and Close on both
// sides, over two in-memory devices. With rdma_cm's default packet life
// time the IDs stay 2 s in timewait, so the engines hold a few thousand of
// them at this rate; the short timewait of the churn test keeps a few dozen.
func BenchmarkDialAccept(b *testing.B) {
	for _, bc := range []struct {
		name string
		plt  uint8
	}{{"timewait=2s", 0}, {"timewait=32ms", churnPLT}} {
		b.Run(bc.name, func(b *testing.B) {
			da, db := devPair(b, faultnet.Config{}, faultnet.Config{}, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ch, stop := startChurn(b, ctx, da, db, DialOptions{PacketLifeTime: bc.plt})
			defer stop()
			b.ReportAllocs()
			for b.Loop() {
				if err := ch.cycle(clientDisconnects); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFailedConnectionsLeakNothing runs the ways a connection fails or
// does not become one: no listener (REJ), a listener whose Prepare fails
// (REJ after the passive QP was made), a dial cancelled while the passive
// side prepares, and SIDR exchanges for UD. Each leaves nothing behind.
func TestFailedConnectionsLeakNothing(t *testing.T) {
	const cycles = 1000
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	g0 := settleGoroutines(t, runtime.NumGoroutine(), "devices open")
	resA0, resB0 := da.Resources(), db.Resources()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	boom := errors.New("boom")
	const (
		portNone = 7191 + iota
		portFail
		portGate
		portUD
	)
	lFail, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, portFail), ListenOptions{QP: QPOptions{Prepare: func(*Conn) error { return boom }}})
	if err != nil {
		t.Fatal(err)
	}
	entered, gate := make(chan struct{}), make(chan struct{})
	lGate, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, portGate), ListenOptions{QP: QPOptions{Prepare: func(*Conn) error {
		entered <- struct{}{}
		<-gate
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	lUD, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, portUD), ListenOptions{PortSpace: mad.PortSpaceUDP})
	if err != nil {
		t.Fatal(err)
	}
	var resListen roce.Resources // the listeners' CM: QP1, its PD and CQs, receive buffers, an AH to A
	udConns := make(chan *Conn)
	var wg sync.WaitGroup
	for _, l := range []*Listener{lFail, lGate, lUD} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept(ctx)
				if err != nil {
					return
				}
				if l != lUD {
					t.Errorf("listener %v accepted a connection", l.Addr())
					c.Close()
					continue
				}
				udConns <- c
			}
		}()
	}
	dial := func(ctx context.Context, port uint16, ps mad.PortSpace) (*Conn, error) {
		return Dial(ctx, da, netip.AddrPortFrom(devAddrB, port), DialOptions{PortSpace: ps, PacketLifeTime: churnPLT})
	}
	var m1 runtime.MemStats
	var g1 int
	var resA1, resB1 roce.Resources
	start := time.Now()
	for i := range cycles {
		if i == cycles/4 {
			quiesce(t, da, db)
			g1 = settleGoroutines(t, g0+4, "after warm-up") // 3 accepting goroutines, the listeners' CM
			resA1, resB1 = da.Resources(), db.Resources()
			m1 = liveHeap()
		}
		switch i % 4 {
		case 0:
			if _, err := dial(ctx, portNone, 0); !errors.Is(err, mad.RejInvalidServiceID) {
				t.Fatalf("cycle %d: dial without a listener: %v", i, err)
			}
			if i == 0 {
				resListen = db.Resources()
			}
		case 1:
			if _, err := dial(ctx, portFail, 0); !errors.Is(err, mad.RejConsumerDefined) {
				t.Fatalf("cycle %d: dial to a failing Prepare: %v", i, err)
			}
		case 2:
			dctx, dcancel := context.WithCancel(ctx)
			go func() {
				<-entered
				dcancel()
			}()
			_, err := dial(dctx, portGate, 0)
			dcancel()
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cycle %d: cancelled dial: %v", i, err)
			}
			gate <- struct{}{}
			// The passive side finds the request gone once Prepare
			// returns and frees its QP: wait for that before going on.
			if !pollUntil(5*time.Second, func() bool { return db.Resources() == resListen }) {
				registry.Lock()
				a := registry.m[db]
				registry.Unlock()
				a.mu.Lock()
				for _, c := range a.eng.conns {
					t.Logf("B ID %#x %v waiting %v retries %d", c.id, c.state, c.waiting, c.retries)
				}
				t.Logf("B stats %+v", a.eng.Stats())
				a.mu.Unlock()
				t.Fatalf("cycle %d: passive side of a cancelled dial holds %+v, want %+v", i, db.Resources(), resListen)
			}
		case 3:
			cc, err := dial(ctx, portUD, mad.PortSpaceUDP)
			if err != nil {
				t.Fatalf("cycle %d: SIDR: %v", i, err)
			}
			sc := <-udConns
			if err := errors.Join(cc.Close(), sc.Close()); err != nil {
				t.Fatalf("cycle %d: closing UD: %v", i, err)
			}
		}
	}
	took := time.Since(start)
	quiesce(t, da, db)
	g2 := settleGoroutines(t, g1, "after the failures")
	m2 := liveHeap()
	n := cycles - cycles/4
	dHeap := int64(m2.HeapAlloc) - int64(m1.HeapAlloc)
	dObj := int64(m2.HeapObjects) - int64(m1.HeapObjects)
	t.Logf("%d attempts in %v (%v each); live heap %+d bytes, %+d objects over the last %d; goroutines %d/%d/%d",
		cycles, took.Round(time.Millisecond), took/cycles, dHeap, dObj, n, g0, g1, g2)
	if maxHeap := heapSlack + int64(n)*128; dHeap > maxHeap {
		t.Errorf("live heap grew by %d bytes over %d attempts (bound %d)", dHeap, n, maxHeap)
	}
	if maxObj := int64(n) / 4; dObj > maxObj {
		t.Errorf("live objects grew by %d over %d attempts (bound %d)", dObj, n, maxObj)
	}
	if ra, rb := da.Resources(), db.Resources(); ra != resA1 || rb != resB1 {
		t.Errorf("verbs objects after warm-up A %+v B %+v, at the end A %+v B %+v", resA1, resB1, ra, rb)
	}

	cancel()
	wg.Wait()
	for _, l := range []*Listener{lFail, lGate, lUD} {
		l.Close()
	}
	assertReleased(t, g0, "after the listeners closed", [2]*roce.Device{da, db}, [2]roce.Resources{resA0, resB0})
}
