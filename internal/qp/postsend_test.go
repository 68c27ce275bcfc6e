package qp_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

const rigIOVA = 0x10000

// postRig is connected RC QPs between two engines, whose posters run
// beside a goroutine that drives the engines under mu, as a device's
// lock: PostSendConcurrent without it, PostSend with it.
type postRig struct {
	n     *qptest.Net
	mu    sync.Mutex
	a     []*qptest.Endpoint
	rkeys []uint32
	depth int
	viaSQ atomic.Int64 // posts PostSendConcurrent took
	// posters running, and those of them waiting for mu
	active, waiting atomic.Int32
	stop            chan struct{}
	engine          sync.WaitGroup
}

func newPostRig(t *testing.T, nqp, depth int) *postRig {
	t.Helper()
	n, err := qptest.NewNet(qptest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &postRig{n: n, depth: depth, stop: make(chan struct{})}
	for i := 0; i < nqp; i++ {
		a, err := qptest.NewEndpoint(n.A.E, qp.RC, depth)
		if err != nil {
			t.Fatal(err)
		}
		b, err := qptest.NewEndpoint(n.B.E, qp.RC, depth)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Connect(a.QP, b.QP, qptest.DefaultRC); err != nil {
			t.Fatal(err)
		}
		mr, err := b.PD.RegMR(make([]byte, 4096), rigIOVA, qptest.DefaultRC.Access)
		if err != nil {
			t.Fatal(err)
		}
		r.a = append(r.a, a)
		r.rkeys = append(r.rkeys, mr.RKey())
	}
	return r
}

// start runs the engines whenever one has a shard ready, as a device
// does: a post whose shard bit went missing is never sent, and its
// poster's deadline fails the test. The pipes deliver in the step that
// sends, so nothing is in flight between steps.
func (r *postRig) start() {
	r.engine.Add(1)
	go func() {
		defer r.engine.Done()
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			if r.n.A.E.ReadyShards()|r.n.B.E.ReadyShards() == 0 {
				runtime.Gosched()
				continue
			}
			r.mu.Lock()
			r.n.Step()
			r.mu.Unlock()
		}
	}()
}

func (r *postRig) halt() {
	close(r.stop)
	r.engine.Wait()
}

// awaitPublished, called under mu, lets the posters publish n posts
// that the stopped engine has not absorbed, or as many as they can
// before each waits for mu: the state change that follows must take
// them.
func (r *postRig) awaitPublished(n int) {
	base := r.viaSQ.Load()
	for deadline := time.Now().Add(10 * time.Second); r.viaSQ.Load() < base+int64(n) && time.Now().Before(deadline); {
		if r.waiting.Load() == r.active.Load() {
			return
		}
		runtime.Gosched()
	}
}

func (r *postRig) wr(i int) qp.SendWR {
	return qp.SendWR{Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled | qp.SendInline,
		Inline: []byte("12345678"), RemoteAddr: rigIOVA, RKey: r.rkeys[i]}
}

// postResult is what one poster saw.
type postResult struct {
	posted  int // posts that returned no error
	ok      int // completions with WCSuccess
	flushed int // completions with WCWRFlushErr
	err     error
}

// poster posts signaled WRITEs on QP i until done says so, each the concurrent
// way first and under mu when that declines, reaps their completions,
// and checks that each completes once, in order, successfully until the
// first flushed one. It stops at the first post error other than
// ErrQueueFull (the QP reset or destroyed), and waits until every post
// before it has completed unless dropped says none will (reset, destroy).
// Under mu, with the engine stopped, every completion is in the CQ, so
// the outstanding count is exact there: PostSend must report a full
// queue exactly at depth.
func (r *postRig) poster(i int, done func(*postResult) bool, dropped func() bool) postResult {
	q, cq := r.a[i].QP, r.a[i].SCQ
	wr := r.wr(i)
	var res postResult
	defer r.active.Add(-1)
	var wc [16]qp.WorkCompletion
	seen := 0
	reap := func() {
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			switch {
			case res.err != nil:
			case c.WRID != uint64(seen):
				res.err = fmt.Errorf("completion of WR %d, want %d", c.WRID, seen)
			case c.Status == qp.WCSuccess && res.flushed == 0:
				res.ok++
			case c.Status == qp.WCWRFlushErr:
				res.flushed++
			default:
				res.err = fmt.Errorf("WR %d: status %v after %d flushed", c.WRID, c.Status, res.flushed)
			}
			seen++
		}
	}
	deadline := time.Now().Add(time.Minute)
	for !done(&res) && res.err == nil {
		if time.Now().After(deadline) {
			res.err = fmt.Errorf("posted %d by the deadline, %d completed", res.posted, seen)
			return res
		}
		wr.ID = uint64(res.posted)
		ok, err := q.PostSendConcurrent(&wr)
		if ok {
			if err != nil {
				return res // destroyed
			}
			res.posted++
			r.viaSQ.Add(1)
			reap()
			continue
		}
		r.waiting.Add(1)
		r.mu.Lock()
		r.waiting.Add(-1)
		reap()
		out := res.posted - seen
		err = q.PostSend(&wr)
		r.mu.Unlock()
		switch {
		case err == nil:
			if out >= r.depth {
				res.err = fmt.Errorf("PostSend took WR %d with %d outstanding, depth %d", res.posted, out, r.depth)
			}
			res.posted++
		case errors.Is(err, qp.ErrQueueFull):
			if out < r.depth {
				res.err = fmt.Errorf("queue full with %d outstanding, depth %d", out, r.depth)
			}
			runtime.Gosched()
		default:
			// Reset or destroyed.
			if !errors.Is(err, qp.ErrInvalidState) && !errors.Is(err, qp.ErrClosed) {
				res.err = err
			}
			return res
		}
	}
	for seen < res.posted && res.err == nil && !dropped() {
		if time.Now().After(deadline) {
			res.err = fmt.Errorf("%d of %d posts completed by the deadline", seen, res.posted)
			break
		}
		reap()
		runtime.Gosched()
	}
	reap()
	return res
}

// posters runs poster on each of the rig's first nqp QPs, each in a
// goroutine of its own; the function it returns waits for them all and
// returns their results.
func (r *postRig) posters(nqp int, done func(*postResult) bool, dropped func() bool) (wait func() []postResult) {
	res := make([]postResult, nqp)
	var wg sync.WaitGroup
	r.active.Store(int32(nqp))
	for i := 0; i < nqp; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res[i] = r.poster(i, done, dropped)
		}(i)
	}
	return func() []postResult {
		wg.Wait()
		return res
	}
}

// awaitViaSQ lets the posters run until n posts went the concurrent way,
// or a minute passed.
func (r *postRig) awaitViaSQ(n int64) {
	for deadline := time.Now().Add(time.Minute); r.viaSQ.Load() < n && time.Now().Before(deadline); {
		runtime.Gosched()
	}
}

// Posters on several QPs, the concurrent way where they can, beside a
// goroutine driving the engines: every WR completes once, in order, and
// the queue is full exactly at MaxSendWR.
func TestPostSendConcurrentWithEngine(t *testing.T) {
	nqp, total := 6, 3000
	if testing.Short() {
		nqp, total = 4, 800
	}
	r := newPostRig(t, nqp, 16)
	r.start()
	res := r.posters(nqp, func(p *postResult) bool { return p.posted == total }, func() bool { return false })()
	r.halt()
	for i, p := range res {
		if p.err != nil {
			t.Errorf("QP %d: %v", i, p.err)
		}
		if p.posted != total || p.ok != total {
			t.Errorf("QP %d: %d posted, %d completed, want %d", i, p.posted, p.ok, total)
		}
	}
	if r.viaSQ.Load() == 0 {
		t.Error("no post went the concurrent way")
	}
	t.Logf("%d of %d posts without the engine's lock", r.viaSQ.Load(), nqp*total)
}

// Posts racing a move to ERR: each completes exactly once, sent or
// flushed, and none succeeds after the first flushed.
func TestPostSendConcurrentRacesError(t *testing.T) {
	const nqp, total = 4, 1500
	r := newPostRig(t, nqp, 16)
	r.start()
	// Past the move, a few posts more, to be flushed.
	wait := r.posters(nqp, func(p *postResult) bool { return p.posted >= total && p.flushed >= 10 }, func() bool { return false })
	// Once posts are under way, on every QP, move them to ERR.
	r.awaitViaSQ(int64(nqp * total / 4))
	r.mu.Lock()
	r.awaitPublished(nqp)
	for _, a := range r.a {
		if err := a.QP.Modify(&qp.QPAttr{State: qp.StateErr}, qp.AttrState); err != nil {
			t.Error(err)
		}
	}
	r.mu.Unlock()
	res := wait()
	r.halt()
	for i, p := range res {
		if p.err != nil {
			t.Errorf("QP %d: %v", i, p.err)
		}
		if p.posted < total || p.flushed == 0 || p.ok+p.flushed != p.posted {
			t.Errorf("QP %d: %d posted, %d completed + %d flushed", i, p.posted, p.ok, p.flushed)
		}
	}
}

// Posts racing Reset and Destroy: a WR completes at most once, in order;
// after the reset or destroy the posts are refused, and nothing stays
// ready to send.
func TestPostSendConcurrentRacesResetDestroy(t *testing.T) {
	const nqp, total = 4, 1000
	r := newPostRig(t, nqp, 16)
	r.start()
	var gone atomic.Bool
	// Until the reset or destroy refuses a post.
	wait := r.posters(nqp, func(*postResult) bool { return false }, gone.Load)
	r.awaitViaSQ(int64(nqp * total))
	r.mu.Lock()
	r.awaitPublished(nqp)
	for i, a := range r.a {
		var err error
		if i%2 == 0 {
			err = a.QP.Modify(&qp.QPAttr{State: qp.StateReset}, qp.AttrState)
		} else {
			err = a.QP.Destroy()
		}
		if err != nil {
			t.Error(err)
		}
	}
	gone.Store(true)
	r.mu.Unlock()
	res := wait()
	for i, p := range res {
		if p.err != nil {
			t.Errorf("QP %d: %v", i, p.err)
		}
		if p.flushed != 0 || p.ok > p.posted {
			t.Errorf("QP %d: %d posted, %d completed, %d flushed", i, p.posted, p.ok, p.flushed)
		}
	}
	// The engine goroutine drains what the posts left in the shard's
	// inbox: nothing stays ready.
	for deadline := time.Now().Add(time.Minute); r.n.A.E.ReadyShards() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("ReadyShards() = %#b after the QPs were reset or destroyed", r.n.A.E.ReadyShards())
		}
		runtime.Gosched()
	}
	r.halt()
	wr := r.wr(0)
	for i, a := range r.a {
		want := qp.ErrInvalidState
		if i%2 == 1 {
			want = qp.ErrClosed
		}
		ok, err := a.QP.PostSendConcurrent(&wr)
		if want == qp.ErrClosed && (!ok || !errors.Is(err, want)) || want == qp.ErrInvalidState && ok {
			t.Errorf("QP %d after the race: PostSendConcurrent = %v, %v", i, ok, err)
		}
		if err := a.QP.PostSend(&wr); !errors.Is(err, want) {
			t.Errorf("QP %d after the race: PostSend = %v, want %v", i, err, want)
		}
	}
}

// What PostSendConcurrent takes and what it leaves to PostSend, and the
// queue full exactly at MaxSendWR whichever way the WRs came.
func TestPostSendConcurrentCases(t *testing.T) {
	const depth = 8
	r := newPostRig(t, 1, depth)
	q, cq := r.a[0].QP, r.a[0].SCQ
	e := r.n.A.E
	wr := r.wr(0)
	// No send queue yet: it is made on the first post, under the engine.
	if ok, _ := q.PostSendConcurrent(&wr); ok {
		t.Fatal("posted before the send queue existed")
	}
	if err := q.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < depth; i++ {
		if ok, err := q.PostSendConcurrent(&wr); !ok || err != nil {
			t.Fatalf("post %d: %v, %v", i, ok, err)
		}
	}
	if ok, _ := q.PostSendConcurrent(&wr); ok {
		t.Fatal("posted past MaxSendWR")
	}
	if err := q.PostSend(&wr); !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("PostSend on a full queue: %v", err)
	}
	var wc [2 * depth]qp.WorkCompletion
	got := 0
	if err := r.n.Run(func() bool { got += cq.Poll(wc[:]); return got == depth }, time.Second); err != nil {
		t.Fatal(err)
	}
	// The completions free the slots for the concurrent way too.
	for i := 0; i < depth; i++ {
		if ok, err := q.PostSendConcurrent(&wr); !ok || err != nil {
			t.Fatalf("post %d after the completions: %v, %v", i, ok, err)
		}
	}
	if m := e.ReadyShards(); m != 1 {
		t.Fatalf("ReadyShards() = %#b after concurrent posts", m)
	}
	got = 0
	if err := r.n.Run(func() bool { got += cq.Poll(wc[:]); return got == depth }, time.Second); err != nil {
		t.Fatal(err)
	}
	// Errors a post is checked for come back as PostSend's.
	big := wr
	big.Flags = qp.SendSignaled
	big.SGL = make([]qp.SGE, 5)
	if ok, err := q.PostSendConcurrent(&big); !ok || !errors.Is(err, qp.ErrTooManySGE) {
		t.Fatalf("too many SGEs: %v, %v", ok, err)
	}
	// What reads engine objects or state is left to PostSend.
	for _, w := range []qp.SendWR{
		{Opcode: qp.WRLocalInv, InvalidateRKey: 1},
		{Opcode: qp.WRBindMW},
		{Opcode: qp.WRRDMARead, SGL: []qp.SGE{{Length: 1 << 30}}}, // past the bound at MTU 256
	} {
		if ok, err := q.PostSendConcurrent(&w); ok {
			t.Errorf("opcode %v: taken (%v)", w.Opcode, err)
		}
	}
	ud, err := qptest.NewEndpoint(e, qp.UD, 4)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := ud.QP.PostSendConcurrent(&qp.SendWR{Opcode: qp.WRSend}); ok {
		t.Error("UD: taken")
	}
	if err := q.Modify(&qp.QPAttr{State: qp.StateSQD}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if ok, _ := q.PostSendConcurrent(&wr); ok {
		t.Error("SQD: taken")
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if ok, err := q.PostSendConcurrent(&wr); !ok || !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("destroyed: %v, %v", ok, err)
	}
}

// A post the concurrent way allocates nothing.
func TestPostSendConcurrentAllocs(t *testing.T) {
	r := newPostRig(t, 1, 64)
	q, cq := r.a[0].QP, r.a[0].SCQ
	wr := r.wr(0)
	if err := q.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	var wc [64]qp.WorkCompletion
	allocs := testing.AllocsPerRun(100, func() {
		if ok, err := q.PostSendConcurrent(&wr); !ok || err != nil {
			t.Fatalf("%v, %v", ok, err)
		}
		for r.n.Step() {
		}
		cq.Poll(wc[:])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per post", allocs)
	}
}
