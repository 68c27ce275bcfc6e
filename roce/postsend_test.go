package roce

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/faultnet"
)

// Batches posted from a goroutine per QP, most without the device lock,
// race a move of every QP to ERR: each work request completes once, in
// order, sent or flushed, none sent after the first flushed.
func TestPostSendBatchRacesError(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	const nqp, batch = 4, 4
	var as, bs []*endpoint
	for i := 0; i < nqp; i++ {
		a := newEndpoint(t, da, RC, 64)
		b := newEndpoint(t, db, RC, 64)
		connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 14})
		as, bs = append(as, a), append(bs, b)
	}
	var posted atomic.Int64
	var moved atomic.Bool
	errs := make([]error, nqp)
	var wg sync.WaitGroup
	for i := 0; i < nqp; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = postUntilFlushed(as[i], bs[i], batch, &posted, &moved)
		}(i)
	}
	for deadline := time.Now().Add(time.Minute); posted.Load() < 2000 && time.Now().Before(deadline); {
		runtime.Gosched()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range as {
		if err := a.qp.Modify(ctx, &QPAttr{State: StateErr}, AttrState); err != nil {
			t.Error(err)
		}
	}
	moved.Store(true)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("QP %d: %v", i, err)
		}
	}
}

// postUntilFlushed posts signaled WRITEs from a to b in batches until,
// after moved, a few have been flushed, and then waits for every one to
// complete, checking each completes once and in order.
func postUntilFlushed(a, b *endpoint, batch int, posted *atomic.Int64, moved *atomic.Bool) error {
	wrs := make([]SendWR, batch)
	sent, seen, ok, flushed := 0, 0, 0, 0
	var wc [32]WorkCompletion
	reap := func() error {
		n := a.scq.Poll(wc[:])
		for _, c := range wc[:n] {
			switch {
			case c.WRID != uint64(seen):
				return fmt.Errorf("completion of WR %d, want %d", c.WRID, seen)
			case c.Status == WCSuccess && flushed == 0:
				ok++
			case c.Status == WCWRFlushErr:
				flushed++
			default:
				return fmt.Errorf("WR %d: %v after %d flushed", c.WRID, c.Status, flushed)
			}
			seen++
		}
		return nil
	}
	deadline := time.Now().Add(time.Minute)
	for !moved.Load() || flushed < 5 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d posted, %d completed, %d flushed by the deadline", sent, ok, flushed)
		}
		for k := range wrs {
			wrs[k] = SendWR{ID: uint64(sent + k), Opcode: WRRDMAWrite, Flags: SendSignaled,
				SGL: []SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
		}
		n, err := a.qp.PostSendBatch(wrs)
		sent += n
		posted.Add(int64(n))
		if err != nil && !errors.Is(err, qp.ErrQueueFull) {
			return err
		}
		if err := reap(); err != nil {
			return err
		}
	}
	for seen < sent {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d completed by the deadline", seen, sent)
		}
		if err := reap(); err != nil {
			return err
		}
		runtime.Gosched()
	}
	if ok+flushed != sent {
		return fmt.Errorf("%d posted, %d completed + %d flushed", sent, ok, flushed)
	}
	return nil
}
