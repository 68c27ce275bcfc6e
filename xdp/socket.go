package xdp

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Mode selects how the socket is bound to the device.
type Mode int

const (
	// ModeAuto tries zero-copy and falls back to copy mode.
	ModeAuto Mode = iota
	// ModeZeroCopy insists on zero-copy.
	ModeZeroCopy
	// ModeCopy insists on copy mode.
	ModeCopy
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeZeroCopy:
		return "zerocopy"
	case ModeCopy:
		return "copy"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// busyWait bounds how long Open retries a queue that is still busy. The
// kernel frees a closed socket's queue in deferred work, which a loaded host
// ran more than a second late.
const busyWait = 5 * time.Second

// DefaultRingSize is the default number of RX and TX descriptors.
const DefaultRingSize = 2048

// MaxSegments bounds the descriptors one transmitted frame may use; copy
// mode builds an skb with at most MAX_SKB_FRAGS (17) pages after the head.
const MaxSegments = 16

// Config configures a Socket.
type Config struct {
	// UMEMConfig sizes a private UMEM; ignored when UMEM is set.
	UMEMConfig
	// UMEM, if set, is shared with other sockets (XDP_SHARED_UMEM). The
	// socket takes Frames chunks from it.
	UMEM *UMEM
	// Frames is how many chunks the socket owns (0: the whole private
	// UMEM, or half of what a shared UMEM has left). Half are used for
	// reception, half for transmission.
	Frames int
	// RingSize is the RX and TX ring size, a power of two (0: 2048).
	RingSize int
	// Mode selects zero-copy or copy mode.
	Mode Mode
	// NoNeedWakeup disables XDP_USE_NEED_WAKEUP, so every TX and fill
	// operation kicks the kernel.
	NoNeedWakeup bool
	// Multibuffer enables frames spanning several chunks (XDP_USE_SG).
	Multibuffer bool
}

// Desc is one AF_XDP descriptor: a frame, or one segment of a multi-buffer
// frame, at Addr in the UMEM. It has the layout of struct xdp_desc.
type Desc struct {
	Addr    uint64
	Len     uint32
	Options uint32
}

// More reports whether the next descriptor continues the same frame.
func (d Desc) More() bool { return d.Options&unix.XDP_PKT_CONTD != 0 }

// Stats are the socket's XDP_STATISTICS counters.
type Stats struct {
	RxDropped            uint64 // frames dropped for reasons other than invalid descriptors
	RxInvalidDescs       uint64 // frames dropped due to invalid fill descriptors
	TxInvalidDescs       uint64 // TX descriptors the kernel rejected
	RxRingFull           uint64 // frames dropped because the RX ring was full (5.9)
	RxFillRingEmptyDescs uint64 // times the fill ring was found empty (5.9)
	TxRingEmptyDescs     uint64 // times the TX ring was found empty (5.9)
}

// Socket is an AF_XDP socket bound to one queue of one interface.
type Socket struct {
	fd      int
	ifindex int
	ifname  string
	queue   int

	umem        *UMEM
	privateUMEM bool
	mem         []byte
	frameSize   uint32
	chunkMask   uint64
	rxCap       uint32 // bytes a received chunk can hold
	txCap       uint32 // bytes a transmitted chunk can hold
	first, nfr  uint32 // chunk range owned

	fill, comp addrRing
	rx, tx     descRing
	maps       [4][]byte

	txFree txPool // free TX chunks

	zeroCopy   bool
	needWakeup bool
	sg         bool
	busyPoll   bool // SetBusyPoll succeeded

	oversize uint64 // frames dropped by Receive: more segments than asked for
	received uint64 // frames handed out by Receive
	sent     uint64 // frames queued by Transmit

	pfd    [1]unix.PollFd
	closed bool
}

// Open creates an AF_XDP socket on queue of ifname. The interface must be in
// the calling thread's network namespace. An XDP program must redirect the
// queue's traffic into the socket (see FD) for anything to be received.
func Open(ifname string, queue int, cfg Config) (*Socket, error) {
	if cfg.RingSize == 0 {
		cfg.RingSize = DefaultRingSize
	}
	if cfg.RingSize < 2 || bits.OnesCount(uint(cfg.RingSize)) != 1 {
		return nil, fmt.Errorf("%w: ring size %d is not a power of two", ErrBadConfig, cfg.RingSize)
	}
	if cfg.Mode < ModeAuto || cfg.Mode > ModeCopy {
		return nil, fmt.Errorf("%w: mode %d", ErrBadConfig, cfg.Mode)
	}
	ifi, err := lookupInterface(ifname)
	if err != nil {
		return nil, err
	}
	nq, qerr := rxQueueCount(ifname, ifi.Index)
	if queue < 0 || (qerr == nil && queue >= nq) {
		// Without a count the bind below still refuses a bad queue.
		return nil, &QueueRangeError{Interface: ifname, Queue: queue, Queues: nq}
	}

	u := cfg.UMEM
	private := u == nil
	if private {
		if u, err = NewUMEM(cfg.UMEMConfig); err != nil {
			return nil, err
		}
	}
	if cfg.Frames < 0 || cfg.Frames == 1 {
		if private {
			u.Close()
		}
		return nil, fmt.Errorf("%w: %d frames for a socket (want at least 2: receive and transmit)", ErrBadConfig, cfg.Frames)
	}
	frames := uint32(cfg.Frames)
	if frames == 0 {
		if private {
			frames = u.nframes
		} else {
			frames = uint32(u.FreeFrames() / 2)
		}
	}
	first, err := u.take(frames)
	if err != nil {
		if private {
			u.Close()
		}
		return nil, err
	}
	s, err := openOn(ifi.Index, ifname, queue, u, first, frames, &cfg)
	// The kernel frees a closed socket's hold on its queue from a work
	// queue, so a queue closed a moment ago can still be busy.
	for start := time.Now(); errors.Is(err, unix.EBUSY) && time.Since(start) < busyWait; {
		time.Sleep(10 * time.Millisecond)
		s, err = openOn(ifi.Index, ifname, queue, u, first, frames, &cfg)
	}
	if err != nil {
		u.untake(first, frames)
		if private {
			u.Close()
		}
		return nil, err
	}
	s.privateUMEM = private
	return s, nil
}

// openOn tries the bind variants the configuration allows.
func openOn(ifindex int, ifname string, queue int, u *UMEM, first, n uint32, cfg *Config) (*Socket, error) {
	u.mu.Lock()
	ownerFD := u.ownerFD
	owner := u.owner
	u.mu.Unlock()
	if ownerFD == -2 {
		return nil, fmt.Errorf("xdp: the socket that registered the UMEM is closed; it cannot be shared any more: %w", ErrClosed)
	}
	if ownerFD >= 0 {
		if owner != nil && owner.ifindex == ifindex && owner.queue == queue {
			return nil, fmt.Errorf("%w: sharing a UMEM on the same queue (%s/%d) would share its fill ring", ErrBadConfig, ifname, queue)
		}
		s, err := bind(ifindex, ifname, queue, u, first, n, cfg, unix.XDP_SHARED_UMEM, ownerFD)
		if errors.Is(err, unix.EINVAL) {
			return nil, notSupported(featSharedUMEM, err)
		}
		return s, err
	}

	var extra uint16
	if !cfg.NoNeedWakeup {
		extra |= unix.XDP_USE_NEED_WAKEUP
	}
	if cfg.Multibuffer {
		extra |= unix.XDP_USE_SG
	}
	var zcErr error
	if cfg.Mode != ModeCopy {
		s, err := bind(ifindex, ifname, queue, u, first, n, cfg, unix.XDP_ZEROCOPY|extra, -1)
		if err == nil {
			return s, nil
		}
		if cfg.Mode == ModeZeroCopy || !isBindRefusal(err) {
			if isBindRefusal(err) {
				return nil, notSupported(featZeroCopy, err)
			}
			return nil, err
		}
		zcErr = err
	}
	s, err := bind(ifindex, ifname, queue, u, first, n, cfg, unix.XDP_COPY|extra, -1)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return nil, err
	}
	// EINVAL from a copy-mode bind: find out whether a flag is unknown to
	// this kernel.
	if extra&unix.XDP_USE_SG != 0 {
		probe, perr := bind(ifindex, ifname, queue, u, first, n, cfg, unix.XDP_COPY|(extra&^unix.XDP_USE_SG), -1)
		if perr == nil {
			probe.discard()
			return nil, notSupported(featSG, err)
		}
	}
	if extra&unix.XDP_USE_NEED_WAKEUP != 0 {
		// Kernels before 5.4 do not know the flag; run without it.
		s, perr := bind(ifindex, ifname, queue, u, first, n, cfg, unix.XDP_COPY|(extra&^unix.XDP_USE_NEED_WAKEUP), -1)
		if perr == nil {
			return s, nil
		}
	}
	if zcErr != nil {
		return nil, fmt.Errorf("%w (zero-copy: %v)", err, zcErr)
	}
	return nil, err
}

// isBindRefusal reports errors with which a driver refuses zero-copy.
func isBindRefusal(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSUP)
}

// bind is bindVariant; tests replace it to play kernels without a feature.
var bind = bindVariant

// bindVariant creates, sets up and binds one socket with the given flags.
func bindVariant(ifindex int, ifname string, queue int, u *UMEM, first, n uint32, cfg *Config, flags uint16, sharedFD int) (_ *Socket, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.EAFNOSUPPORT):
			return nil, notSupported(featAFXDP, err)
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
			return nil, fmt.Errorf("xdp: creating an AF_XDP socket needs CAP_NET_RAW: %w", err)
		}
		return nil, fmt.Errorf("xdp: socket(AF_XDP): %w", err)
	}
	s := &Socket{
		fd:        fd,
		ifindex:   ifindex,
		ifname:    ifname,
		queue:     queue,
		umem:      u,
		mem:       u.mem,
		frameSize: u.frameSize,
		chunkMask: ^uint64(u.frameSize - 1),
		rxCap:     u.frameSize - unix.XDP_PACKET_HEADROOM - u.headroom,
		txCap:     u.frameSize,
		first:     first,
		nfr:       n,
	}
	defer func() {
		if err != nil {
			s.release()
		}
	}()

	nrx := n / 2
	ntx := n - nrx
	fillSize := nextPow2(nrx)
	compSize := nextPow2(ntx)
	ringSize := uint32(cfg.RingSize)

	if sharedFD < 0 {
		reg := unix.XDPUmemReg{
			Addr:     uint64(uintptr(unsafe.Pointer(&u.mem[0]))),
			Len:      uint64(len(u.mem)),
			Size:     u.frameSize,
			Headroom: u.headroom,
		}
		if err := setsockoptPtr(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
			return nil, fmt.Errorf("xdp: registering UMEM: %w", err)
		}
	}
	for _, o := range []struct {
		opt  int
		size uint32
	}{
		{unix.XDP_UMEM_FILL_RING, fillSize},
		{unix.XDP_UMEM_COMPLETION_RING, compSize},
		{unix.XDP_RX_RING, ringSize},
		{unix.XDP_TX_RING, ringSize},
	} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o.opt, int(o.size)); err != nil {
			return nil, fmt.Errorf("xdp: sizing ring %d to %d: %w", o.opt, o.size, err)
		}
	}
	var off unix.XDPMmapOffsets
	l, err := getsockoptPtr(fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off))
	if err != nil {
		return nil, fmt.Errorf("xdp: XDP_MMAP_OFFSETS: %w", err)
	}
	if l != unsafe.Sizeof(off) {
		// The ring flags word (and need_wakeup with it) arrived in 5.4.
		return nil, notSupported(featNeedWakeup, nil)
	}
	type mapping struct {
		pgoff int64
		off   unix.XDPRingOffset
		size  uint32
		entry uint64
	}
	ms := [4]mapping{
		{unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, fillSize, 8},
		{unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, compSize, 8},
		{unix.XDP_PGOFF_RX_RING, off.Rx, ringSize, uint64(unsafe.Sizeof(Desc{}))},
		{unix.XDP_PGOFF_TX_RING, off.Tx, ringSize, uint64(unsafe.Sizeof(Desc{}))},
	}
	for i, m := range ms {
		b, err := mmapShared(fd, m.pgoff, int(m.off.Desc+uint64(m.size)*m.entry))
		if err != nil {
			return nil, fmt.Errorf("xdp: mapping ring %d: %w", i, err)
		}
		s.maps[i] = b
	}
	s.fill.init(s.maps[0], off.Fr, fillSize)
	s.comp.init(s.maps[1], off.Cr, compSize)
	s.rx.init(s.maps[2], off.Rx, ringSize)
	s.tx.init(s.maps[3], off.Tx, ringSize)

	sa := unix.RawSockaddrXDP{
		Family:   unix.AF_XDP,
		Flags:    flags,
		Ifindex:  uint32(ifindex),
		Queue_id: uint32(queue),
	}
	if sharedFD >= 0 {
		sa.Shared_umem_fd = uint32(sharedFD)
	}
	if err := bindXDP(fd, &sa); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("xdp: binding %s queue %d: another socket or zero-copy user holds the queue: %w", ifname, queue, err)
		}
		return nil, fmt.Errorf("xdp: binding %s queue %d (flags %#x): %w", ifname, queue, flags, err)
	}

	if sharedFD >= 0 {
		o, err := s.options()
		if err != nil {
			return nil, err
		}
		s.zeroCopy = o&unix.XDP_OPTIONS_ZEROCOPY != 0
		u.mu.Lock()
		if u.owner != nil {
			s.needWakeup = u.owner.needWakeup
			s.sg = u.owner.sg
		}
		u.mu.Unlock()
	} else {
		s.zeroCopy = flags&unix.XDP_ZEROCOPY != 0
		s.needWakeup = flags&unix.XDP_USE_NEED_WAKEUP != 0
		s.sg = flags&unix.XDP_USE_SG != 0
		u.mu.Lock()
		u.ownerFD = fd
		u.owner = s
		u.mu.Unlock()
	}

	// The first half of the chunks receives, the second half transmits.
	fs := uint64(u.frameSize)
	idx := s.fill.cachedProd
	for i := uint32(0); i < nrx; i++ {
		s.fill.addrs[(idx+i)&s.fill.mask] = uint64(first+i) * fs
	}
	s.fill.cachedProd += nrx
	s.fill.submit()
	s.txFree = newTxPool(uint64(first+nrx)*fs, u.frameSize, int(ntx))
	s.pfd[0].Fd = int32(fd)
	return s, nil
}

func nextPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

// release closes the descriptor and unmaps the rings.
func (s *Socket) release() {
	for i, m := range s.maps {
		if m != nil {
			unix.Munmap(m)
			s.maps[i] = nil
		}
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// discard undoes a successful bind that is not wanted (a feature probe).
func (s *Socket) discard() {
	s.release()
	s.umem.mu.Lock()
	if s.umem.owner == s {
		s.umem.owner = nil
		s.umem.ownerFD = -1
	}
	s.umem.mu.Unlock()
}

// Close closes the socket and, for a private UMEM, frees it. Closing twice
// returns ErrClosed.
func (s *Socket) Close() error {
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	s.release()
	s.umem.put(s)
	if s.privateUMEM {
		return s.umem.Close()
	}
	return nil
}

// FD returns the socket descriptor, for XSKMAP registration and poll(2).
func (s *Socket) FD() int { return s.fd }

// Interface returns the interface name and index.
func (s *Socket) Interface() (string, int) { return s.ifname, s.ifindex }

// Queue returns the queue the socket is bound to.
func (s *Socket) Queue() int { return s.queue }

// ZeroCopy reports whether the socket was bound in zero-copy mode.
func (s *Socket) ZeroCopy() bool { return s.zeroCopy }

// NeedWakeup reports whether the kernel only needs kicks when it asks.
func (s *Socket) NeedWakeup() bool { return s.needWakeup }

// Multibuffer reports whether frames may span several chunks.
func (s *Socket) Multibuffer() bool { return s.sg }

// FrameSize returns the UMEM chunk size.
func (s *Socket) FrameSize() int { return int(s.frameSize) }

// MaxFrame returns the largest frame Transmit accepts.
func (s *Socket) MaxFrame() int {
	if s.sg {
		return MaxSegments * int(s.txCap)
	}
	return int(s.txCap)
}

// RxChunkCapacity returns how many bytes of a received frame one chunk
// holds; longer frames need multi-buffer.
func (s *Socket) RxChunkCapacity() int { return int(s.rxCap) }

func (s *Socket) options() (uint32, error) {
	var o uint32
	if _, err := getsockoptPtr(s.fd, unix.SOL_XDP, unix.XDP_OPTIONS, unsafe.Pointer(&o), unsafe.Sizeof(o)); err != nil {
		return 0, fmt.Errorf("xdp: XDP_OPTIONS: %w", err)
	}
	return o, nil
}

// KernelZeroCopy asks the kernel (XDP_OPTIONS) whether zero-copy is in use.
func (s *Socket) KernelZeroCopy() (bool, error) {
	if s.closed {
		return false, ErrClosed
	}
	o, err := s.options()
	return o&unix.XDP_OPTIONS_ZEROCOPY != 0, err
}

// Stats reads the XDP_STATISTICS counters.
func (s *Socket) Stats() (Stats, error) {
	if s.closed {
		return Stats{}, ErrClosed
	}
	var st unix.XDPStatistics
	if _, err := getsockoptPtr(s.fd, unix.SOL_XDP, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st)); err != nil {
		return Stats{}, fmt.Errorf("xdp: XDP_STATISTICS: %w", err)
	}
	return Stats{
		RxDropped:            st.Rx_dropped,
		RxInvalidDescs:       st.Rx_invalid_descs,
		TxInvalidDescs:       st.Tx_invalid_descs,
		RxRingFull:           st.Rx_ring_full,
		RxFillRingEmptyDescs: st.Rx_fill_ring_empty_descs,
		TxRingEmptyDescs:     st.Tx_ring_empty_descs,
	}, nil
}

// Receive takes up to len(descs) descriptors from the RX ring, whole frames
// only: a multi-buffer frame is never split between calls. A frame with more
// segments than len(descs) is dropped and its chunks recycled (see
// Oversize); 18 descriptors always suffice, as the kernel builds at most
// MAX_SKB_FRAGS+1 segments. The chunks belong to the caller until passed
// to Release.
func (s *Socket) Receive(descs []Desc) int {
	if s.closed || len(descs) == 0 {
		return 0
	}
	for {
		avail := s.rx.avail()
		if avail == 0 {
			return 0
		}
		max := uint32(len(descs))
		if avail < max {
			max = avail
		}
		whole, frames := uint32(0), uint64(0)
		cons := s.rx.cachedCons
		for i := uint32(0); i < max; i++ {
			d := s.rx.descs[(cons+i)&s.rx.mask]
			descs[i] = Desc{Addr: d.Addr, Len: d.Len, Options: d.Options}
			if d.Options&unix.XDP_PKT_CONTD == 0 {
				whole = i + 1
				frames++
			}
		}
		if whole > 0 {
			s.rx.release(whole)
			s.received += frames
			return int(whole)
		}
		if max < uint32(len(descs)) || !s.dropLongFrame() {
			// The kernel publishes whole frames; wait for the rest.
			return 0
		}
	}
}

// dropLongFrame recycles the frame at the head of the RX ring, which has
// more segments than the caller can take. It reports whether the whole
// frame was there.
func (s *Socket) dropLongFrame() bool {
	s.rx.cachedProd = atomic.LoadUint32(s.rx.producer)
	cons := s.rx.cachedCons
	n := uint32(0)
	for {
		if n == s.rx.cachedProd-cons {
			return false
		}
		d := s.rx.descs[(cons+n)&s.rx.mask]
		n++
		if d.Options&unix.XDP_PKT_CONTD == 0 {
			break
		}
	}
	if s.fill.free(n) < n {
		return false
	}
	for i := uint32(0); i < n; i++ {
		s.fill.addrs[(s.fill.cachedProd+i)&s.fill.mask] = s.rx.descs[(cons+i)&s.rx.mask].Addr & s.chunkMask
	}
	s.fill.cachedProd += n
	s.fill.submit()
	s.rx.release(n)
	s.oversize++
	return true
}

// Received returns how many frames Receive has handed out.
func (s *Socket) Received() uint64 { return s.received }

// Sent returns how many frames Transmit has queued.
func (s *Socket) Sent() uint64 { return s.sent }

// Oversize returns how many received frames Receive dropped because they
// had more segments than the descriptor slice it was given.
func (s *Socket) Oversize() uint64 { return s.oversize }

// Frame returns the bytes of a received descriptor, in place in the UMEM,
// or nil for a descriptor that does not lie inside this socket's chunks.
func (s *Socket) Frame(d Desc) []byte {
	if s.closed {
		return nil
	}
	a, l := d.Addr, uint64(d.Len)
	fs := uint64(s.frameSize)
	if a >= uint64(len(s.mem)) || l > fs || a&(fs-1)+l > fs {
		return nil
	}
	return s.mem[a : a+l : a+l]
}

// CopyFrame copies the frame starting at descs[0] (all its segments) into
// dst. It returns the frame length and the number of descriptors it used.
// The descriptors still need Release.
func (s *Socket) CopyFrame(dst []byte, descs []Desc) (n, used int, err error) {
	for i, d := range descs {
		b := s.Frame(d)
		if b == nil {
			return n, i, fmt.Errorf("xdp: descriptor %#x+%d outside the UMEM", d.Addr, d.Len)
		}
		if len(dst)-n < len(b) {
			return n, i, io.ErrShortBuffer
		}
		n += copy(dst[n:], b)
		if !d.More() {
			return n, i + 1, nil
		}
	}
	return n, len(descs), io.ErrUnexpectedEOF
}

// Release returns received chunks to the kernel through the fill ring. It
// returns how many were accepted: descriptors outside the socket's chunks
// are ignored.
func (s *Socket) Release(descs []Desc) int {
	if s.closed {
		return 0
	}
	free := s.fill.free(uint32(len(descs)))
	lo := uint64(s.first) * uint64(s.frameSize)
	hi := lo + uint64(s.nfr/2)*uint64(s.frameSize)
	n := uint32(0)
	for _, d := range descs {
		if n == free {
			break
		}
		a := d.Addr & s.chunkMask
		if a < lo || a >= hi {
			continue
		}
		s.fill.addrs[(s.fill.cachedProd+n)&s.fill.mask] = a
		n++
	}
	if n == 0 {
		return 0
	}
	s.fill.cachedProd += n
	s.fill.submit()
	// Without need_wakeup the driver polls the fill ring by itself.
	if s.needWakeup && s.fill.needWakeup() {
		_ = kickRx(s.fd)
	}
	return int(n)
}

// reap moves completed TX chunks back to the free list.
func (s *Socket) reap() {
	n := s.comp.avail()
	if n == 0 {
		return
	}
	cons := s.comp.cachedCons
	for i := uint32(0); i < n; i++ {
		s.txFree.put(s.comp.addrs[(cons+i)&s.comp.mask])
	}
	s.comp.release(n)
}

// TxFree returns how many TX chunks are free after collecting completions.
func (s *Socket) TxFree() int {
	if s.closed {
		return 0
	}
	s.reap()
	return s.txFree.free
}

// TxUnsent returns how many descriptors wait in the TX ring for the kernel
// to take them: queued, and not yet taken.
func (s *Socket) TxUnsent() int {
	if s.closed {
		return 0
	}
	return int(s.tx.pending())
}

// TxNeedsKick reports whether descriptors wait in the TX ring that the
// kernel takes only when kicked (Complete kicks): always so in copy mode,
// and with XDP_USE_NEED_WAKEUP when the kernel asks for it. A driver that
// polls the ring itself takes them without one.
func (s *Socket) TxNeedsKick() bool {
	if s.closed || s.tx.pending() == 0 {
		return false
	}
	return !s.needWakeup || s.tx.needWakeup()
}

// TxPending returns how many TX chunks are queued or in flight.
func (s *Socket) TxPending() int {
	if s.closed {
		return 0
	}
	s.reap()
	return s.txFree.n - s.txFree.free
}

// Transmit copies frames into free TX chunks and queues them. It returns how
// many frames were queued; it stops early, without error, when chunks or
// ring slots run out (see Complete and Poll), and with an error at a frame
// it can never send.
func (s *Socket) Transmit(frames [][]byte) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	s.reap()
	n := 0
	var err error
	queued := false
	for _, f := range frames {
		if len(f) == 0 {
			err = ErrEmptyFrame
			break
		}
		if len(f) > s.MaxFrame() {
			err = s.tooLarge(len(f))
			break
		}
		l := uint32(len(f))
		segs := (l + s.txCap - 1) / s.txCap
		if uint32(s.txFree.free) < segs || s.tx.free(segs) < segs {
			s.reap()
			if uint32(s.txFree.free) < segs || s.tx.free(segs) < segs {
				break
			}
		}
		prod := s.tx.cachedProd
		for i := uint32(0); i < segs; i++ {
			a, _ := s.txFree.get(1)
			seg := f[i*s.txCap:]
			if uint32(len(seg)) > s.txCap {
				seg = seg[:s.txCap]
			}
			copy(s.mem[a:a+uint64(len(seg))], seg)
			var opt uint32
			if i+1 < segs {
				opt = unix.XDP_PKT_CONTD
			}
			s.tx.descs[(prod+i)&s.tx.mask] = unix.XDPDesc{Addr: a, Len: uint32(len(seg)), Options: opt}
		}
		s.tx.cachedProd += segs
		queued = true
		n++
		s.sent++
	}
	if queued {
		s.tx.submit()
		if kerr := s.kick(); kerr != nil && err == nil {
			err = kerr
		}
	}
	return n, err
}

// AllocTx takes up to len(descs) free TX chunks for frames to be built in
// place (see TxBuffer), avoiding the copy Transmit makes. It returns how
// many it took. Each chunk must go back through SubmitTx or FreeTx.
func (s *Socket) AllocTx(descs []Desc) int {
	if s.closed {
		return 0
	}
	if s.txFree.free < len(descs) {
		s.reap()
	}
	n := min(len(descs), s.txFree.free)
	for i := 0; i < n; i++ {
		a, _ := s.txFree.get(1)
		descs[i] = Desc{Addr: a, Len: s.txCap}
	}
	return n
}

// TxBuffer returns the whole chunk of a descriptor from AllocTx, or nil for
// one that is not a TX chunk of this socket.
func (s *Socket) TxBuffer(d Desc) []byte {
	if s.closed || !s.isTxChunk(d.Addr) {
		return nil
	}
	return s.mem[d.Addr : d.Addr+uint64(s.txCap) : d.Addr+uint64(s.txCap)]
}

func (s *Socket) isTxChunk(a uint64) bool {
	fs := uint64(s.frameSize)
	lo := uint64(s.first+s.nfr/2) * fs
	hi := uint64(s.first+s.nfr) * fs
	return a >= lo && a < hi && a&(fs-1) == 0
}

// SubmitTx queues chunks from AllocTx whose Len the caller has set to the
// frame length; with multi-buffer, Options may chain chunks with
// XDP_PKT_CONTD (the last of a frame without it). It returns how many
// descriptors were queued; those not queued still belong to the caller.
func (s *Socket) SubmitTx(descs []Desc) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	for i, d := range descs {
		if !s.isTxChunk(d.Addr) || d.Len == 0 || d.Len > s.txCap ||
			(d.More() && !s.sg) || d.Options&^unix.XDP_PKT_CONTD != 0 {
			return 0, fmt.Errorf("xdp: TX descriptor %d (%#x+%d, options %#x) is not a filled chunk of this socket", i, d.Addr, d.Len, d.Options)
		}
	}
	if len(descs) > 0 && descs[len(descs)-1].More() {
		return 0, fmt.Errorf("xdp: TX batch ends inside a multi-buffer frame")
	}
	free := s.tx.free(uint32(len(descs)))
	n := uint32(len(descs))
	if free < n {
		// Queue whole frames only.
		n = 0
		for i := uint32(0); i < free; i++ {
			if !descs[i].More() {
				n = i + 1
			}
		}
	}
	if n == 0 {
		return 0, nil
	}
	prod := s.tx.cachedProd
	for i := uint32(0); i < n; i++ {
		d := descs[i]
		s.tx.descs[(prod+i)&s.tx.mask] = unix.XDPDesc{Addr: d.Addr, Len: d.Len, Options: d.Options}
		if !d.More() {
			s.sent++
		}
	}
	s.tx.cachedProd += n
	s.tx.submit()
	return int(n), s.kick()
}

// FreeTx gives chunks from AllocTx back unused.
func (s *Socket) FreeTx(descs []Desc) {
	if s.closed {
		return
	}
	for _, d := range descs {
		if s.isTxChunk(d.Addr) {
			s.txFree.put(d.Addr)
		}
	}
}

func (s *Socket) tooLarge(l int) error {
	if s.sg {
		return fmt.Errorf("%w: %d bytes needs more than %d segments of %d", ErrFrameTooLarge, l, MaxSegments, s.txCap)
	}
	return fmt.Errorf("%w: %d bytes, a %d-byte chunk without multi-buffer (XDP_USE_SG)", ErrFrameTooLarge, l, s.txCap)
}

// kick makes the kernel process the TX ring if it needs to be told. In copy
// mode one sendto handles a limited batch and reports EAGAIN while
// descriptors remain, so it is repeated a bounded number of times.
func (s *Socket) kick() error {
	if s.needWakeup && !s.tx.needWakeup() {
		return nil
	}
	for i := 0; i < 64; i++ {
		err := kickTx(s.fd)
		switch err {
		case nil:
			if s.tx.pending() == 0 {
				return nil
			}
		case unix.EAGAIN, unix.EBUSY, unix.ENOBUFS:
			if s.tx.pending() == 0 {
				return nil
			}
		case unix.ENETDOWN:
			return fmt.Errorf("xdp: transmitting on %s: %w", s.ifname, err)
		default:
			return fmt.Errorf("xdp: kicking TX: %w", err)
		}
	}
	return nil
}

// Complete kicks the kernel to process queued TX descriptors and collects
// finished chunks; it returns how many TX chunks are free.
func (s *Socket) Complete() (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	var err error
	if s.tx.pending() > 0 {
		err = s.kick()
	}
	s.reap()
	return s.txFree.free, err
}

// Poll waits up to timeoutMs (-1: forever) for received frames (POLLIN) or
// TX ring space (POLLOUT), as asked. It reports whether the socket is ready.
func (s *Socket) Poll(events int16, timeoutMs int) (bool, error) {
	if s.closed {
		return false, ErrClosed
	}
	s.pfd[0].Events = events
	s.pfd[0].Revents = 0
	n, err := pollFDs(s.pfd[:], timeoutMs)
	if err != nil {
		return false, fmt.Errorf("xdp: poll: %w", err)
	}
	return n > 0, nil
}
