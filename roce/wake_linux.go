package roce

import (
	"context"
	"errors"
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
// sleep when it expires. The poller is not asked while every P has a
// goroutine to run, though (a busy poller yields to itself), so the read
// also has a deadline a millisecond later, a runtime timer, which the
// scheduler runs then: never later than the runtime timer alone would be.
// Not at the same time: both would wake a thread, and on memlink without
// loss that cost 7 % of the goodput. Where no timerfd can be made the
// runtime timer alone serves.
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
	_ = w.f.SetReadDeadline(time.Now().Add(d + fallbackLate))
}

// fallbackLate is how much later than the timerfd the read's deadline
// ends it.
const fallbackLate = time.Millisecond

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
	_ = w.f.SetReadDeadline(time.Time{})
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
	// reset and disarm replace the deadline the device's Close set: a
	// Close before this check is seen here, one after it ends the read.
	if ctx.Err() != nil {
		return false
	}
	// A timerfd read, or the deadline passed (os.ErrDeadlineExceeded).
	_, err := w.f.Read(w.buf[:])
	return ctx.Err() == nil && (err == nil || errors.Is(err, os.ErrDeadlineExceeded))
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
