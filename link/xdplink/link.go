package xdplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/linkerr"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/xdp"
)

var (
	_ link.Link       = (*Link)(nil)
	_ link.Poller     = (*Link)(nil)
	_ link.TxLender   = (*Link)(nil)
	_ link.AddrFilter = (*Link)(nil)
)

// ErrClosed is returned by a closed Link.
var ErrClosed = link.ErrClosed

// Options configures Open.
type Options struct {
	// Queue is the receive queue to take over.
	Queue int
	// Queues, if not empty, lists several receive queues to take over
	// (one AF_XDP socket each; Queue is ignored). The link sends on the
	// first; each queue's view (RxQueues) sends on its own.
	Queues []int
	// FrameSize is the UMEM chunk size, 2048 or 4096 (0: 4096).
	FrameSize int
	// NumFrames is the number of UMEM chunks per queue (0: 4096).
	NumFrames int
	// Headroom is reserved in front of received frames.
	Headroom int
	// Mode selects zero-copy or copy mode (default: try zero-copy).
	Mode xdp.Mode
	// Multibuffer lets frames span several chunks (Linux 6.6), needed when
	// frames are larger than a chunk, e.g. 4096-MTU RoCE frames.
	Multibuffer bool
	// Port is the UDP destination port steered to the socket (0: 4791).
	Port uint16
	// Batch is the most descriptors taken per queue and ReadBatch (0: 64).
	Batch int
	// Attach selects driver or generic XDP (default: driver, then generic).
	Attach bpf.AttachMode
	// BusyPoll, if positive, turns on preferred busy polling on every
	// socket (xdp.Socket.SetBusyPoll, Linux 5.11) for this long per system
	// call, and PollBatch then busy-polls the device when the rings are
	// empty. Where the kernel lacks it, the link works without it and
	// BusyPolling reports why.
	BusyPoll time.Duration
	// BusyPollBudget is the most frames one busy poll handles (0: 64).
	BusyPollBudget int
}

// ErrTxBusy is returned by WriteBatch (inside a link.FrameError) when the
// transmit queue stayed full.
var ErrTxBusy = errors.New("xdplink: transmit queue stayed full")

// txWait bounds how long WriteBatch waits for transmit space.
const txWait = 100 * time.Millisecond

// rxQueue is the receive state of one socket.
type rxQueue struct {
	// mu guards the rest: the link's reads hold every queue's, a read
	// through the queue's own view (queues.go) only its own.
	mu      sync.Mutex
	sock    *xdp.Socket
	descs   []xdp.Desc
	n       int    // descriptors taken in the current batch
	scratch []byte // assembly space for multi-buffer frames
	view    *queueLink
}

// txQueue is the transmit state of one socket: its TX and completion
// rings and TX chunks are the socket's own (each socket has a UMEM of its
// own), so writes through different queues share no lock, ring or chunk.
type txQueue struct {
	// mu guards the socket's transmit side and loans: the link's writes
	// take the first queue's, a write through a queue's view its own.
	mu       sync.Mutex
	sock     *xdp.Socket
	loans    int           // lent TX spans not yet back
	loanBack *sync.Cond    // on mu: the last loan came back
	sent     atomic.Uint64 // frames queued (Stats)
	unsent   atomic.Uint64 // writes that left frames untaken (Stats.Unsent)
	_        [64]byte      // the next queue's lock on another cache line
}

// Link is a link.Link over AF_XDP sockets.
type Link struct {
	socks  []*xdp.Socket
	sock   *xdp.Socket // the link's transmitting socket, socks[0]
	prog   *bpf.Program
	att    *bpf.Attachment
	ifname string
	mtu    int
	mac    net.HardwareAddr

	closed  atomic.Bool
	closeMu sync.Mutex
	efdMu   sync.RWMutex
	efd     int // eventfd that wakes a blocked ReadBatch

	busyPoll    bool  // every socket busy-polls
	busyPollErr error // why Options.BusyPoll is not in effect

	rxMu   sync.Mutex
	rx     []*rxQueue
	pfds   []unix.PollFd // one per socket, then the eventfd
	frames [][]byte

	tx []*txQueue // one per socket; the link's own writes use the first

	waitMu sync.Mutex    // serializes WaitReadable, which owns wpfds
	wpfds  []unix.PollFd // WaitReadable's copy of pfds
}

// Open takes over receive queue(s) of ifname: it loads the steering
// program, opens an AF_XDP socket per queue, registers them and attaches
// the program. It must run on a thread in the interface's network
// namespace; the Link may then be used from anywhere.
func Open(ifname string, opts Options) (_ *Link, err error) {
	if opts.Batch == 0 {
		opts.Batch = 64
	}
	if opts.Batch < 1 || opts.Batch > 4096 {
		return nil, fmt.Errorf("%w: batch %d", xdp.ErrBadConfig, opts.Batch)
	}
	if opts.Multibuffer && opts.Batch < 2*xdp.MaxSegments {
		// A frame of up to 18 descriptors must fit one Receive.
		opts.Batch = 2 * xdp.MaxSegments
	}
	queues := opts.Queues
	if len(queues) == 0 {
		queues = []int{opts.Queue}
	}
	maxq := 0
	for i, q := range queues {
		for _, p := range queues[:i] {
			if p == q {
				return nil, fmt.Errorf("%w: queue %d listed twice", xdp.ErrBadConfig, q)
			}
		}
		maxq = max(maxq, q)
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("xdplink: %w: %q", xdp.ErrNoSuchInterface, ifname)
	}
	l := &Link{ifname: ifname, mtu: ifi.MTU, mac: ifi.HardwareAddr, efd: -1}
	defer func() {
		if err != nil {
			l.free()
		}
	}()
	for _, q := range queues {
		s, err := xdp.Open(ifname, q, xdp.Config{
			UMEMConfig:  xdp.UMEMConfig{FrameSize: opts.FrameSize, NumFrames: opts.NumFrames, Headroom: opts.Headroom},
			Mode:        opts.Mode,
			Multibuffer: opts.Multibuffer,
		})
		if err != nil {
			return nil, err
		}
		l.socks = append(l.socks, s)
	}
	l.sock = l.socks[0]
	l.prog, err = bpf.Load(bpf.Options{Port: opts.Port, Queues: maxq + 1, Frags: opts.Multibuffer})
	if err != nil {
		return nil, fmt.Errorf("xdplink: loading steering program: %w", err)
	}
	for i, q := range queues {
		if err := l.prog.Register(q, l.socks[i].FD()); err != nil {
			return nil, fmt.Errorf("xdplink: registering socket of queue %d: %w", q, err)
		}
	}
	l.att, err = l.prog.Attach(ifi.Index, opts.Attach)
	if err != nil {
		return nil, fmt.Errorf("xdplink: attaching to %s: %w", ifname, err)
	}
	if opts.BusyPoll > 0 {
		l.busyPoll = true
		for _, s := range l.socks {
			if err := s.SetBusyPoll(opts.BusyPoll, opts.BusyPollBudget); err != nil {
				if !errors.Is(err, xdp.ErrNotSupported) {
					return nil, fmt.Errorf("xdplink: %w", err)
				}
				l.busyPoll, l.busyPollErr = false, err
				break
			}
		}
	}
	l.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("xdplink: eventfd: %w", err)
	}
	for _, s := range l.socks {
		q := &rxQueue{sock: s, descs: make([]xdp.Desc, opts.Batch)}
		if s.Multibuffer() {
			q.scratch = make([]byte, opts.Batch*s.RxChunkCapacity())
		}
		t := &txQueue{sock: s}
		t.loanBack = sync.NewCond(&t.mu)
		q.view = newQueueLink(l, q, t, opts.Batch)
		l.rx = append(l.rx, q)
		l.tx = append(l.tx, t)
		l.pfds = append(l.pfds, unix.PollFd{Fd: int32(s.FD()), Events: unix.POLLIN})
	}
	l.pfds = append(l.pfds, unix.PollFd{Fd: int32(l.efd), Events: unix.POLLIN})
	l.wpfds = append([]unix.PollFd(nil), l.pfds...)
	l.frames = make([][]byte, opts.Batch*len(l.socks))
	return l, nil
}

// free releases whatever Open acquired.
func (l *Link) free() error {
	var errs []error
	if l.att != nil {
		errs = append(errs, l.att.Close())
	}
	if l.prog != nil {
		errs = append(errs, l.prog.Close())
	}
	for _, s := range l.socks {
		errs = append(errs, s.Close())
	}
	l.efdMu.Lock()
	if l.efd >= 0 {
		errs = append(errs, unix.Close(l.efd))
		l.efd = -1
	}
	l.efdMu.Unlock()
	return errors.Join(errs...)
}

// Close detaches the program and frees the socket and its memory. A blocked
// ReadBatch returns ErrClosed. Closing twice returns ErrClosed. Buffers
// lent by LendTx live in that memory: Close waits until they are back.
func (l *Link) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed.Swap(true) {
		return ErrClosed
	}
	l.wake()
	l.rxMu.Lock()
	l.waitMu.Lock()
	for _, q := range l.rx {
		// Readers of the queues' views are out, and stay out.
		q.mu.Lock()
		q.view.waitMu.Lock()
		defer q.mu.Unlock()
		defer q.view.waitMu.Unlock()
	}
	defer l.rxMu.Unlock()
	defer l.waitMu.Unlock()
	for _, t := range l.tx {
		// Writers are out, and lent spans back: they live in the UMEM.
		t.mu.Lock()
		defer t.mu.Unlock()
		for t.loans > 0 {
			t.loanBack.Wait()
		}
	}
	return l.free()
}

var one = uint64(1)

// wake makes a ReadBatch blocked in poll return. A context's wake can run
// late, so it must never write to a descriptor number Close gave back.
func (l *Link) wake() {
	l.efdMu.RLock()
	if l.efd >= 0 {
		unix.Write(l.efd, (*[8]byte)(unsafe.Pointer(&one))[:])
	}
	l.efdMu.RUnlock()
}

// ReadBatch waits for frames and hands up to Options.Batch of them per queue
// to fn. The frames are valid only during fn, which must not call Close.
// One goroutine reads at a time; WriteBatch may run concurrently.
func (l *Link) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, ErrClosed
		}
		if k, took := l.receive(fn); k > 0 {
			return k, nil
		} else if took {
			continue
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := l.wait(ctx); err != nil {
			return 0, err
		}
	}
}

// PollBatch hands fn the frames already in the RX rings, up to
// Options.Batch per queue, without waiting: it returns 0 when the rings are
// empty or another goroutine is reading (a ReadBatch blocked in poll(2)
// included). The frames are valid only during fn.
func (l *Link) PollBatch(fn func(frames [][]byte)) (int, error) {
	if !l.rxMu.TryLock() {
		if l.closed.Load() {
			return 0, ErrClosed
		}
		return 0, nil
	}
	defer l.rxMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, ErrClosed
		}
		k, took := l.receive(fn)
		if !took && l.busyPoll {
			// Empty rings: let the kernel run the device's poll in this
			// thread, then look once more.
			for _, q := range l.rx {
				q.sock.BusyPoll()
			}
			k, took = l.receive(fn)
		}
		if k > 0 || !took {
			return k, nil
		}
		// Only unusable descriptors were taken: look again.
	}
}

// receive takes what the RX rings hold, hands the frames to fn and gives
// the chunks back to the fill rings. It reports how many frames fn got and
// whether any descriptor was taken. Called with rxMu held.
func (l *Link) receive(fn func(frames [][]byte)) (k int, took bool) {
	for _, q := range l.rx {
		q.mu.Lock()
	}
	defer l.unlockQueues() // not deferred in the loop: that allocates
	for _, q := range l.rx {
		q.n = q.sock.Receive(q.descs)
		if q.n > 0 {
			took = true
			k = q.collect(l.frames, k)
		}
	}
	if !took {
		return 0, false
	}
	if k > 0 {
		fn(l.frames[:k])
	}
	for _, q := range l.rx {
		if q.n > 0 {
			q.sock.Release(q.descs[:q.n])
			q.n = 0
		}
	}
	clear(l.frames[:k])
	return k, true
}

func (l *Link) unlockQueues() {
	for _, q := range l.rx {
		q.mu.Unlock()
	}
}

// collect appends the frames of q's n descriptors to frames[k:]: single-chunk
// frames as UMEM views, multi-buffer frames assembled in scratch.
func (q *rxQueue) collect(frames [][]byte, k int) int {
	off := 0
	for i := 0; i < q.n; {
		d := q.descs[i]
		if !d.More() {
			if f := q.sock.Frame(d); f != nil {
				frames[k] = f
				k++
			}
			i++
			continue
		}
		fl, used, err := q.sock.CopyFrame(q.scratch[off:], q.descs[i:q.n])
		if used == 0 {
			used = 1
		}
		if err == nil {
			frames[k] = q.scratch[off : off+fl : off+fl]
			k++
			off += fl
		}
		i += used
	}
	return k
}

// WaitReadable blocks in poll(2) until an RX ring holds frames, the link is
// closed or ctx is done. It takes nothing and does not hold the receive
// state, so PollBatch may run meanwhile.
func (l *Link) WaitReadable(ctx context.Context) error {
	l.waitMu.Lock()
	defer l.waitMu.Unlock()
	if l.closed.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Frames already queued need no system call to be found.
	for _, q := range l.rx {
		if q.sock.RxReady() {
			return nil
		}
	}
	return l.pollWait(ctx, l.wpfds)
}

// wait blocks in poll(2) until a socket is readable, the link is closed or
// ctx is done.
func (l *Link) wait(ctx context.Context) error {
	return l.pollWait(ctx, l.pfds)
}

func (l *Link) pollWait(ctx context.Context, pfds []unix.PollFd) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, l.wake)
		defer stop()
	}
	ev := &pfds[len(pfds)-1]
	for {
		for i := range pfds {
			pfds[i].Revents = 0
		}
		_, err := unix.Poll(pfds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("xdplink: poll: %w", err)
		}
		// A closed link keeps its wake-up pending, so that ReadBatch and
		// WaitReadable both return.
		if l.closed.Load() {
			return ErrClosed
		}
		if ev.Revents != 0 {
			var b [8]byte
			unix.Read(l.efd, b[:])
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return nil
	}
}

// WriteBatch copies frames into the UMEM and queues them for transmission
// on the first queue's socket. A frame that cannot be sent stops the batch
// with a *link.FrameError; a device that cannot send (ENETDOWN) gives a
// plain error.
func (l *Link) WriteBatch(frames [][]byte) (int, error) { return l.writeBatch(l.tx[0], frames) }

// writeBatch is WriteBatch on t's socket.
func (l *Link) writeBatch(t *txQueue, frames [][]byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.closed.Load() {
		return 0, ErrClosed
	}
	// Frames the device would drop are refused up front: shorter than an
	// Ethernet header, or longer than the MTU allows (with one VLAN tag).
	end, bad := len(frames), error(nil)
	for i, f := range frames {
		if len(f) < ethHeaderLen {
			end, bad = i, linkerr.Truncated
			break
		}
		if len(f) > l.mtu+ethHeaderLen+vlanTagLen {
			end, bad = i, link.ErrTooLarge
			break
		}
	}
	sent, err := t.write(frames[:end])
	t.sent.Add(uint64(sent))
	switch {
	case err == nil:
	case errors.Is(err, xdp.ErrFrameTooLarge):
		return sent, &link.FrameError{Index: sent, Err: fmt.Errorf("%w: %w", link.ErrTooLarge, err)}
	case errors.Is(err, xdp.ErrEmptyFrame), errors.Is(err, ErrTxBusy):
		return sent, &link.FrameError{Index: sent, Err: err}
	default:
		// The device refused to send (e.g. ENETDOWN): not one frame's
		// fault. Frames counted in sent are queued and go out once the
		// device can send.
		return sent, err
	}
	if bad != nil {
		return sent, &link.FrameError{Index: sent, Err: bad}
	}
	return sent, nil
}

const (
	ethHeaderLen = 14
	vlanTagLen   = 4
)

// write queues frames on t's socket, waiting a little when its TX ring or
// chunks run out. Called with t.mu held.
func (t *txQueue) write(frames [][]byte) (int, error) {
	sent := 0
	var deadline time.Time
	for sent < len(frames) {
		n, err := t.sock.Transmit(frames[sent:])
		sent += n
		if err != nil {
			return sent, err
		}
		if sent == len(frames) || n > 0 {
			continue
		}
		// Out of chunks or ring slots: collect completions, then wait a
		// little for the kernel to finish earlier frames.
		if free, err := t.sock.Complete(); err != nil {
			return sent, err
		} else if free > 0 {
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(txWait)
		} else if time.Now().After(deadline) {
			return sent, ErrTxBusy
		}
		t.sock.Poll(unix.POLLOUT, 1)
	}
	return sent, t.handOver(deadline)
}

// handOver kicks the kernel until it has taken every descriptor queued on
// t's socket that waits for a kick (a driver that polls the TX ring takes
// them by itself), for up to txWait from deadline's start (now if unset). In
// copy mode a kick takes a limited batch, and the kernel answers EAGAIN
// while the device cannot take more (its queue stopped); the socket's
// bounded kicks can end with descriptors still in the ring, and nothing
// would kick them again before the next write, which a writer waiting for
// the answer to these frames never makes. Past the wait they stay queued
// for the next kick. Called with t.mu held.
func (t *txQueue) handOver(deadline time.Time) error {
	for t.sock.TxNeedsKick() {
		if _, err := t.sock.Complete(); err != nil {
			return err
		}
		if !t.sock.TxNeedsKick() {
			return nil
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(txWait)
		} else if time.Now().After(deadline) {
			t.unsent.Add(1)
			return nil
		}
		time.Sleep(handOverPause)
	}
	return nil
}

// handOverPause is handOver's pause between rounds of kicks, for the
// device to drain.
const handOverPause = 20 * time.Microsecond

// MTU returns the interface's IP MTU.
func (l *Link) MTU() int { return l.mtu }

// HardwareAddr returns the interface's MAC address.
func (l *Link) HardwareAddr() net.HardwareAddr { return l.mac }

// Info describes the link: frames are exactly what was on the wire.
func (l *Link) Info() link.Info { return link.Info{Kind: link.KindAFXDP, Name: l.ifname} }

// BusyPolling reports whether the sockets busy-poll (Options.BusyPoll),
// and if it was asked for but is not in effect, why.
func (l *Link) BusyPolling() (bool, error) { return l.busyPoll, l.busyPollErr }

// Socket returns the AF_XDP socket the link itself transmits on (the
// first queue's), for statistics.
func (l *Link) Socket() *xdp.Socket { return l.sock }

// Sockets returns the AF_XDP sockets, one per queue in Options order.
func (l *Link) Sockets() []*xdp.Socket { return l.socks }

// Stats counts what the link's sockets carried.
type Stats struct {
	// QueueSent counts the frames each queue's socket queued for
	// transmission (WriteBatch and WriteLent, of the link or of the
	// queue's view), in Options order.
	QueueSent []uint64
	// Unsent counts writes that returned with frames the kernel had not
	// taken from the TX ring after txWait of kicks (a device that kept
	// refusing them); those frames leave with a later kick.
	Unsent uint64
}

// Stats returns the link's counters; safe while frames are sent.
func (l *Link) Stats() Stats {
	s := Stats{QueueSent: make([]uint64, len(l.tx))}
	for i, t := range l.tx {
		s.QueueSent[i] = t.sent.Load()
		s.Unsent += t.unsent.Load()
	}
	return s
}

// SteeringStats returns the steering program's counters.
func (l *Link) SteeringStats() (bpf.Stats, error) {
	if l.closed.Load() {
		return bpf.Stats{}, ErrClosed
	}
	return l.prog.Stats()
}

// SetLocalAddrs makes the steering program take only frames addressed to
// addrs (link.AddrFilter); frames to the interface's other addresses go to
// the kernel, where another RoCE stack may serve them.
func (l *Link) SetLocalAddrs(addrs []netip.Addr) error {
	if l.closed.Load() {
		return ErrClosed
	}
	return l.prog.SetLocalAddrs(addrs)
}

// AttachMode returns how the steering program is attached.
func (l *Link) AttachMode() bpf.AttachMode { return l.att.Mode() }

// LendTx lends spans of adjacent TX chunks of the transmitting socket's
// UMEM (the first queue's), enough chunks for size bytes (more than one
// needs Options.Multibuffer), so that the device builds its frames where
// they are sent from (link.TxLender). It returns 0 when size needs more
// chunks than a frame may span or none are free. Spans lent by the link go
// back through the link, those of a queue's view through that view.
func (l *Link) LendTx(bufs [][]byte, size int) int { return l.lendTx(l.tx[0], bufs, size) }

// lendTx is LendTx on t's socket.
func (l *Link) lendTx(t *txQueue, bufs [][]byte, size int) int {
	fs := t.sock.FrameSize()
	k := (size + fs - 1) / fs
	if size <= 0 || k > xdp.MaxSegments || (k > 1 && !t.sock.Multibuffer()) {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.closed.Load() {
		return 0
	}
	n := 0
	for n < len(bufs) {
		b := t.sock.AllocTxSpan(k)
		if b == nil {
			if n > 0 {
				break
			}
			// Every chunk is queued or in flight: have the kernel take
			// what is queued, once, and collect its completions.
			if free, err := t.sock.Complete(); err != nil || free < k {
				break
			}
			if b = t.sock.AllocTxSpan(k); b == nil {
				break
			}
		}
		bufs[n] = b
		n++
	}
	t.loans += n
	return n
}

// endLoans counts n lent spans back. Called with mu held.
func (t *txQueue) endLoans(n int) {
	t.loans -= n
	if t.loans <= 0 {
		t.loans = 0
		t.loanBack.Broadcast()
	}
}

// ReturnTx takes back lent spans unused.
func (l *Link) ReturnTx(bufs [][]byte) { l.tx[0].returnTx(bufs) }

// returnTx gives spans lent by t's socket back to it.
func (t *txQueue) returnTx(bufs [][]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range bufs {
		t.sock.FreeTxSpan(b)
	}
	t.endLoans(len(bufs))
}

// WriteLent queues frames built in spans from LendTx and takes every span
// back. A frame the device would drop (see WriteBatch) or the socket
// refuses is skipped, its span freed, and reported as the first error in a
// *link.FrameError; the others are sent.
func (l *Link) WriteLent(bufs, frames [][]byte) (int, error) {
	return l.writeLent(l.tx[0], bufs, frames)
}

// writeLent is WriteLent on t's socket.
func (l *Link) writeLent(t *txQueue, bufs, frames [][]byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.endLoans(len(bufs))
	if len(frames) > len(bufs) {
		frames = frames[:len(bufs)]
	}
	var first error
	note := func(i int, err error) {
		if first == nil {
			first = &link.FrameError{Index: i, Err: err}
		}
	}
	sent := 0
	for i := 0; i < len(frames); {
		if l.closed.Load() {
			for _, b := range bufs[i:] {
				t.sock.FreeTxSpan(b)
			}
			return sent, ErrClosed
		}
		// The run of frames the device would take goes in one call.
		j := i
		for ; j < len(frames); j++ {
			if f := frames[j]; len(f) < ethHeaderLen || len(f) > l.mtu+ethHeaderLen+vlanTagLen {
				break
			}
		}
		n, err := t.submitLent(bufs[i:j], frames[i:j])
		sent += n
		t.sent.Add(uint64(n))
		i += n
		switch {
		case err == nil && i < j:
			// Cannot happen: submitLent queues everything or errs.
			continue
		case err == nil:
			if j < len(frames) {
				var bad error = linkerr.Truncated
				if len(frames[j]) >= ethHeaderLen {
					bad = link.ErrTooLarge
				}
				note(j, bad)
				t.sock.FreeTxSpan(bufs[j])
				i = j + 1
			}
		case errors.Is(err, ErrTxBusy):
			// The ring stayed full: the rest waits no longer.
			note(i, err)
			for _, b := range bufs[i:] {
				t.sock.FreeTxSpan(b)
			}
			return sent, first
		case errors.Is(err, xdp.ErrBadSpan), errors.Is(err, xdp.ErrEmptyFrame):
			note(i, err)
			t.sock.FreeTxSpan(bufs[i])
			i++
		case errors.Is(err, xdp.ErrFrameTooLarge):
			note(i, fmt.Errorf("%w: %w", link.ErrTooLarge, err))
			t.sock.FreeTxSpan(bufs[i])
			i++
		default:
			// The device refused to send (e.g. ENETDOWN); what was
			// queued goes out once it can.
			for _, b := range bufs[i:] {
				t.sock.FreeTxSpan(b)
			}
			return sent, err
		}
	}
	return sent, first
}

// submitLent queues all of frames, waiting as write does when the TX ring
// is full. It returns how many it queued and why it stopped short.
func (t *txQueue) submitLent(bufs, frames [][]byte) (int, error) {
	sent := 0
	var deadline time.Time
	for sent < len(frames) {
		n, err := t.sock.SubmitTxSpans(bufs[sent:], frames[sent:])
		sent += n
		if err != nil {
			return sent, err
		}
		if sent == len(frames) || n > 0 {
			continue
		}
		if _, err := t.sock.Complete(); err != nil {
			return sent, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(txWait)
		} else if time.Now().After(deadline) {
			return sent, ErrTxBusy
		}
		t.sock.Poll(unix.POLLOUT, 1)
	}
	return sent, t.handOver(deadline)
}
