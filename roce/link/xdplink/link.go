package xdplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/roce/link"
	"github.com/goroce/goroce/xdp"
)

var _ link.Link = (*Link)(nil)

// ErrClosed is returned by a closed Link.
var ErrClosed = link.ErrClosed

// Options configures Open.
type Options struct {
	// Queue is the receive queue to take over.
	Queue int
	// FrameSize is the UMEM chunk size, 2048 or 4096 (0: 4096).
	FrameSize int
	// NumFrames is the number of UMEM chunks (0: 4096).
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
	// Batch is the most descriptors taken per ReadBatch (0: 64).
	Batch int
	// Attach selects driver or generic XDP (default: driver, then generic).
	Attach bpf.AttachMode
}

// ErrTxBusy is returned by WriteBatch (inside a link.FrameError) when the
// transmit queue stayed full.
var ErrTxBusy = errors.New("xdplink: transmit queue stayed full")

// txWait bounds how long WriteBatch waits for transmit space.
const txWait = 100 * time.Millisecond

// Link is a link.Link over an AF_XDP socket.
type Link struct {
	sock   *xdp.Socket
	prog   *bpf.Program
	att    *bpf.Attachment
	ifname string
	mtu    int
	mac    net.HardwareAddr
	queue  int

	closed  atomic.Bool
	closeMu sync.Mutex
	efd     int // eventfd that wakes a blocked ReadBatch

	rxMu    sync.Mutex
	pfds    [2]unix.PollFd
	descs   []xdp.Desc
	frames  [][]byte
	scratch []byte // assembly space for multi-buffer frames

	txMu sync.Mutex
}

// Open takes over queue opts.Queue of ifname: it loads the steering program,
// opens the AF_XDP socket, registers it and attaches the program. It must
// run on a thread in the interface's network namespace; the Link may then be
// used from anywhere.
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
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("xdplink: %w: %q", xdp.ErrNoSuchInterface, ifname)
	}
	l := &Link{ifname: ifname, mtu: ifi.MTU, mac: ifi.HardwareAddr, queue: opts.Queue, efd: -1}
	defer func() {
		if err != nil {
			l.free()
		}
	}()
	l.sock, err = xdp.Open(ifname, opts.Queue, xdp.Config{
		UMEMConfig:  xdp.UMEMConfig{FrameSize: opts.FrameSize, NumFrames: opts.NumFrames, Headroom: opts.Headroom},
		Mode:        opts.Mode,
		Multibuffer: opts.Multibuffer,
	})
	if err != nil {
		return nil, err
	}
	l.prog, err = bpf.Load(bpf.Options{Port: opts.Port, Queues: opts.Queue + 1, Frags: opts.Multibuffer})
	if err != nil {
		return nil, fmt.Errorf("xdplink: loading steering program: %w", err)
	}
	if err := l.prog.Register(opts.Queue, l.sock.FD()); err != nil {
		return nil, fmt.Errorf("xdplink: registering socket: %w", err)
	}
	l.att, err = l.prog.Attach(ifi.Index, opts.Attach)
	if err != nil {
		return nil, fmt.Errorf("xdplink: attaching to %s: %w", ifname, err)
	}
	l.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("xdplink: eventfd: %w", err)
	}
	l.pfds[0] = unix.PollFd{Fd: int32(l.sock.FD()), Events: unix.POLLIN}
	l.pfds[1] = unix.PollFd{Fd: int32(l.efd), Events: unix.POLLIN}
	l.descs = make([]xdp.Desc, opts.Batch)
	l.frames = make([][]byte, opts.Batch)
	if l.sock.Multibuffer() {
		l.scratch = make([]byte, opts.Batch*l.sock.RxChunkCapacity())
	}
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
	if l.sock != nil {
		errs = append(errs, l.sock.Close())
	}
	if l.efd >= 0 {
		errs = append(errs, unix.Close(l.efd))
		l.efd = -1
	}
	return errors.Join(errs...)
}

// Close detaches the program and frees the socket and its memory. A blocked
// ReadBatch returns ErrClosed. Closing twice returns ErrClosed.
func (l *Link) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed.Swap(true) {
		return ErrClosed
	}
	l.wake()
	l.rxMu.Lock()
	l.txMu.Lock()
	defer l.rxMu.Unlock()
	defer l.txMu.Unlock()
	return l.free()
}

var one = uint64(1)

// wake makes a ReadBatch blocked in poll return.
func (l *Link) wake() {
	unix.Write(l.efd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// ReadBatch waits for frames and hands up to Options.Batch of them to fn.
// The frames are valid only during fn, which must not call Close. One
// goroutine reads at a time; WriteBatch may run concurrently.
func (l *Link) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, ErrClosed
		}
		if n := l.sock.Receive(l.descs); n > 0 {
			k := l.collect(n)
			if k > 0 {
				fn(l.frames[:k])
			}
			l.sock.Release(l.descs[:n])
			clear(l.frames[:k])
			if k > 0 {
				return k, nil
			}
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

// collect turns n descriptors into frames: single-chunk frames as UMEM
// views, multi-buffer frames assembled in scratch.
func (l *Link) collect(n int) int {
	k, off := 0, 0
	for i := 0; i < n; {
		d := l.descs[i]
		if !d.More() {
			if f := l.sock.Frame(d); f != nil {
				l.frames[k] = f
				k++
			}
			i++
			continue
		}
		fl, used, err := l.sock.CopyFrame(l.scratch[off:], l.descs[i:n])
		if used == 0 {
			used = 1
		}
		if err == nil {
			l.frames[k] = l.scratch[off : off+fl : off+fl]
			k++
			off += fl
		}
		i += used
	}
	return k
}

// wait blocks in poll(2) until the socket is readable, the link is closed
// or ctx is done.
func (l *Link) wait(ctx context.Context) error {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, l.wake)
		defer stop()
	}
	for {
		l.pfds[0].Revents, l.pfds[1].Revents = 0, 0
		_, err := unix.Poll(l.pfds[:], -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("xdplink: poll: %w", err)
		}
		if l.pfds[1].Revents != 0 {
			var b [8]byte
			unix.Read(l.efd, b[:])
		}
		if l.closed.Load() {
			return ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return nil
	}
}

// WriteBatch copies frames into the UMEM and queues them for transmission.
// A frame that cannot be sent stops the batch with a *link.FrameError.
func (l *Link) WriteBatch(frames [][]byte) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, ErrClosed
	}
	// Frames the device would drop are refused up front: shorter than an
	// Ethernet header, or longer than the MTU allows (with one VLAN tag).
	end, bad := len(frames), error(nil)
	for i, f := range frames {
		if len(f) < ethHeaderLen {
			end, bad = i, link.ErrTruncated
			break
		}
		if len(f) > l.mtu+ethHeaderLen+vlanTagLen {
			end, bad = i, link.ErrTooLarge
			break
		}
	}
	sent, err := l.write(frames[:end])
	if err != nil {
		if errors.Is(err, xdp.ErrFrameTooLarge) {
			err = fmt.Errorf("%w: %w", link.ErrTooLarge, err)
		}
		return sent, &link.FrameError{Index: sent, Err: err}
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

func (l *Link) write(frames [][]byte) (int, error) {
	sent := 0
	var deadline time.Time
	for sent < len(frames) {
		n, err := l.sock.Transmit(frames[sent:])
		sent += n
		if err != nil {
			return sent, err
		}
		if sent == len(frames) || n > 0 {
			continue
		}
		// Out of chunks or ring slots: collect completions, then wait a
		// little for the kernel to finish earlier frames.
		if free, err := l.sock.Complete(); err != nil {
			return sent, err
		} else if free > 0 {
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(txWait)
		} else if time.Now().After(deadline) {
			return sent, ErrTxBusy
		}
		l.sock.Poll(unix.POLLOUT, 1)
	}
	return sent, nil
}

// MTU returns the interface's IP MTU.
func (l *Link) MTU() int { return l.mtu }

// HardwareAddr returns the interface's MAC address.
func (l *Link) HardwareAddr() net.HardwareAddr { return l.mac }

// Info describes the link: frames are exactly what was on the wire.
func (l *Link) Info() link.Info { return link.Info{Kind: link.KindAFXDP, Name: l.ifname} }

// Socket returns the AF_XDP socket, for statistics.
func (l *Link) Socket() *xdp.Socket { return l.sock }

// SteeringStats returns the steering program's counters.
func (l *Link) SteeringStats() (bpf.Stats, error) {
	if l.closed.Load() {
		return bpf.Stats{}, ErrClosed
	}
	return l.prog.Stats()
}

// AttachMode returns how the steering program is attached.
func (l *Link) AttachMode() bpf.AttachMode { return l.att.Mode() }
