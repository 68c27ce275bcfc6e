package udplink

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
)

// PollBatch never waits, WaitReadable takes nothing, and neither blocks
// the other (WaitReadable holds the descriptor's read lock in the runtime
// poller; PollBatch must not need it).
func TestPollBatch(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	var got []int
	fn := func(frames [][]byte) {
		for _, f := range frames {
			pf, err := link.ParseFrame(f)
			if err != nil {
				t.Errorf("frame does not parse: %v", err)
				continue
			}
			got = append(got, int(binary.BigEndian.Uint32(f[pf.Payload:])))
		}
	}
	if n, err := b.PollBatch(fn); n != 0 || err != nil || len(got) != 0 {
		t.Fatalf("empty PollBatch = %d, %v (fn got %v)", n, err, got)
	}
	if allocs := testing.AllocsPerRun(100, func() { b.PollBatch(fn) }); allocs != 0 {
		t.Fatalf("%v allocations per empty PollBatch", allocs)
	}

	waited := make(chan error, 1)
	go func() { waited <- b.WaitReadable(context.Background()) }()
	polled := make(chan error, 1)
	go func() {
		_, err := b.PollBatch(fn)
		polled <- err
	}()
	select {
	case err := <-polled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PollBatch blocked beside WaitReadable")
	}
	frames := [][]byte{
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 32)),
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(1, 32)),
	}
	if _, err := a.WriteBatch(frames); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitReadable = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReadable did not return after datagrams arrived")
	}
	// Loopback delivery is synchronous, but be patient with a busy host.
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		if err := b.WaitReadable(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := b.PollBatch(fn); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("polled frames %v", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { waited <- b.WaitReadable(ctx) }()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReadable with an ended context = %v", err)
	}
	go func() { waited <- b.WaitReadable(context.Background()) }()
	b.Close()
	if err := <-waited; !errors.Is(err, link.ErrClosed) {
		t.Fatalf("WaitReadable on close = %v", err)
	}
	if _, err := b.PollBatch(fn); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("PollBatch after close = %v", err)
	}
}

// SleepReadable returns once a datagram is queued, takes nothing, returns
// at once while one is, allocates nothing, and ends with ErrClosed when
// the link closes under it.
func TestSleepReadable(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	slept := make(chan error, 1)
	go func() { slept <- b.SleepReadable() }()
	if _, err := a.WriteBatch([][]byte{mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(7, 32))}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-slept:
		if err != nil {
			t.Fatalf("SleepReadable = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SleepReadable did not return after a datagram arrived")
	}
	// The datagram is still queued: SleepReadable took nothing, and
	// returns at once without allocating.
	if allocs := testing.AllocsPerRun(100, func() {
		if err := b.SleepReadable(); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations per SleepReadable", allocs)
	}
	n, err := b.PollBatch(func([][]byte) {})
	if n != 1 || err != nil {
		t.Fatalf("PollBatch after SleepReadable = %d, %v", n, err)
	}

	go func() { slept <- b.SleepReadable() }()
	// Close must end the sleep whether it has begun polling or not.
	time.Sleep(10 * time.Millisecond)
	b.Close()
	select {
	case err := <-slept:
		if !errors.Is(err, link.ErrClosed) {
			t.Fatalf("SleepReadable on close = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end SleepReadable")
	}
	if err := b.SleepReadable(); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("SleepReadable after close = %v", err)
	}
}

// BenchmarkWakeWhileSpinning measures how long a receiver takes to run
// after a datagram is queued while every P runs a goroutine that spins and
// yields (as CQ pollers do): the median and 90th percentile from send to
// the receiver running. A receiver parked in the runtime poller (WaitReadable)
// waits for sysmon's network poll, up to 10 ms; one blocked in the kernel
// (SleepReadable) joins the run queue the spinners yield to.
func BenchmarkWakeWhileSpinning(b *testing.B) {
	for _, c := range []struct {
		name string
		wait func(l *Link) error
	}{
		{"WaitReadable", func(l *Link) error { return l.WaitReadable(context.Background()) }},
		{"SleepReadable", (*Link).SleepReadable},
	} {
		b.Run(c.name, func(b *testing.B) {
			tx, rx := listen(b, "127.0.0.1"), listen(b, "127.0.0.1")
			frame := [][]byte{mkframe(tx.LocalAddr(), rx.LocalAddr(), 0, payload(1, 32))}
			stop := make(chan struct{})
			defer close(stop)
			for range runtime.GOMAXPROCS(0) {
				go func() {
					for {
						select {
						case <-stop:
							return
						default:
							runtime.Gosched()
						}
					}
				}()
			}
			woke := make(chan time.Time)
			ready := make(chan struct{}, 1)
			go func() {
				for {
					ready <- struct{}{}
					if err := c.wait(rx); err != nil {
						close(woke)
						return
					}
					woke <- time.Now()
					for {
						if n, _ := rx.PollBatch(func([][]byte) {}); n == 0 {
							break
						}
					}
				}
			}()
			var waits []time.Duration
			for b.Loop() {
				<-ready
				// Let the receiver reach its wait.
				time.Sleep(200 * time.Microsecond)
				sent := time.Now()
				if _, err := tx.WriteBatch(frame); err != nil {
					b.Fatal(err)
				}
				waits = append(waits, (<-woke).Sub(sent))
			}
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "p50-wake-µs")
			b.ReportMetric(float64(waits[len(waits)*9/10].Microseconds()), "p90-wake-µs")
			rx.Close()
			for range woke {
			}
		})
	}
}
