//go:build !linux

package roce

import (
	"context"
	"time"
)

// wakeTimer is the timer goroutine's wake-up: a runtime timer (on Linux, a
// timerfd; wake_linux.go).
type wakeTimer struct{ t *time.Timer }

func newWakeTimer(context.Context) *wakeTimer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &wakeTimer{t}
}

func (w *wakeTimer) reset(d time.Duration) { w.t.Reset(d) }
func (w *wakeTimer) disarm()               { w.t.Stop() }
func (w *wakeTimer) close()                { w.t.Stop() }

// wait blocks until the timer expires or ctx ends, and reports whether it
// expired.
func (w *wakeTimer) wait(ctx context.Context) bool {
	select {
	case <-w.t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
