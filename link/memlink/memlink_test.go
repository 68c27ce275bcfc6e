package memlink

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
)

func frame(i, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint32(b[14:], uint32(i))
	for j := 18; j < size; j++ {
		b[j] = byte(i * j)
	}
	return b
}

func readN(t *testing.T, l *Link, n int, timeout time.Duration) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []int
	for len(got) < n {
		_, err := l.ReadBatch(ctx, func(frames [][]byte) {
			for _, f := range frames {
				got = append(got, int(binary.BigEndian.Uint32(f[14:])))
			}
		})
		if err != nil {
			t.Fatalf("after %d frames: %v", len(got), err)
		}
	}
	return got
}

func TestPairBothWays(t *testing.T) {
	a, b := Pair(faultnet.Config{}, faultnet.Config{})
	defer a.Close()
	defer b.Close()
	var frames [][]byte
	for i := 0; i < 100; i++ {
		frames = append(frames, frame(i, 60+i))
	}
	if n, err := a.WriteBatch(frames); n != 100 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	// The caller may reuse its buffers at once.
	for _, f := range frames {
		clear(f)
	}
	got := readN(t, b, 100, 10*time.Second)
	for i, v := range got {
		if v != i {
			t.Fatalf("frame %d is %d", i, v)
		}
	}
	if n, err := b.WriteBatch([][]byte{frame(7, 100)}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	if got := readN(t, a, 1, 10*time.Second); got[0] != 7 {
		t.Fatal(got)
	}
	if a.Info().Kind != link.KindMem || a.MTU() != 1500 || a.HardwareAddr().String() == b.HardwareAddr().String() {
		t.Fatal(a.Info(), a.MTU(), a.HardwareAddr(), b.HardwareAddr())
	}
}

func TestContentIntact(t *testing.T) {
	want := frame(5, 4000)
	a, b := PairWithOptions(Options{MTU: 9000})
	a.WriteBatch([][]byte{want})
	b.ReadBatch(context.Background(), func(frames [][]byte) {
		if len(frames) != 1 || string(frames[0]) != string(want) {
			t.Fatal("frame altered")
		}
	})
}

func TestRealTimeDelay(t *testing.T) {
	const delay = 30 * time.Millisecond
	a, b := Pair(faultnet.Config{Delay: delay}, faultnet.Config{})
	start := time.Now()
	a.WriteBatch([][]byte{frame(1, 64)})
	readN(t, b, 1, 10*time.Second)
	if el := time.Since(start); el < delay {
		t.Fatalf("frame arrived after %v, before its %v delay", el, delay)
	}
}

func TestContextCancel(t *testing.T) {
	a, _ := Pair(faultnet.Config{}, faultnet.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := a.ReadBatch(ctx, func([][]byte) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

func TestCloseUnblocks(t *testing.T) {
	a, b := Pair(faultnet.Config{}, faultnet.Config{})
	errc := make(chan error)
	go func() {
		_, err := a.ReadBatch(context.Background(), func([][]byte) {})
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, link.ErrClosed) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Close did not unblock ReadBatch")
	}
	if _, err := a.WriteBatch([][]byte{frame(0, 64)}); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("write after close: %v", err)
	}
	// Writing to a closed peer is like sending to a dead host: accepted, lost.
	if n, err := b.WriteBatch([][]byte{frame(0, 64)}); n != 1 || err != nil {
		t.Fatalf("write to closed peer: %d, %v", n, err)
	}
	if err := a.Close(); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestBadFrames(t *testing.T) {
	a, _ := PairWithOptions(Options{MTU: 1000})
	n, err := a.WriteBatch([][]byte{frame(0, 64), make([]byte, 13)})
	var fe *link.FrameError
	if n != 1 || !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, link.ErrMalformed) || link.ReasonOf(err) != "truncated" {
		t.Fatalf("short frame: %d, %v", n, err)
	}
	n, err = a.WriteBatch([][]byte{make([]byte, 1000+18), make([]byte, 1000+19)})
	if n != 1 || !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, link.ErrTooLarge) {
		t.Fatalf("long frame: %d, %v", n, err)
	}
}

// stepped runs a scripted exchange on a stepped pair and returns a digest of
// what b received, when.
func stepped(t *testing.T, cfg faultnet.Config) (uint64, faultnet.Stats) {
	clk := &ManualClock{}
	a, b := PairWithOptions(Options{AtoB: cfg, Clock: clk})
	h := fnv.New64a()
	var tb [8]byte
	fn := func(frames [][]byte) {
		binary.BigEndian.PutUint64(tb[:], uint64(clk.Now()))
		h.Write(tb[:])
		for _, f := range frames {
			h.Write(f)
		}
	}
	ctx := context.Background()
	for i := 0; i < 2000; i++ {
		a.WriteBatch([][]byte{frame(i, 64+i%200)})
		clk.Advance(10 * time.Microsecond)
		if d, ok := b.NextDue(); ok && d <= clk.Now() {
			b.ReadBatch(ctx, fn)
		}
	}
	for {
		d, ok := b.NextDue()
		if !ok {
			break
		}
		clk.Set(d)
		b.ReadBatch(ctx, fn)
	}
	return h.Sum64(), a.TxStats()
}

func TestSteppedDeterministic(t *testing.T) {
	cfg := faultnet.Config{Seed: 99, Loss: 0.05, Duplicate: 0.05, Reorder: 0.05, Corrupt: 0.05,
		Delay: 100 * time.Microsecond, Jitter: 30 * time.Microsecond}
	d1, s1 := stepped(t, cfg)
	d2, s2 := stepped(t, cfg)
	if d1 != d2 || s1 != s2 {
		t.Fatalf("runs differ: %x %+v / %x %+v", d1, s1, d2, s2)
	}
	if s1.Dropped == 0 || s1.Duplicated == 0 || s1.Reordered == 0 || s1.Corrupted == 0 {
		t.Fatalf("impairments not applied: %+v", s1)
	}
	cfg.Seed++
	if d3, _ := stepped(t, cfg); d3 == d1 {
		t.Fatal("different seed, same run")
	}
}

func TestSteppedWaitsForClock(t *testing.T) {
	clk := &ManualClock{}
	a, b := PairWithOptions(Options{AtoB: faultnet.Config{Delay: time.Second}, Clock: clk})
	a.WriteBatch([][]byte{frame(3, 64)})
	got := make(chan int, 1)
	go func() {
		b.ReadBatch(context.Background(), func(f [][]byte) { got <- len(f) })
	}()
	select {
	case <-got:
		t.Fatal("delivered before the clock moved")
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(time.Second)
	select {
	case n := <-got:
		if n != 1 {
			t.Fatal(n)
		}
	case <-time.After(time.Second):
		t.Fatal("Advance did not wake the reader")
	}
}

func TestWriteFromCallback(t *testing.T) {
	a, b := Pair(faultnet.Config{}, faultnet.Config{})
	a.WriteBatch([][]byte{frame(1, 64)})
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.ReadBatch(context.Background(), func(frames [][]byte) {
			// Reply on b and also loop back through a: neither may deadlock.
			b.WriteBatch(frames)
			a.WriteBatch(frames)
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("deadlock writing from the read callback")
	}
	readN(t, a, 1, 10*time.Second)
	readN(t, b, 1, 10*time.Second)
}

func TestConcurrent(t *testing.T) {
	a, b := Pair(faultnet.Config{Delay: 50 * time.Microsecond}, faultnet.Config{})
	const n = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		batch := make([][]byte, 16)
		for i := 0; i < n; i += 16 {
			for j := range batch {
				batch[j] = frame(i+j, 64)
			}
			a.WriteBatch(batch)
		}
	}()
	got := readN(t, b, n, 10*time.Second)
	wg.Wait()
	for i, v := range got {
		if v != i {
			t.Fatalf("frame %d is %d", i, v)
		}
	}
}

func TestNoAllocSteadyState(t *testing.T) {
	a, b := Pair(faultnet.Config{Seed: 1, Loss: 0.01, Duplicate: 0.01, Corrupt: 0.01}, faultnet.Config{})
	batch := make([][]byte, 8)
	for i := range batch {
		batch[i] = frame(i, 64+i*150)
	}
	ctx := context.Background()
	sink := 0
	fn := func(frames [][]byte) { sink += len(frames) }
	step := func() {
		a.WriteBatch(batch)
		for b.rx.pipe.Len() > 0 {
			b.ReadBatch(ctx, fn)
		}
	}
	for range 1000 {
		step()
	}
	if allocs := testing.AllocsPerRun(1000, step); allocs != 0 {
		t.Fatalf("%v allocations per batch of 8", allocs)
	}
}

func BenchmarkWriteRead(b *testing.B) {
	x, y := Pair(faultnet.Config{}, faultnet.Config{})
	batch := make([][]byte, 32)
	for i := range batch {
		batch[i] = frame(i, 1024)
	}
	ctx := context.Background()
	fn := func([][]byte) {}
	b.ReportAllocs()
	b.SetBytes(int64(32 * 1024))
	for b.Loop() {
		x.WriteBatch(batch)
		y.ReadBatch(ctx, fn)
	}
}
