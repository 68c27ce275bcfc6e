package roce

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// wakeTimer is the timer goroutine's wake-up. The engine's probe timeout
// is a few hundred microseconds, but a runtime timer is late by up to a
// millisecond when every goroutine of the process waits: the runtime's
// poller then sleeps in whole milliseconds, a shorter wait rounded up to
// one. On memlink under 1 % loss that made each probe cost over a
// millisecond of an idle path. A timerfd in the runtime's poller ends that
// sleep when it expires. Where no timerfd can be made the runtime timer
// serves.
type wakeTimer struct {
	fd   int      // the timerfd, -1 once closed or if none
	f    *os.File // fd, read through the runtime's poller
	spec unix.ItimerSpec
	buf  [8]byte
	t    *time.Timer // without a timerfd
	stop func() bool // the context.AfterFunc that ends a wait
}

func newWakeTimer(ctx context.Context) *wakeTimer {
	w := &wakeTimer{fd: -1}
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		w.t = time.NewTimer(time.Hour)
		w.t.Stop()
		return w
	}
	w.fd, w.f = fd, os.NewFile(uintptr(fd), "roce-timer")
	// Ends a Read under way: the device is closing.
	w.stop = context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Now()) })
	return w
}

// reset makes the timer expire after d (> 0). The device's mu serializes
// reset, stop and close.
func (w *wakeTimer) reset(d time.Duration) {
	if w.t != nil {
		w.t.Reset(d)
		return
	}
	if w.fd < 0 {
		return
	}
	w.spec.Value = unix.NsecToTimespec(int64(d))
	_ = unix.TimerfdSettime(w.fd, 0, &w.spec, nil)
}

func (w *wakeTimer) disarm() {
	if w.t != nil {
		w.t.Stop()
		return
	}
	if w.fd < 0 {
		return
	}
	w.spec.Value = unix.Timespec{}
	_ = unix.TimerfdSettime(w.fd, 0, &w.spec, nil)
}

// wait blocks until the timer expires or ctx ends, and reports whether it
// expired.
func (w *wakeTimer) wait(ctx context.Context) bool {
	if w.t != nil {
		select {
		case <-w.t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	_, err := w.f.Read(w.buf[:])
	return err == nil && ctx.Err() == nil
}

// close releases the timerfd; reset and disarm do nothing after it.
func (w *wakeTimer) close() {
	if w.t != nil {
		w.t.Stop()
		return
	}
	if w.fd < 0 {
		return
	}
	w.stop()
	w.fd = -1
	w.f.Close()
}
