package roce

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/faultnet"
)

// A receive server hands frames to worker goroutines, which check and
// release them; the released buffers are posted again and receive later
// messages. The slab has far fewer buffers than messages, so every buffer is
// reused many times.
func TestFramesReleasedElsewhere(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 64)
	// RNR retry forever: the sender outruns the releases.
	connect(t, a, b, addrA, addrB, ConnectAttr{MinRNRTimer: 1})
	const bufs, msgs, workers = 8, 500, 4
	slab, err := b.pd.NewRecvSlab(b.qp, bufs, 256)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	frames := make(chan Frame, bufs)
	errs := make(chan error, workers+1)
	seen := make([]bool, msgs)
	var seenMu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range frames {
				if f.Len() != 8 {
					errs <- errors.New("frame of the wrong length")
					return
				}
				i := binary.BigEndian.Uint64(f.Bytes())
				seenMu.Lock()
				if i >= msgs || seen[i] {
					seenMu.Unlock()
					errs <- errors.New("message received twice or out of range")
					return
				}
				seen[i] = true
				seenMu.Unlock()
				if err := f.Release(); err != nil {
					errs <- err
					return
				}
				// A copy of a released frame cannot release the buffer again.
				if err := f.Release(); !errors.Is(err, ErrFrameReleased) {
					errs <- errors.New("second Release did not fail with ErrFrameReleased")
					return
				}
			}
		}()
	}
	go func() { // sender; each message has its own bytes, as an RNR retry re-reads them
		for i := 0; i < msgs; i++ {
			binary.BigEndian.PutUint64(a.buf[i*8:], uint64(i))
			wr := SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(i*8, 8)}}
			for {
				err := a.qp.PostSend(&wr)
				if err == nil {
					break
				}
				if !errors.Is(err, qp.ErrQueueFull) || ctx.Err() != nil {
					errs <- err
					return
				}
				time.Sleep(100 * time.Microsecond) // unsignalled sends leave with their ACK
			}
		}
	}()
	var wc [8]WorkCompletion
	for got := 0; got < msgs; {
		n := b.rcq.Poll(wc[:])
		for i := range wc[:n] {
			if wc[i].Status != WCSuccess {
				t.Fatalf("receive %d: %v", got, wc[i].Status)
			}
			f, err := slab.Frame(&wc[i])
			if err != nil {
				t.Fatal(err)
			}
			if _, err := slab.Frame(&wc[i]); !errors.Is(err, ErrFrameReleased) {
				t.Fatalf("second Frame of one completion: %v", err)
			}
			frames <- f
			got++
		}
		if n == 0 {
			if err := b.rcq.Wait(ctx); err != nil {
				t.Fatalf("after %d messages: %v", got, err)
			}
		}
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	close(frames)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := slab.Repost(&wc[0]); !errors.Is(err, ErrFrameReleased) {
		t.Fatalf("Repost of a released buffer: %v", err)
	}
}

// RepostBatch reposts a whole poll under one lock; a stale completion in the
// batch stops it with ErrFrameReleased and the count of those reposted.
func TestRepostBatch(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	slab, err := b.pd.NewRecvSlab(b.qp, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	send := func(n int) []WorkCompletion {
		for i := 0; i < n; i++ {
			if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("frame")}); err != nil {
				t.Fatal(err)
			}
		}
		out := make([]WorkCompletion, 0, n)
		for len(out) < n {
			out = append(out, waitWC(t, b.rcq, 5*time.Second))
		}
		return out
	}
	for round := 0; round < 5; round++ { // 5 × 16: every buffer used five times
		wcs := send(16)
		if n, err := slab.RepostBatch(wcs); n != 16 || err != nil {
			t.Fatalf("round %d: RepostBatch = %d, %v", round, n, err)
		}
		if n, err := slab.RepostBatch(wcs); n != 0 || !errors.Is(err, ErrFrameReleased) {
			t.Fatalf("round %d: RepostBatch of the same completions = %d, %v", round, n, err)
		}
	}
	wcs := send(4)
	f, err := slab.Frame(&wcs[1])
	if err != nil {
		t.Fatal(err)
	}
	if string(f.Bytes()) != "frame" {
		t.Fatalf("frame holds %q", f.Bytes())
	}
	// Reposting a claimed buffer releases it; the frame is then stale.
	if n, err := slab.RepostBatch(wcs); n != 4 || err != nil {
		t.Fatalf("RepostBatch with a claimed buffer = %d, %v", n, err)
	}
	if err := f.Release(); !errors.Is(err, ErrFrameReleased) {
		t.Fatalf("Release after the batch reposted it: %v", err)
	}
	if err := (Frame{}).Release(); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("Release of a zero frame: %v", err)
	}
	other := WorkCompletion{WRID: 5}
	if _, err := slab.Frame(&other); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("Frame of a foreign completion: %v", err)
	}
	if err := b.qp.Close(); err != nil {
		t.Fatal(err)
	}
}

// QP and SRQ PostRecvBatch post a slice of receives under one lock.
func TestPostRecvBatch(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	wrs := make([]RecvWR, 4)
	for i := range wrs {
		wrs[i] = RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}
	}
	if n, err := b.qp.PostRecvBatch(wrs); n != 4 || err != nil {
		t.Fatalf("PostRecvBatch = %d, %v", n, err)
	}
	for i := 0; i < 4; i++ {
		if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, b.rcq, 5*time.Second); wc.WRID != uint64(i) || wc.Status != WCSuccess {
			t.Fatalf("receive %d: %+v", i, wc)
		}
	}
	srq, err := b.pd.CreateSRQ(SRQAttr{MaxWR: 3, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := srq.PostRecvBatch(wrs); n != 3 || !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("SRQ PostRecvBatch of 4 into 3 = %d, %v", n, err)
	}
	if n := srq.Len(); n != 3 {
		t.Fatalf("SRQ holds %d receives, want 3", n)
	}
}

// Frame, Release and RepostBatch allocate nothing.
func TestAllocsFrames(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	slab, err := b.pd.NewRecvSlab(b.qp, 8, 64)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	swr := SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("frame")}
	var wc [2]WorkCompletion
	recv := func(k int) {
		for got := 0; got < k; {
			n := b.rcq.Poll(wc[got:k])
			got += n
			if n == 0 {
				if err := b.rcq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	round := func() {
		a.qp.PostSend(&swr)
		a.qp.PostSend(&swr)
		recv(2)
		f, err := slab.Frame(&wc[0])
		if err != nil || f.Len() != 5 {
			t.Fatal(err)
		}
		if err := f.Release(); err != nil {
			t.Fatal(err)
		}
		if n, err := slab.RepostBatch(wc[1:2]); n != 1 || err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		round()
	}
	if allocs := testing.AllocsPerRun(200, round); allocs > 0.5 {
		t.Fatalf("%.2f allocations per two frames", allocs)
	}
}
