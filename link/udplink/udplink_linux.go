package udplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/sys"
	"github.com/goroce/goroce/link"
)

// Link is a link.Link over a kernel UDP socket.
type Link struct {
	conn     *net.UDPConn
	rc       syscall.RawConn
	addr     netip.Addr // bound address, unmapped, no zone
	port     uint16
	v6       bool
	wildcard bool
	scope    uint32 // interface index of a link-local address's zone
	mtu      int
	mac      net.HardwareAddr
	macArr   [6]byte
	name     string
	batch    int
	closed   atomic.Bool

	readMu    sync.Mutex // guards the receive state below
	rmsgs     []unix.Mmsghdr
	riovs     []unix.Iovec
	rnames    []unix.RawSockaddrInet6
	roob      []byte
	rbufs     [][]byte
	frames    [][]byte
	rn        int
	rerr      error
	recvFn    func(fd uintptr) bool // blocking attempt
	tryRecvFn func(fd uintptr) bool // single non-blocking attempt
	pollFn    func(fd uintptr)      // PollBatch's attempt (poll.go)
	rdirty    int                   // leading rmsgs entries the last recvmmsg wrote
	rxh       rxHeader              // the synthesized header (synth.go)

	sleepMu  sync.Mutex // guards wakeFd and sleepers (SleepReadable)
	wakeFd   int        // eventfd that ends SleepReadable's poll; -1 if none
	sleepers int
	sleepFn  func(fd uintptr)

	dlMu        sync.Mutex // orders context interrupts against their cleanup
	waiting     bool       // a ReadBatch is blocked and may be interrupted
	deadlineSet bool       // an interrupt set the read deadline
	interruptFn func()

	// senders are the send states: WriteBatch takes one that is free, so
	// that goroutines sending at once (the transmit shards of a device)
	// make their system calls at once, which the kernel's UDP send path
	// allows (no socket lock without corking).
	senders []*sender
	nextSnd atomic.Uint32 // the sender to wait for when none is free
	tos     uint8         // the socket's TOS / traffic class (SetDefaultTOS); under every sender's lock

	truncated atomic.Uint64
	buffers   atomic.Uint64 // received buffers (Stats.QueueBuffers)
	off       offload

	// queues are the sockets of the link's receive queues, this one first
	// (Options.Queues, queues.go); the others only receive.
	queues []*Link
	steer  bool // a BPF program steers datagrams among queues by QPN
}

var (
	_ link.Link         = (*Link)(nil)
	_ link.TOSDefaulter = (*Link)(nil)
)

// Listen opens a link on addr. Port 0 means DefaultPort. The address
// family of addr is the link's: an IPv4 link sends and receives only IPv4
// frames, an IPv6 link (IPV6_V6ONLY) only IPv6 frames. An IPv6 link-local
// address needs its zone (fe80::1%eth0).
func Listen(addr netip.AddrPort) (*Link, error) {
	return ListenOptions(addr, Options{})
}

// ListenOptions is Listen with options.
func ListenOptions(addr netip.AddrPort, opts Options) (*Link, error) {
	if opts.Queues < 0 || opts.Queues > MaxQueues {
		return nil, fmt.Errorf("udplink: Options.Queues %d: not in 0..%d", opts.Queues, MaxQueues)
	}
	if opts.Queues <= 1 {
		return listenSocket(addr, opts, false)
	}
	return listenQueues(addr, opts)
}

// listenSocket opens one socket; reuse sets SO_REUSEPORT before it is bound (a
// queue of a link with several, queues.go).
func listenSocket(addr netip.AddrPort, opts Options, reuse bool) (*Link, error) {
	if opts.Batch <= 0 {
		opts.Batch = defaultBatch
	}
	if opts.MaxDatagram <= 0 {
		opts.MaxDatagram = defaultMaxDatagram
	}
	if opts.SocketBuffer <= 0 {
		opts.SocketBuffer = defaultSocketBuffer
	}
	zone := addr.Addr().Zone()
	ip := addr.Addr().Unmap().WithZone("")
	if !ip.IsValid() {
		return nil, fmt.Errorf("udplink: invalid address %v", addr)
	}
	port := addr.Port()
	if port == 0 && !opts.EphemeralPort {
		port = DefaultPort
	}
	l := &Link{addr: ip, v6: ip.Is6(), wildcard: ip.IsUnspecified(), batch: opts.Batch, wakeFd: -1}
	network := "udp4"
	if l.v6 {
		network = "udp6"
	}
	var soErr error
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		if err := c.Control(func(fd uintptr) {
			if reuse {
				if err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
					soErr = fmt.Errorf("setsockopt SO_REUSEPORT: %w", err)
					return
				}
			}
			if soErr = l.setsockopts(int(fd), opts.SocketBuffer); soErr == nil {
				l.probeOffloads(int(fd), opts)
			}
		}); err != nil {
			return err
		}
		return soErr
	}}
	if zone != "" {
		// A link-local address names its interface; sends to link-local
		// destinations go out of it.
		ifc, err := net.InterfaceByName(zone)
		if err != nil {
			if ifc, err = interfaceByIndex(zone); err != nil {
				return nil, fmt.Errorf("udplink: zone of %v: %w", addr, err)
			}
		}
		l.scope = uint32(ifc.Index)
	}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(ip.WithZone(zone), port).String())
	if err != nil {
		return nil, fmt.Errorf("udplink: %w", err)
	}
	l.conn = pc.(*net.UDPConn)
	if l.rc, err = l.conn.SyscallConn(); err != nil {
		l.conn.Close()
		return nil, fmt.Errorf("udplink: %w", err)
	}
	l.port = netip.MustParseAddrPort(l.conn.LocalAddr().String()).Port()
	l.mtu, l.mac = interfaceOf(ip)
	if l.wildcard && opts.WildcardMTU > 0 {
		l.mtu = opts.WildcardMTU
	}
	copy(l.macArr[:], l.mac)
	l.name = netip.AddrPortFrom(ip, l.port).String()
	l.initRecv(l.recvBufSize(opts.MaxDatagram))
	l.initSend()
	l.initOffload()
	l.queues = []*Link{l}
	return l, nil
}

func (l *Link) setsockopts(fd, bufSize int) error {
	type opt struct {
		level, name, value int
		what               string
	}
	var opts []opt
	if l.v6 {
		opts = []opt{
			{unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO, "IPV6_MTU_DISCOVER"},
			{unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1, "IPV6_DONTFRAG"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1, "IPV6_RECVPKTINFO"},
			{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1, "IPV6_RECVTCLASS"},
			// rxe sends every datagram with UDP checksum 0, IPv6 too
			// (its tunnel socket takes zero checksums); without this
			// the kernel drops them all. The ICRC still checks them.
			{unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1, "UDP_NO_CHECK6_RX"},
		}
	} else {
		opts = []opt{
			{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO, "IP_MTU_DISCOVER"},
			{unix.IPPROTO_IP, unix.IP_PKTINFO, 1, "IP_PKTINFO"},
			{unix.IPPROTO_IP, unix.IP_RECVTOS, 1, "IP_RECVTOS"},
		}
	}
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.name, o.value); err != nil {
			return fmt.Errorf("setsockopt %s: %w", o.what, err)
		}
	}
	// Bigger buffers absorb bursts; failure only costs performance.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufSize) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bufSize)
	}
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufSize) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, bufSize)
	}
	return nil
}

func (l *Link) initRecv(bufSize int) {
	n := l.batch
	l.rmsgs = make([]unix.Mmsghdr, n)
	l.riovs = make([]unix.Iovec, n)
	l.rnames = make([]unix.RawSockaddrInet6, n)
	l.roob = make([]byte, n*oobSize)
	l.rbufs = make([][]byte, n)
	l.frames = make([][]byte, 0, n)
	for i := range l.rbufs {
		l.rbufs[i] = make([]byte, headroom+bufSize+l.spreadSlack())
		l.riovs[i].Base = &l.rbufs[i][headroom]
		l.riovs[i].SetLen(bufSize)
		h := &l.rmsgs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&l.rnames[i]))
		h.Iov = &l.riovs[i]
		h.SetIovlen(1)
		h.Control = &l.roob[i*oobSize]
	}
	l.tryRecvFn = l.tryRecv
	l.pollFn = l.pollRecv
	l.sleepFn = l.sleepPoll
	l.recvFn = l.recv
	l.interruptFn = l.interrupt
	l.rdirty = n
}

// sender is one send state of a Link: the messages of one sendmmsg.
type sender struct {
	l      *Link
	mu     sync.Mutex // guards the rest
	batch  int
	wmsgs  []unix.Mmsghdr
	wiovs  []unix.Iovec
	wnames []unix.RawSockaddrInet6
	woob   []byte
	runs   []gsoRun // per send message: the frames it carries
	wcount int
	wsent  int
	werr   error
	sendFn func(fd uintptr) bool
}

// senders is the number of send states of a Link: how many goroutines
// can make their sendmmsg at once.
const senders = 4

func (l *Link) initSend() {
	l.senders = make([]*sender, senders)
	for k := range l.senders {
		n := l.batch
		s := &sender{l: l, batch: n}
		s.wmsgs = make([]unix.Mmsghdr, n)
		s.wiovs = make([]unix.Iovec, n)
		s.wnames = make([]unix.RawSockaddrInet6, n)
		s.woob = make([]byte, n*oobSize)
		s.runs = make([]gsoRun, n)
		for i := range s.wmsgs {
			h := &s.wmsgs[i].Hdr
			h.Name = (*byte)(unsafe.Pointer(&s.wnames[i]))
			h.Iov = &s.wiovs[i]
			h.SetIovlen(1)
		}
		s.sendFn = s.send
		l.senders[k] = s
	}
}

// sender takes the first free send state (one goroutine alone always
// gets the first), or waits for one.
func (l *Link) sender() *sender {
	for _, s := range l.senders {
		if s.mu.TryLock() {
			return s
		}
	}
	s := l.senders[int(l.nextSnd.Add(1))%len(l.senders)]
	s.mu.Lock()
	return s
}

// lockSenders takes every send state (SetDefaultTOS).
func (l *Link) lockSenders() {
	for _, s := range l.senders {
		s.mu.Lock()
	}
}

func (l *Link) unlockSenders() {
	for _, s := range l.senders {
		s.mu.Unlock()
	}
}

// resetRecv restores the in/out fields recvmmsg overwrites. Only the
// entries the last call filled need it: an empty poll (EAGAIN) writes
// none, and resetting all of them made a tenth of a spinning poller's time.
func (l *Link) resetRecv() {
	n := min(l.rdirty, len(l.rmsgs))
	l.rdirty = 0
	for i := range l.rmsgs[:n] {
		h := &l.rmsgs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(oobSize)
		h.Flags = 0
		l.rmsgs[i].Len = 0
	}
}

func (l *Link) tryRecv(fd uintptr) bool {
	l.recvmmsg(fd)
	return true
}

func (l *Link) recv(fd uintptr) bool {
	l.recvmmsg(fd)
	return l.rerr != unix.EAGAIN
}

// recvmmsg takes what is queued on the socket, without waiting.
func (l *Link) recvmmsg(fd uintptr) {
	l.rn, l.rerr = sys.Recvmmsg(int(fd), l.rmsgs, unix.MSG_DONTWAIT)
	l.rdirty = max(l.rn, 0)
	if l.rn > 0 {
		l.buffers.Add(uint64(l.rn))
	}
}

// interrupt wakes a ReadBatch blocked in the poller when its context ends.
func (l *Link) interrupt() {
	l.dlMu.Lock()
	defer l.dlMu.Unlock()
	if l.waiting {
		_ = l.conn.SetReadDeadline(time.Unix(1, 0))
		l.deadlineSet = true
	}
}

// ReadBatch waits for datagrams and calls fn with up to Options.Batch
// received buffers of them (each a run of up to 64 datagrams with GRO) as
// synthesized Ethernet frames, valid only during fn. Concurrent calls are
// serialized (they share the receive buffers).
func (l *Link) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, link.ErrClosed
		}
		l.resetRecv()
		if err := l.rc.Read(l.tryRecvFn); err != nil {
			return 0, l.mapErr(err)
		}
		if l.rerr == unix.EAGAIN {
			if err := l.wait(ctx); err != nil {
				return 0, err
			}
		}
		switch l.rerr {
		case nil:
			if n := l.deliver(fn); n > 0 {
				return n, nil
			}
		case unix.EAGAIN, unix.EINTR:
		default:
			return 0, fmt.Errorf("udplink: recvmmsg: %w", l.rerr)
		}
	}
}

// wait blocks in the poller until recvmmsg succeeds or fails for a reason
// other than EAGAIN, ctx ends or the link is closed.
func (l *Link) wait(ctx context.Context) error {
	stale, err := l.readCtx(ctx, l.recvFn)
	if stale {
		l.rerr = unix.EAGAIN // a stale interrupt: try again
	}
	return err
}

// readCtx runs a raw read of the socket (fn as in syscall.RawConn.Read),
// ending it early when ctx ends by a read-deadline interrupt. It reports
// stale when a deadline ended the read while ctx had not: a late interrupt
// of an earlier call, after which the caller looks again.
func (l *Link) readCtx(ctx context.Context, fn func(fd uintptr) bool) (stale bool, err error) {
	if ctx.Done() == nil {
		if err := l.rc.Read(fn); err != nil {
			return false, l.mapErr(err)
		}
		return false, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	l.dlMu.Lock()
	l.waiting = true
	l.dlMu.Unlock()
	stop := context.AfterFunc(ctx, l.interruptFn)
	err = l.rc.Read(fn)
	stop()
	// An interrupt that already started (this call's, or a late one from
	// an earlier call) either set the deadline before this point, and it
	// is cleared here, or finds waiting false and does nothing.
	l.dlMu.Lock()
	l.waiting = false
	if l.deadlineSet {
		_ = l.conn.SetReadDeadline(time.Time{})
		l.deadlineSet = false
	}
	l.dlMu.Unlock()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if cerr := ctx.Err(); cerr != nil {
				return false, cerr
			}
			return true, nil
		}
		return false, l.mapErr(err)
	}
	return false, nil
}

func (l *Link) mapErr(err error) error {
	if l.closed.Load() || errors.Is(err, net.ErrClosed) {
		return link.ErrClosed
	}
	return fmt.Errorf("udplink: %w", err)
}

// deliver turns the received datagrams into frames and hands them to fn.
func (l *Link) deliver(fn func(frames [][]byte)) int {
	if l.off.gro {
		return l.deliverGRO(fn)
	}
	frames := l.frames[:0]
	for i := 0; i < l.rn; i++ {
		m := &l.rmsgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			l.truncated.Add(1)
			continue
		}
		plen := int(m.Len)
		h := link.Header{Dst: l.macArr, TTL: synthTTL, DF: true, DstPort: l.port, DstAddr: l.addr}
		if !l.synthAddrs(i, &h) {
			continue
		}
		l.rxh.set(&h)
		hs := l.rxh.size()
		buf := l.rbufs[i]
		l.rxh.put(buf[headroom-hs:headroom], plen)
		frames = append(frames, buf[headroom-hs:headroom+plen])
	}
	l.frames = frames
	if len(frames) == 0 {
		return 0
	}
	fn(frames)
	clear(frames)
	return len(frames)
}

// synthAddrs fills the source from the sender address and the destination
// and TOS from the control messages of datagram i.
func (l *Link) synthAddrs(i int, h *link.Header) bool {
	name := &l.rnames[i]
	switch name.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		h.SrcAddr = netip.AddrFrom4(sa.Addr)
		h.SrcPort = uint16(p[0])<<8 | uint16(p[1])
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&name.Port))
		h.SrcAddr = netip.AddrFrom16(name.Addr)
		h.SrcPort = uint16(p[0])<<8 | uint16(p[1])
	default:
		return false
	}
	oob := l.roob[i*oobSize : i*oobSize+int(l.rmsgs[i].Hdr.Controllen)]
	for {
		c, rest, ok := sys.NextCmsg(oob)
		if !ok {
			break
		}
		oob = rest
		switch {
		case c.Level == unix.IPPROTO_IP && c.Type == unix.IP_PKTINFO && len(c.Data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&c.Data[0]))
			h.DstAddr = netip.AddrFrom4(pi.Addr)
		case c.Level == unix.IPPROTO_IP && c.Type == unix.IP_TOS && len(c.Data) >= 1:
			h.TOS = c.Data[0]
		case c.Level == unix.IPPROTO_IPV6 && c.Type == unix.IPV6_PKTINFO && len(c.Data) >= unix.SizeofInet6Pktinfo:
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&c.Data[0]))
			h.DstAddr = netip.AddrFrom16(pi.Addr)
		case c.Level == unix.IPPROTO_IPV6 && c.Type == unix.IPV6_TCLASS && len(c.Data) >= 4:
			h.TOS = uint8(*(*int32)(unsafe.Pointer(&c.Data[0])))
		}
	}
	return h.SrcAddr.Is4() == h.DstAddr.Is4()
}

// WriteBatch sends the UDP payload of each frame to the frame's destination
// address and port. A frame that is not a well-formed IPv4/IPv6 UDP frame of
// the link's family, from the link's address and port, is refused with a
// FrameError (errors.Is: link.ErrMalformed, link.ErrRefused; ErrTooLarge
// when the kernel reports it exceeds the path MTU; link.ReasonOf gives the
// detail); the frames before it are
// sent, and n counts them.
func (l *Link) WriteBatch(frames [][]byte) (n int, err error) {
	if l.closed.Load() {
		return 0, link.ErrClosed
	}
	s := l.sender()
	defer s.mu.Unlock()
	gso := l.off.gso.Load()
	single := 0       // frames[:single] go one per message (a refused run)
	var refused error // why the kernel refused that run
	for n < len(frames) {
		nf, nm, bad := s.fillChunk(frames[n:], single-n, gso)
		s.wcount, s.wsent, s.werr = nm, 0, nil
		if nm > 0 {
			if err := l.rc.Write(s.sendFn); err != nil {
				s.clearSend(nf)
				return n + s.framesBefore(s.wsent, nm, nf), l.mapErr(err)
			}
		}
		s.clearSend(nf)
		s.countRuns(s.wsent)
		sent := s.framesBefore(s.wsent, nm, nf)
		if s.werr != nil {
			if r := &s.runs[s.wsent]; r.count > 1 {
				// Resend the run's datagrams one by one: either they
				// fail on their own (the error is then theirs) or the
				// kernel refuses to segment.
				l.off.gsoFallbacks.Add(1)
				n += sent
				single, refused = n+r.count, s.werr
				continue
			}
			e := s.werr
			if e == unix.EMSGSIZE {
				e = link.ErrTooLarge
			}
			return n + sent, &link.FrameError{Index: n + sent, Err: e}
		}
		n += sent
		if refused != nil && n >= single {
			if gsoRefused(refused) {
				l.off.gso.Store(false)
				gso = false
			}
			refused = nil
		}
		if bad != nil {
			return n, &link.FrameError{Index: n, Err: bad}
		}
	}
	return n, nil
}

func (s *sender) send(fd uintptr) bool {
	for s.wsent < s.wcount {
		k, err := sys.Sendmmsg(int(fd), s.wmsgs[s.wsent:s.wcount], unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return false
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.werr = err
			return true
		}
		s.wsent += k
	}
	return true
}

// clearSend drops the references to the caller's frames.
func (s *sender) clearSend(count int) {
	for i := 0; i < count; i++ {
		s.wiovs[i].Base = nil
	}
}

// check parses frame and refuses what the link cannot send.
func (l *Link) check(frame []byte) (link.Frame, error) {
	return checkFrame(frame, l.v6, l.wildcard, l.addr, l.port)
}

// prepare fills send message k with frame, checked, as iovec j.
func (s *sender) prepare(k, j int, frame []byte, f *link.Frame) {
	m := &s.wmsgs[k].Hdr
	name := &s.wnames[k]
	oob := s.woob[k*oobSize : (k+1)*oobSize]
	off := 0
	if f.Version == 4 {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
		sa.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(f.DstPort>>8), byte(f.DstPort)
		sa.Addr = f.Dst.As4()
		m.Namelen = unix.SizeofSockaddrInet4
		if s.l.wildcard {
			d, sp := sys.PutCmsg(oob, unix.IPPROTO_IP, unix.IP_PKTINFO, unix.SizeofInet4Pktinfo)
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&d[0]))
			pi.Spec_dst = f.Src.As4()
			off += sp
		}
		if f.TOS != s.l.tos {
			d, sp := sys.PutCmsg(oob[off:], unix.IPPROTO_IP, unix.IP_TOS, 4)
			*(*int32)(unsafe.Pointer(&d[0])) = int32(f.TOS)
			off += sp
		}
	} else {
		name.Family = unix.AF_INET6
		p := (*[2]byte)(unsafe.Pointer(&name.Port))
		p[0], p[1] = byte(f.DstPort>>8), byte(f.DstPort)
		name.Addr = f.Dst.As16()
		name.Scope_id = 0
		if f.Dst.IsLinkLocalUnicast() {
			name.Scope_id = s.l.scope
		}
		m.Namelen = unix.SizeofSockaddrInet6
		if s.l.wildcard {
			d, sp := sys.PutCmsg(oob, unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, unix.SizeofInet6Pktinfo)
			pi := (*unix.Inet6Pktinfo)(unsafe.Pointer(&d[0]))
			pi.Addr = f.Src.As16()
			off += sp
		}
		if f.TOS != s.l.tos {
			d, sp := sys.PutCmsg(oob[off:], unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 4)
			*(*int32)(unsafe.Pointer(&d[0])) = int32(f.TOS)
			off += sp
		}
	}
	if off > 0 {
		m.Control = &oob[0]
	} else {
		m.Control = nil
	}
	m.SetControllen(off)
	iov := &s.wiovs[j]
	if f.End > f.Payload {
		iov.Base = &frame[f.Payload]
	} else {
		iov.Base = nil
	}
	iov.SetLen(f.End - f.Payload)
	m.Iov = iov
	m.SetIovlen(1)
	s.startRun(k, j, off, frame, f)
}

// SetDefaultTOS makes tos the TOS (IPv4) or traffic class (IPv6) of the
// socket (link.TOSDefaulter): frames that carry it leave without the
// IP_TOS or IPV6_TCLASS control message a frame with any other TOS gets.
// A device with congestion control on sets ECT(0), which its data packets
// carry.
func (l *Link) SetDefaultTOS(tos uint8) error {
	l.lockSenders()
	defer l.unlockSenders()
	if l.closed.Load() {
		return link.ErrClosed
	}
	level, name, what := unix.IPPROTO_IP, unix.IP_TOS, "IP_TOS"
	if l.v6 {
		level, name, what = unix.IPPROTO_IPV6, unix.IPV6_TCLASS, "IPV6_TCLASS"
	}
	var serr error
	if err := l.rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), level, name, int(tos))
	}); err != nil {
		return l.mapErr(err)
	}
	if serr != nil {
		return fmt.Errorf("udplink: setsockopt %s: %w", what, serr)
	}
	l.tos = tos
	return nil
}

// LocalAddr returns the bound address and port.
func (l *Link) LocalAddr() netip.AddrPort { return netip.AddrPortFrom(l.addr, l.port) }

// ServesAddr reports whether addr is the link's address, or of its family
// when the link is bound to the wildcard address (link.AddrServer). A
// socket bound to one family neither sends from nor receives on the other.
func (l *Link) ServesAddr(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	if l.wildcard {
		return addr.Is6() == l.v6
	}
	return addr == l.addr
}

// Stats returns the drop and offload counters.
func (l *Link) Stats() Stats {
	s := Stats{
		GSO:          l.off.gso.Load(),
		GRO:          l.off.gro,
		GSOSends:     l.off.gsoSends.Load(),
		GSODatagrams: l.off.gsoDatagrams.Load(),
		GSOFallbacks: l.off.gsoFallbacks.Load(),
		Queues:       len(l.queues),
		Steered:      l.steer,
	}
	s.QueueBuffers = make([]uint64, len(l.queues))
	for i, q := range l.queues {
		s.QueueBuffers[i] = q.buffers.Load()
		s.Truncated += q.truncated.Load()
		s.GROBuffers += q.off.groBuffers.Load()
		s.GRODatagrams += q.off.groDatagrams.Load()
		s.GROCopied += q.off.groCopied.Load()
	}
	return s
}

// MTU returns the MTU of the interface holding the bound address (1500
// when bound to a wildcard).
func (l *Link) MTU() int { return l.mtu }

// HardwareAddr returns the MAC of that interface (zero on loopback or a
// wildcard); it is the destination MAC of synthesized frames.
func (l *Link) HardwareAddr() net.HardwareAddr { return l.mac }

// Info reports a synthetic kernel UDP link.
func (l *Link) Info() link.Info {
	return link.Info{Kind: link.KindUDP, Name: l.name, Synthetic: true, UncheckedICRC: !l.v6, FixedSourcePort: l.port, IPIDZero: !l.v6}
}

// Close closes the socket; blocked ReadBatch calls return link.ErrClosed,
// as does a second Close.
func (l *Link) Close() error {
	if l.closed.Swap(true) {
		return link.ErrClosed
	}
	var err error
	for _, q := range l.queues[1:] {
		if q.closed.Swap(true) {
			continue
		}
		q.wakeSleepers()
		if cerr := q.conn.Close(); err == nil {
			err = cerr
		}
	}
	l.wakeSleepers()
	if cerr := l.conn.Close(); cerr != nil {
		err = cerr
	}
	return err
}
