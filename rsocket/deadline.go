package rsocket

import (
	"context"
	"os"
	"sync"
	"time"
)

// deadline is a settable point in time whose channel is closed once it
// passes (the pattern of net.Pipe). Waiting on it allocates nothing.
//
// The channel also closes for good when the connection ends (terminate),
// so that a Read or Write waiting on the CQ with it as context (see
// Conn.awaitLocked) returns; whether the deadline itself passed is
// exceeded's answer, not the channel's.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{}
	t     time.Time // the deadline; zero: none
	dead  bool      // terminated: ch stays closed
}

func newDeadline() *deadline { return &deadline{ch: make(chan struct{})} }

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// set arms the deadline for t; the zero time clears it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.t = t
	if d.dead {
		return
	}
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the callback is closing it
	}
	d.timer = nil
	closed := isClosed(d.ch)
	if t.IsZero() {
		if closed {
			d.ch = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.ch = make(chan struct{})
		}
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.ch)
	}
}

// terminate closes the channel for good: the connection ended.
func (d *deadline) terminate() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return
	}
	d.dead = true
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch
	}
	d.timer = nil
	if !isClosed(d.ch) {
		close(d.ch)
	}
}

// exceeded reports whether the deadline has passed: until the connection
// ends, exactly when the channel is closed.
func (d *deadline) exceeded() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.dead {
		return isClosed(d.ch)
	}
	return !d.t.IsZero() && !time.Now().Before(d.t)
}

// wait returns a channel closed when the deadline passes or the connection
// ends.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// A *deadline is the context of a CQ wait (roce.CQ.Wait looks only at Done
// and Err): no context to make per wait, and the wait ends when the
// deadline is set into the past, as a pending Read's must.
var _ context.Context = (*deadline)(nil)

func (d *deadline) Deadline() (time.Time, bool) { return time.Time{}, false }
func (d *deadline) Done() <-chan struct{}       { return d.wait() }
func (d *deadline) Value(any) any               { return nil }
func (d *deadline) Err() error {
	if isClosed(d.wait()) {
		return os.ErrDeadlineExceeded
	}
	return nil
}
