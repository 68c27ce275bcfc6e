package udplink

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/link"
)

var _ link.Poller = (*Link)(nil)

// PollBatch reads the datagrams already queued on the socket (one
// recvmmsg with MSG_DONTWAIT) and calls fn with them as synthesized
// Ethernet frames, valid only during fn. It never waits: it returns 0 when
// nothing is queued or another goroutine is reading the link (a ReadBatch
// waiting in the poller included). It is kept apart from ReadBatch so that
// the blocking path stays as it is.
func (l *Link) PollBatch(fn func(frames [][]byte)) (int, error) {
	if !l.readMu.TryLock() {
		if l.closed.Load() {
			return 0, link.ErrClosed
		}
		return 0, nil
	}
	defer l.readMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, link.ErrClosed
		}
		l.resetRecv()
		// Control, not Read: Read holds the descriptor's read lock, which
		// a WaitReadable blocked in the poller holds too. Control only
		// keeps the descriptor open.
		if err := l.rc.Control(l.pollFn); err != nil {
			return 0, l.mapErr(err)
		}
		switch l.rerr {
		case nil:
			if n := l.deliver(fn); n > 0 || l.rn == 0 {
				return n, nil
			}
			// Every datagram was dropped (truncated, bad address): look
			// for more.
		case unix.EAGAIN, unix.EINTR:
			return 0, nil
		default:
			return 0, fmt.Errorf("udplink: recvmmsg: %w", l.rerr)
		}
	}
}

func (l *Link) pollRecv(fd uintptr) { l.recvmmsg(fd) }

// WaitReadable blocks in the poller until a datagram is queued on the
// socket (it looks with MSG_PEEK, so it takes nothing), ctx ends or the
// link is closed. It does not hold the receive state, so PollBatch may run
// meanwhile. A context that can end is honoured as in ReadBatch, by the
// same read-deadline interrupt: do not wait with such contexts in
// ReadBatch and WaitReadable at the same time.
func (l *Link) WaitReadable(ctx context.Context) error {
	if l.closed.Load() {
		return link.ErrClosed
	}
	// A stale interrupt returns nil too: the caller looks again.
	_, err := l.readCtx(ctx, peekReadable)
	return err
}

// peekReadable reports whether a datagram is queued on fd (or the socket
// has an error to report), without taking it; false makes the runtime
// poller wait for the socket to become readable.
func peekReadable(fd uintptr) bool {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, 0, 0, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e != unix.EAGAIN
}

// SleepReadable blocks the calling thread in poll(2) until a datagram is
// queued on the socket or the link is closed (ErrClosed); like
// WaitReadable it takes nothing, and it may return early (a signal), so
// the caller looks again.
//
// Why not the runtime poller: a goroutine parked there is made runnable
// only when some thread polls the network, which the scheduler does only
// when it has no other goroutine to run, or sysmon does every 10 ms. With
// every P busy with goroutines that yield (pollers spinning on their CQs
// with runtime.Gosched), nobody polls, and a receive goroutine parked in
// WaitReadable wakes up to 10 ms late. A thread blocked in the kernel
// wakes when the datagram arrives, and its goroutine lands on the run
// queue those yielding goroutines pass through. The cost is one thread
// per waiting receiver.
func (l *Link) SleepReadable() error {
	l.sleepMu.Lock()
	if l.closed.Load() {
		l.sleepMu.Unlock()
		return link.ErrClosed
	}
	if l.wakeFd < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			l.sleepMu.Unlock()
			return fmt.Errorf("udplink: eventfd: %w", err)
		}
		l.wakeFd = fd
	}
	l.sleepers++
	l.sleepMu.Unlock()
	err := l.rc.Control(l.sleepFn)
	l.sleepMu.Lock()
	l.sleepers--
	if l.closed.Load() && l.sleepers == 0 && l.wakeFd >= 0 {
		unix.Close(l.wakeFd)
		l.wakeFd = -1
	}
	l.sleepMu.Unlock()
	if err != nil {
		return l.mapErr(err)
	}
	if l.closed.Load() {
		return link.ErrClosed
	}
	return nil
}

// sleepPoll is SleepReadable's poll(2) on the socket and the wake-up
// eventfd; it runs inside rc.Control, which keeps the socket open.
func (l *Link) sleepPoll(fd uintptr) {
	var fds [2]unix.PollFd
	fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	fds[1] = unix.PollFd{Fd: int32(l.wakeFd), Events: unix.POLLIN}
	// An interrupted poll (EINTR) returns as a wake-up: the caller looks.
	unix.Syscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), 2, 0, 0, 0, 0)
}

// wakeSleepers ends the polls of SleepReadable when the link closes.
func (l *Link) wakeSleepers() {
	l.sleepMu.Lock()
	defer l.sleepMu.Unlock()
	if l.wakeFd < 0 {
		return
	}
	if l.sleepers == 0 {
		unix.Close(l.wakeFd)
		l.wakeFd = -1
		return
	}
	var one = [8]byte{1}
	unix.Write(l.wakeFd, one[:])
}
