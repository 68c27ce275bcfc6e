package roce

import (
	"context"
	"testing"
	"time"
)

// The timer goroutine's wake-up fires once armed, not once disarmed, and
// an earlier reset during a wait moves the wake-up; a cancelled context
// ends a wait whatever the timer; close releases it. The bounds are
// seconds: a loaded machine may be slow, never this slow.
func TestWakeTimer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := newWakeTimer(ctx)
	// wait runs w.wait and reports its result, or that it took over 10 s.
	wait := func() (expired, done bool) {
		ch := make(chan bool, 1)
		go func() { ch <- w.wait(ctx) }()
		select {
		case ok := <-ch:
			return ok, true
		case <-time.After(10 * time.Second):
			return false, false
		}
	}
	w.reset(time.Millisecond)
	if ok, done := wait(); !ok || !done {
		t.Fatalf("armed for 1 ms: expired %v, returned %v", ok, done)
	}
	// A wait on an hour-long timer, moved to 1 ms from elsewhere.
	w.reset(time.Hour)
	ch := make(chan bool, 1)
	go func() { ch <- w.wait(ctx) }()
	time.Sleep(10 * time.Millisecond)
	w.reset(time.Millisecond)
	select {
	case ok := <-ch:
		if !ok {
			t.Fatal("moved to 1 ms: wait reports no expiry")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("moved to 1 ms: still waiting after 10 s")
	}
	// Disarmed: only the context ends the wait.
	w.disarm()
	go func() { ch <- w.wait(ctx) }()
	select {
	case <-ch:
		t.Fatal("a disarmed timer woke its waiter")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	select {
	case ok := <-ch:
		if ok {
			t.Fatal("wait ended by the context reports an expiry")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled context did not end the wait")
	}
	w.close()
	w.reset(time.Millisecond) // nothing after close
	w.disarm()
}
