package udplink

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/sys"
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

func (l *Link) pollRecv(fd uintptr) {
	l.rn, l.rerr = sys.Recvmmsg(int(fd), l.rmsgs, unix.MSG_DONTWAIT)
	l.rdirty = max(l.rn, 0)
}

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
