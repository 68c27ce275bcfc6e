package roce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/memlink"
)

// memPairSpin opens a memlink pair with the given CQSpin (negative: no spin,
// every Wait that finds the CQ empty parks).
func memPairSpin(t testing.TB, spin time.Duration) (*Device, *Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	da, err := OpenLink(la, Options{CQSpin: spin, Addrs: []netip.Addr{addrA},
		Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{CQSpin: spin, Addrs: []netip.Addr{addrB},
		Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// Many goroutines wait on one receive CQ at once; together they take every
// completion exactly once, and none is left waiting while completions sit in
// the CQ.
func TestCQManyWaitersOneCQ(t *testing.T) {
	for _, spin := range []time.Duration{-1, 0} {
		t.Run("spin="+spin.String(), func(t *testing.T) {
			da, db := memPairSpin(t, spin)
			a := newEndpoint(t, da, RC, 1<<16)
			b := newEndpoint(t, db, RC, 1<<16)
			connect(t, a, b, addrA, addrB, ConnectAttr{})
			const msgs, waiters = 400, 8
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var got atomic.Int64
			seen := make([]atomic.Int32, msgs)
			var wg sync.WaitGroup
			errs := make(chan error, waiters)
			for g := 0; g < waiters; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var wc [4]WorkCompletion
					for got.Load() < msgs {
						n := b.rcq.Poll(wc[:])
						for _, c := range wc[:n] {
							if c.Status != WCSuccess {
								errs <- errors.New(c.Status.String())
								return
							}
							seen[c.WRID].Add(1)
						}
						if got.Add(int64(n)) >= msgs {
							return
						}
						if n > 0 {
							continue
						}
						// Short deadlines exercise the timeout path
						// racing with wake-ups.
						err := b.rcq.WaitDeadline(time.Now().Add(2 * time.Millisecond))
						if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
							errs <- err
							return
						}
						if ctx.Err() != nil {
							errs <- ctx.Err()
							return
						}
					}
				}()
			}
			for i := 0; i < msgs; i++ {
				for int64(i)-got.Load() >= 200 { // stay within the work queues
					if ctx.Err() != nil {
						t.Fatalf("%d of %d completions taken", got.Load(), msgs)
					}
					time.Sleep(time.Millisecond)
				}
				if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i%16*64, 64)}}); err != nil {
					t.Fatal(err)
				}
				for {
					err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(0, 32)}})
					if err == nil {
						break
					}
					if !errors.Is(err, qp.ErrQueueFull) || ctx.Err() != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Millisecond) // unsignalled sends leave the queue with their ACK
				}
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case err := <-errs:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatalf("%d of %d completions taken", got.Load(), msgs)
			}
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for i := range seen {
				if n := seen[i].Load(); n != 1 {
					t.Fatalf("completion %d taken %d times", i, n)
				}
			}
		})
	}
}

// One goroutine per CQ of one device, each CQ serving its own QP: every
// goroutine gets exactly its own QP's completions.
func TestCQWaitersManyCQs(t *testing.T) {
	da, db := memPairSpin(t, 0)
	const conns, msgs = 8, 100
	as := make([]*endpoint, conns)
	bs := make([]*endpoint, conns)
	for i := range as {
		as[i] = newEndpoint(t, da, RC, 4096)
		bs[i] = newEndpoint(t, db, RC, 4096)
		connect(t, as[i], bs[i], addrA, addrB, ConnectAttr{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns)
	for i := range as {
		a, b := as[i], bs[i]
		for j := 0; j < msgs; j++ {
			if err := b.qp.PostRecv(&RecvWR{ID: uint64(j), SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
		}
		wg.Add(2)
		go func() { // receiver
			defer wg.Done()
			var wc [8]WorkCompletion
			for got := 0; got < msgs; {
				n := b.rcq.Poll(wc[:])
				for _, c := range wc[:n] {
					if c.Status != WCSuccess || c.QPN != b.qp.QPN() || c.WRID != uint64(got) {
						errs <- errors.New("receiver got a completion not its own or out of order")
						return
					}
					got++
				}
				if n == 0 {
					if err := b.rcq.Wait(ctx); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
		go func() { // sender: one message at a time, waiting for each
			defer wg.Done()
			var wc [1]WorkCompletion
			for j := 0; j < msgs; j++ {
				if err := a.qp.PostSend(&SendWR{ID: uint64(j), Opcode: WRSend, Flags: SendSignaled,
					SGL: []SGE{a.mr.SGE(0, 16)}}); err != nil {
					errs <- err
					return
				}
				for a.scq.Poll(wc[:]) == 0 {
					if err := a.scq.Wait(ctx); err != nil {
						errs <- err
						return
					}
				}
				if wc[0].QPN != a.qp.QPN() || wc[0].WRID != uint64(j) || wc[0].Status != WCSuccess {
					errs <- errors.New("sender got a completion not its own")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// Wait ends with the context's error, WaitDeadline with
// os.ErrDeadlineExceeded, and both with ErrClosed when the CQ or the device
// closes under them.
func TestCQWaitEnds(t *testing.T) {
	da, _ := memPairSpin(t, 0)
	cq, err := da.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want the context's error", err)
	}
	err = cq.WaitDeadline(time.Now().Add(10 * time.Millisecond))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitDeadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("WaitDeadline: %v is not a net.Error timeout", err)
	}
	if err := cq.WaitDeadline(time.Now().Add(-time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitDeadline in the past: %v", err)
	}

	// Closing the CQ releases its waiters.
	const n = 4
	res := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { res <- cq.Wait(context.Background()) }()
	}
	for cq.waiters.n.Load() < n-1 { // one may still be spinning
		time.Sleep(time.Millisecond)
	}
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if err := <-res; !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait on a closed CQ: %v", err)
		}
	}

	// Closing the device releases waiters on its other CQs.
	cq2, err := da.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	go func() { res <- cq2.WaitDeadline(time.Now().Add(time.Minute)) }()
	for cq2.waiters.n.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	da.Close()
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait on a closed device: %v", err)
	}
}

// A Wait that parks (no spinning) allocates nothing, with a context or a
// deadline, once the waiter entries have warmed up.
func TestAllocsCQWaitParks(t *testing.T) {
	da, db := memPairSpin(t, -1)
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rwr := RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 64)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)}}
	var wc [1]WorkCompletion
	parks := 0
	round := func(deadline bool) {
		if err := b.qp.PostRecv(&rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:]) == 0 {
				parks++
				var err error
				if deadline {
					err = cq.WaitDeadline(time.Now().Add(10 * time.Second))
				} else {
					err = cq.Wait(ctx)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for _, dl := range []bool{false, true} {
		for i := 0; i < 50; i++ {
			round(dl)
		}
		parks = 0
		allocs := testing.AllocsPerRun(200, func() { round(dl) })
		t.Logf("deadline=%v: %.2f allocations per round, %d waits", dl, allocs, parks)
		if allocs > 0.5 {
			t.Fatalf("deadline=%v: %.2f allocations per round trip with parking waits", dl, allocs)
		}
	}
}

// One completion wakes one parked waiter, not all of them.
func TestCQWakesOnePerCompletion(t *testing.T) {
	da, db := memPairSpin(t, -1)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const waiters = 8
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var returned atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.rcq.Wait(ctx) == nil {
				returned.Add(1) // returns without polling: the completion stays
			}
		}()
	}
	for b.rcq.waiters.n.Load() < waiters {
		time.Sleep(time.Millisecond)
	}
	for i := 1; i <= 2; i++ {
		if err := b.qp.PostRecv(&RecvWR{SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for returned.Load() < int32(i) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // room for a stampede to show
		if n := returned.Load(); n != int32(i) {
			t.Fatalf("%d completions woke %d waiters", i, n)
		}
		if n := b.rcq.waiters.n.Load(); n != int32(waiters-i) {
			t.Fatalf("%d waiters parked after %d completions", n, i)
		}
	}
	cancel()
	wg.Wait()
}

// resetCtx is a context whose first Done channel is already closed while
// Err stays nil, as a reusable deadline's is after it passed and was reset
// to later (rsocket's, net.Pipe's).
type resetCtx struct {
	calls  atomic.Int32
	closed chan struct{}
	open   chan struct{}
}

func (c *resetCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *resetCtx) Value(any) any               { return nil }
func (c *resetCtx) Err() error                  { return nil }
func (c *resetCtx) Done() <-chan struct{} {
	if c.calls.Add(1) == 1 {
		return c.closed
	}
	return c.open
}

// A Done channel that closes while Err stays nil ends a park, not the
// Wait: the waiter is queued once again (not twice, which corrupted the
// queue and left a waker blocked on a full token channel), and a
// completion still wakes it.
func TestCQWaitResetContext(t *testing.T) {
	da, _ := memPairSpin(t, -1)
	cq, err := da.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ctx := &resetCtx{closed: make(chan struct{}), open: make(chan struct{})}
	close(ctx.closed)
	res := make(chan error, 1)
	go func() { res <- cq.Wait(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for ctx.calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Wait looked at Done %d times", ctx.calls.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if n := cq.waiters.n.Load(); n != 1 {
		t.Fatalf("%d entries queued for one waiter", n)
	}
	da.mu.Lock()
	cq.cq.Notify()
	da.mu.Unlock()
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a completion did not end the Wait")
	}
	if n := cq.waiters.n.Load(); n != 0 {
		t.Fatalf("%d entries left queued", n)
	}
}
