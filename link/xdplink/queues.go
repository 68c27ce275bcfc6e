package xdplink

import (
	"context"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/link"
)

var (
	_ link.MultiQueue = (*Link)(nil)
	_ link.TxQueues   = (*Link)(nil)
	_ link.Poller     = (*queueLink)(nil)
	_ link.TxLender   = (*queueLink)(nil)
)

// RxQueues returns a view of each socket of the link, in the order of
// Options.Queues (link.MultiQueue): a device reads each from a goroutine of
// its own, and the NIC's flow steering (RSS over the UDP source port,
// which a device varies per QP) keeps every QP's packets on one queue.
// Read a link through its views or through its own ReadBatch and
// PollBatch, not both at once: the link's own reads wait for every queue.
func (l *Link) RxQueues() []link.Link {
	qs := make([]link.Link, len(l.rx))
	for i, q := range l.rx {
		qs[i] = q.view
	}
	return qs
}

// TxQueues returns the same views (link.TxQueues): each sends on its own
// socket, with its own TX ring, completion ring, chunks and lock, so that
// goroutines writing through different views never wait for each other.
// The link's own WriteBatch and LendTx send on the first queue's socket,
// as the first view does.
func (l *Link) TxQueues() []link.Link { return l.RxQueues() }

// queueLink reads and sends on one socket of a Link.
type queueLink struct {
	l      *Link
	q      *rxQueue
	t      *txQueue
	frames [][]byte
	pfds   []unix.PollFd // the socket and the link's eventfd
	waitMu sync.Mutex    // serializes WaitReadable, which owns pfds
}

func newQueueLink(l *Link, q *rxQueue, t *txQueue, batch int) *queueLink {
	return &queueLink{l: l, q: q, t: t, frames: make([][]byte, batch)}
}

// pollFds returns the descriptors to wait on, set up on first use (the
// link's eventfd exists only once its queues do). Called with waitMu held.
func (v *queueLink) pollFds() []unix.PollFd {
	if v.pfds == nil {
		v.pfds = []unix.PollFd{{Fd: int32(v.q.sock.FD()), Events: unix.POLLIN}, {Fd: int32(v.l.efd), Events: unix.POLLIN}}
	}
	return v.pfds
}

// ReadBatch waits for frames on this queue and hands up to Options.Batch
// of them to fn, valid only during fn.
func (v *queueLink) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	for {
		if k, err := v.PollBatch(fn); k > 0 || err != nil {
			return k, err
		}
		if err := v.WaitReadable(ctx); err != nil {
			return 0, err
		}
	}
}

// PollBatch hands fn the frames already in this queue's RX ring, without
// waiting; 0 when it is empty or another goroutine reads the queue.
func (v *queueLink) PollBatch(fn func(frames [][]byte)) (int, error) {
	q := v.q
	if !q.mu.TryLock() {
		if v.l.closed.Load() {
			return 0, ErrClosed
		}
		return 0, nil
	}
	defer q.mu.Unlock()
	for {
		if v.l.closed.Load() {
			return 0, ErrClosed
		}
		q.n = q.sock.Receive(q.descs)
		if q.n == 0 && v.l.busyPoll {
			q.sock.BusyPoll()
			q.n = q.sock.Receive(q.descs)
		}
		if q.n == 0 {
			return 0, nil
		}
		k := q.collect(v.frames, 0)
		if k > 0 {
			fn(v.frames[:k])
		}
		q.sock.Release(q.descs[:q.n])
		q.n = 0
		clear(v.frames[:k])
		if k > 0 {
			return k, nil
		}
		// Only unusable descriptors were taken: look again.
	}
}

// WaitReadable blocks in poll(2) until this queue's RX ring holds frames,
// the link is closed or ctx is done; it holds nothing PollBatch needs.
func (v *queueLink) WaitReadable(ctx context.Context) error {
	v.waitMu.Lock()
	defer v.waitMu.Unlock()
	if v.l.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if v.q.sock.RxReady() {
		return nil
	}
	return v.l.pollWait(ctx, v.pollFds())
}

// WriteBatch sends on this queue's socket, as Link.WriteBatch does on the
// first's.
func (v *queueLink) WriteBatch(frames [][]byte) (int, error) { return v.l.writeBatch(v.t, frames) }

// LendTx lends TX spans of this queue's socket (Link.LendTx); they go
// back through this view.
func (v *queueLink) LendTx(bufs [][]byte, size int) int { return v.l.lendTx(v.t, bufs, size) }

// WriteLent sends frames built in spans this view lent (Link.WriteLent).
func (v *queueLink) WriteLent(bufs, frames [][]byte) (int, error) {
	return v.l.writeLent(v.t, bufs, frames)
}

// ReturnTx takes back spans this view lent, unused.
func (v *queueLink) ReturnTx(bufs [][]byte) { v.t.returnTx(bufs) }

// MTU is the link's.
func (v *queueLink) MTU() int { return v.l.MTU() }

// HardwareAddr is the link's.
func (v *queueLink) HardwareAddr() net.HardwareAddr { return v.l.HardwareAddr() }

// Info is the link's.
func (v *queueLink) Info() link.Info { return v.l.Info() }

// Close does nothing: the link closes its queues.
func (v *queueLink) Close() error { return nil }
