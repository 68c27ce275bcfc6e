package memlink

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/goroce/goroce/internal/linkerr"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
)

// Options configure a pair. The zero value is a perfect real-time pair
// with MTU 1500.
type Options struct {
	AtoB, BtoA faultnet.Config // impairments of each direction
	// MTU is the IP MTU of both ends (default 1500); WriteBatch refuses
	// frames longer than MTU plus an Ethernet header and one VLAN tag.
	MTU int
	// MaxBatch caps the frames handed to one ReadBatch callback (default 64).
	MaxBatch int
	// Clock, if set, makes the pair stepped: time moves only when the
	// caller advances it.
	Clock *ManualClock
	// HardwareAddrA and HardwareAddrB default to 02:00:00:00:00:0a and :0b.
	HardwareAddrA, HardwareAddrB net.HardwareAddr
}

const (
	defaultMTU      = 1500
	defaultMaxBatch = 64
)

// queue is one direction: a pipe and the means to wake its reader.
type queue struct {
	mu     sync.Mutex
	pipe   *faultnet.Pipe
	notify chan struct{} // capacity 1: a frame was pushed or time moved
}

// Link is one end of a pair.
type Link struct {
	name   string
	mac    net.HardwareAddr
	mtu    int
	batch  int
	clock  clock
	rx, tx *queue
	// writes and written count WriteBatch calls that took frames and the
	// frames they took, under tx.mu (Writes).
	writes, written uint64

	readMu sync.Mutex // serializes readers, which share timer and taken
	timer  *time.Timer
	taken  [][]byte

	waitMu    sync.Mutex // serializes WaitReadable, which owns waitTimer
	waitTimer *time.Timer

	closeOnce  sync.Once
	closed     chan struct{}
	peerClosed chan struct{}
}

var (
	_ link.Link   = (*Link)(nil)
	_ link.Poller = (*Link)(nil)
)

// Pair returns two connected ends: frames written on a are read on b
// through a pipe configured by cfgAtoB, and the reverse through cfgBtoA.
// The pair runs in real time.
func Pair(cfgAtoB, cfgBtoA faultnet.Config) (a, b *Link) {
	return PairWithOptions(Options{AtoB: cfgAtoB, BtoA: cfgBtoA})
}

// PairWithOptions returns two connected ends configured by opts.
func PairWithOptions(opts Options) (a, b *Link) {
	if opts.MTU <= 0 {
		opts.MTU = defaultMTU
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	if opts.HardwareAddrA == nil {
		opts.HardwareAddrA = net.HardwareAddr{2, 0, 0, 0, 0, 0x0a}
	}
	if opts.HardwareAddrB == nil {
		opts.HardwareAddrB = net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}
	}
	clk := clock{start: time.Now(), manual: opts.Clock}
	ab := &queue{pipe: faultnet.New(opts.AtoB), notify: make(chan struct{}, 1)}
	ba := &queue{pipe: faultnet.New(opts.BtoA), notify: make(chan struct{}, 1)}
	if opts.Clock != nil {
		opts.Clock.subscribe(ab.notify)
		opts.Clock.subscribe(ba.notify)
	}
	mk := func(name string, mac net.HardwareAddr, rx, tx *queue) *Link {
		t := time.NewTimer(time.Hour)
		t.Stop()
		wt := time.NewTimer(time.Hour)
		wt.Stop()
		return &Link{
			name: name, mac: mac, mtu: opts.MTU, batch: opts.MaxBatch, clock: clk,
			rx: rx, tx: tx, timer: t, taken: make([][]byte, 0, opts.MaxBatch),
			waitTimer: wt, closed: make(chan struct{}),
		}
	}
	a, b = mk("mem-a", opts.HardwareAddrA, ba, ab), mk("mem-b", opts.HardwareAddrB, ab, ba)
	a.peerClosed, b.peerClosed = b.closed, a.closed
	return a, b
}

// ReadBatch waits until at least one frame is due, then calls fn with up
// to MaxBatch of them. The frames are valid only during fn, which may write
// on either end. Concurrent calls are serialized.
func (l *Link) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	for {
		select {
		case <-l.closed:
			return 0, link.ErrClosed
		default:
		}
		q := l.rx
		q.mu.Lock()
		now := l.clock.now()
		l.taken = q.pipe.Take(now, l.batch, l.taken[:0])
		due, pending := q.pipe.NextDue()
		q.mu.Unlock()
		if n := len(l.taken); n > 0 {
			// Deliver without the lock so fn may write on either end.
			fn(l.taken)
			q.mu.Lock()
			q.pipe.Release(l.taken)
			q.mu.Unlock()
			return n, nil
		}
		var timerC <-chan time.Time
		if pending && l.clock.manual == nil {
			l.timer.Reset(due - now)
			timerC = l.timer.C
		}
		select {
		case <-ctx.Done():
			l.timer.Stop()
			return 0, ctx.Err()
		case <-l.closed:
			l.timer.Stop()
			return 0, link.ErrClosed
		case <-q.notify:
		case <-timerC:
		}
		l.timer.Stop()
	}
}

// PollBatch calls fn with up to MaxBatch frames that are due now and
// returns how many, without waiting: 0 when none is due or another
// goroutine is reading (a ReadBatch waiting for frames included).
func (l *Link) PollBatch(fn func(frames [][]byte)) (int, error) {
	if !l.readMu.TryLock() {
		select {
		case <-l.closed:
			return 0, link.ErrClosed
		default:
			return 0, nil
		}
	}
	defer l.readMu.Unlock()
	select {
	case <-l.closed:
		return 0, link.ErrClosed
	default:
	}
	q := l.rx
	q.mu.Lock()
	l.taken = q.pipe.Take(l.clock.now(), l.batch, l.taken[:0])
	q.mu.Unlock()
	n := len(l.taken)
	if n == 0 {
		return 0, nil
	}
	fn(l.taken)
	q.mu.Lock()
	q.pipe.Release(l.taken)
	q.mu.Unlock()
	return n, nil
}

// WaitReadable blocks until a frame is due, ctx ends or the link closes.
// It takes nothing, so PollBatch may run meanwhile; it may return after
// another reader took the frames that woke it.
func (l *Link) WaitReadable(ctx context.Context) error {
	l.waitMu.Lock()
	defer l.waitMu.Unlock()
	q := l.rx
	for {
		select {
		case <-l.closed:
			return link.ErrClosed
		default:
		}
		q.mu.Lock()
		now := l.clock.now()
		due, pending := q.pipe.NextDue()
		q.mu.Unlock()
		if pending && due <= now {
			return nil
		}
		var timerC <-chan time.Time
		if pending && l.clock.manual == nil {
			l.waitTimer.Reset(due - now)
			timerC = l.waitTimer.C
		}
		select {
		case <-ctx.Done():
			l.waitTimer.Stop()
			return ctx.Err()
		case <-l.closed:
			l.waitTimer.Stop()
			return link.ErrClosed
		case <-q.notify:
		case <-timerC:
		}
		l.waitTimer.Stop()
	}
}

// WriteBatch pushes frames into the pipe towards the peer. Frames shorter
// than an Ethernet header or longer than the MTU allows are refused with a
// FrameError; the frames before it are sent.
func (l *Link) WriteBatch(frames [][]byte) (int, error) {
	select {
	case <-l.closed:
		return 0, link.ErrClosed
	default:
	}
	peerGone := false
	select {
	case <-l.peerClosed:
		peerGone = true // accept and drop, like a wire to a dead host
	default:
	}
	maxLen := l.mtu + link.EthernetSize + link.VLANTagSize
	q := l.tx
	q.mu.Lock()
	now := l.clock.now()
	n := 0
	var err error
	for i, f := range frames {
		if len(f) < link.EthernetSize {
			err = &link.FrameError{Index: i, Err: linkerr.Truncated}
			break
		}
		if len(f) > maxLen {
			err = &link.FrameError{Index: i, Err: link.ErrTooLarge}
			break
		}
		if !peerGone {
			q.pipe.Push(now, f)
		}
		n++
	}
	if n > 0 {
		l.writes++
		l.written += uint64(n)
	}
	q.mu.Unlock()
	if n > 0 {
		notify(q.notify)
	}
	return n, err
}

// Writes returns how many WriteBatch calls took frames, and how many frames
// they took: what a transmit batches into one write (on AF_XDP, one sendto).
func (l *Link) Writes() (writes, frames uint64) {
	l.tx.mu.Lock()
	defer l.tx.mu.Unlock()
	return l.writes, l.written
}

// NextDue reports when the next frame towards this end becomes readable,
// for stepping a ManualClock.
func (l *Link) NextDue() (time.Duration, bool) {
	l.rx.mu.Lock()
	defer l.rx.mu.Unlock()
	return l.rx.pipe.NextDue()
}

// TxStats returns the counters of the pipe this end writes into.
func (l *Link) TxStats() faultnet.Stats {
	l.tx.mu.Lock()
	defer l.tx.mu.Unlock()
	return l.tx.pipe.Stats()
}

// MTU returns the IP MTU.
func (l *Link) MTU() int { return l.mtu }

// HardwareAddr returns this end's MAC address.
func (l *Link) HardwareAddr() net.HardwareAddr { return l.mac }

// Info describes the link.
func (l *Link) Info() link.Info { return link.Info{Kind: link.KindMem, Name: l.name} }

// Close closes this end: its pending and future ReadBatch calls return
// ErrClosed, as do its writes and a second Close. Frames the peer sends
// afterwards are lost.
func (l *Link) Close() error {
	err := link.ErrClosed
	l.closeOnce.Do(func() { close(l.closed); err = nil })
	return err
}
