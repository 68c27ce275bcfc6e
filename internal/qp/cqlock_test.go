package qp

import (
	"sync"
	"testing"
	"time"
)

type stillClock struct{}

func (stillClock) Now() time.Duration { return 0 }

// A consumer polls a CQ while the engine adds completions, under a lock
// of the caller's that Poll does not take (as a device's lock): every
// completion comes out once, in order.
func TestCQPollWhilePushing(t *testing.T) {
	e, err := New(Config{Clock: stillClock{}})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := e.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	var notified int
	cq.Notify = func() { notified++ } // under the CQ's lock
	const total = 20000
	var devMu sync.Mutex // the device's lock: the engine runs under it
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < total; {
			devMu.Lock()
			// Only this goroutine adds, so room seen stays room.
			for k := 0; k < 8 && i < total && cq.Len() < len(cq.ring); k++ {
				if !cq.push(&WorkCompletion{WRID: uint64(i)}) {
					t.Error("push refused with room")
				}
				i++
			}
			devMu.Unlock()
		}
	}()
	var wc [5]WorkCompletion
	deadline := time.Now().Add(time.Minute)
	for want := uint64(0); want < total; {
		if time.Now().After(deadline) {
			t.Fatalf("polled %d of %d completions", want, total)
		}
		n := cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if c.WRID != want {
				t.Fatalf("completion %d, want %d", c.WRID, want)
			}
			want++
		}
	}
	<-done
	if cq.Overflows() != 0 || cq.Len() != 0 {
		t.Fatalf("overflows %d, left %d", cq.Overflows(), cq.Len())
	}
	devMu.Lock()
	defer devMu.Unlock()
	if notified != total {
		t.Fatalf("Notify called %d times, want %d", notified, total)
	}
}
