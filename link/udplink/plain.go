package udplink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/goroce/goroce/internal/linkerr"
	"github.com/goroce/goroce/link"
)

// PlainLink is the kernel UDP link in portable Go: one datagram per system
// call through net.UDPConn, no sendmmsg/recvmmsg and no GSO/GRO (its Stats
// say so). It is what Listen opens on systems other than Linux, where Link
// is PlainLink; on Linux, ListenPlain opens one (tests, comparison).
//
// Received datagrams get the same synthesized Ethernet + IP + UDP header as
// on Linux, with two differences: the TOS (IPv4) is reported as 0, and so
// ECN marks are not seen, and the traffic class (IPv6) only on a wildcard
// address. The destination of a datagram is the bound address; on a
// wildcard address it is read from the datagram's control messages
// (golang.org/x/net/ipv4 and ipv6: Linux, the BSDs, darwin). Windows does
// not report it, so there the link must be bound to a specific address.
// The socket sets no don't-fragment bit of its own, so a datagram over the
// path MTU may be fragmented rather than refused with link.ErrTooLarge.
type PlainLink struct {
	conn     *net.UDPConn
	p4       *ipv4.PacketConn // wildcard IPv4: addresses in control messages
	p6       *ipv6.PacketConn // wildcard IPv6: the same
	addr     netip.Addr       // bound address, unmapped, no zone
	zone     string           // of a link-local bound address
	port     uint16
	v6       bool
	wildcard bool
	mtu      int
	mac      net.HardwareAddr
	macArr   [6]byte
	name     string
	maxDgram int
	closed   atomic.Bool

	readMu sync.Mutex // guards the receive state below
	rbuf   []byte
	frames [][]byte
	rxh    rxHeader

	dlMu        sync.Mutex // orders context interrupts against their cleanup
	waiting     bool
	deadlineSet bool

	writeMu sync.Mutex // guards tos
	tos     uint8      // the socket's TOS / traffic class

	truncated atomic.Uint64
}

var (
	_ link.Link       = (*PlainLink)(nil)
	_ link.AddrServer = (*PlainLink)(nil)
)

// ListenPlain opens a PlainLink on addr, as ListenOptions does a Link: port
// 0 means DefaultPort unless opts.EphemeralPort, the family of addr is the
// link's. Options.Batch, DisableGSO and DisableGRO do not apply.
func ListenPlain(addr netip.AddrPort, opts Options) (*PlainLink, error) {
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
	l := &PlainLink{addr: ip, zone: zone, v6: ip.Is6(), wildcard: ip.IsUnspecified(), maxDgram: opts.MaxDatagram}
	network := "udp4"
	if l.v6 {
		network = "udp6"
	}
	conn, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip.WithZone(zone), port)))
	if err != nil {
		return nil, fmt.Errorf("udplink: %w", err)
	}
	l.conn = conn
	// Bigger buffers absorb bursts; failure only costs performance.
	_ = conn.SetReadBuffer(opts.SocketBuffer)
	_ = conn.SetWriteBuffer(opts.SocketBuffer)
	if l.wildcard {
		if l.v6 {
			l.p6 = ipv6.NewPacketConn(conn)
			err = l.p6.SetControlMessage(ipv6.FlagDst|ipv6.FlagTrafficClass, true)
		} else {
			l.p4 = ipv4.NewPacketConn(conn)
			err = l.p4.SetControlMessage(ipv4.FlagDst, true)
		}
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("udplink: a wildcard address needs the destination address of each datagram, which %s does not report (%w): bind a specific address", runtime.GOOS, err)
		}
	}
	l.port = conn.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	l.mtu, l.mac = interfaceOf(ip)
	if l.wildcard && opts.WildcardMTU > 0 {
		l.mtu = opts.WildcardMTU
	}
	copy(l.macArr[:], l.mac)
	l.name = netip.AddrPortFrom(ip, l.port).String()
	// One byte more than the largest datagram tells a longer one.
	l.rbuf = make([]byte, headroom+opts.MaxDatagram+1)
	l.frames = make([][]byte, 1)
	return l, nil
}

// ReadBatch waits for a datagram and calls fn with it as a synthesized
// Ethernet frame, valid only during fn: one frame per call. Concurrent
// calls are serialized (they share the receive buffer).
func (l *PlainLink) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	for {
		if l.closed.Load() {
			return 0, link.ErrClosed
		}
		h := link.Header{Dst: l.macArr, TTL: synthTTL, DF: true, DstPort: l.port, DstAddr: l.addr}
		n, stale, err := l.readCtx(ctx, &h)
		if err != nil {
			return 0, err
		}
		if stale {
			continue
		}
		if n > l.maxDgram {
			l.truncated.Add(1)
			continue
		}
		if h.SrcAddr.Is4() != h.DstAddr.Is4() || !h.DstAddr.IsValid() {
			continue
		}
		l.rxh.set(&h)
		hs := l.rxh.size()
		l.rxh.put(l.rbuf[headroom-hs:headroom], n)
		l.frames[0] = l.rbuf[headroom-hs : headroom+n]
		fn(l.frames)
		l.frames[0] = nil
		return 1, nil
	}
}

// readCtx reads one datagram into rbuf behind the headroom and fills the
// addresses of h, ending the read early when ctx ends by a read-deadline
// interrupt. It reports stale when a deadline ended the read while ctx had
// not (a late interrupt of an earlier call): the caller reads again.
func (l *PlainLink) readCtx(ctx context.Context, h *link.Header) (n int, stale bool, err error) {
	if ctx.Done() == nil {
		n, err = l.read(h)
		return n, false, err
	}
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	l.dlMu.Lock()
	l.waiting = true
	l.dlMu.Unlock()
	stop := context.AfterFunc(ctx, l.interrupt)
	n, err = l.read(h)
	stop()
	l.dlMu.Lock()
	l.waiting = false
	if l.deadlineSet {
		_ = l.conn.SetReadDeadline(time.Time{})
		l.deadlineSet = false
	}
	l.dlMu.Unlock()
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := ctx.Err(); cerr != nil {
			return 0, false, cerr
		}
		return 0, true, nil
	}
	return n, false, err
}

// interrupt wakes a ReadBatch blocked in the read when its context ends.
func (l *PlainLink) interrupt() {
	l.dlMu.Lock()
	defer l.dlMu.Unlock()
	if l.waiting {
		_ = l.conn.SetReadDeadline(time.Unix(1, 0))
		l.deadlineSet = true
	}
}

// read receives one datagram and sets the source, and on a wildcard
// address the destination, of h.
func (l *PlainLink) read(h *link.Header) (int, error) {
	buf := l.rbuf[headroom:]
	var (
		n   int
		src netip.AddrPort
		err error
	)
	switch {
	case l.p4 != nil:
		var cm *ipv4.ControlMessage
		var from net.Addr
		n, cm, from, err = l.p4.ReadFrom(buf)
		if err == nil {
			h.DstAddr = netip.Addr{}
			if cm != nil {
				h.DstAddr, _ = netip.AddrFromSlice(cm.Dst)
			}
			src = udpAddrPort(from)
		}
	case l.p6 != nil:
		var cm *ipv6.ControlMessage
		var from net.Addr
		n, cm, from, err = l.p6.ReadFrom(buf)
		if err == nil {
			h.DstAddr = netip.Addr{}
			if cm != nil {
				h.DstAddr, _ = netip.AddrFromSlice(cm.Dst)
				h.TOS = uint8(cm.TrafficClass)
			}
			src = udpAddrPort(from)
		}
	default:
		n, src, err = l.conn.ReadFromUDPAddrPort(buf)
	}
	if err != nil {
		return 0, l.mapErr(err)
	}
	h.DstAddr = h.DstAddr.Unmap().WithZone("")
	h.SrcAddr = src.Addr().Unmap().WithZone("")
	h.SrcPort = src.Port()
	return n, nil
}

func udpAddrPort(a net.Addr) netip.AddrPort {
	if u, ok := a.(*net.UDPAddr); ok {
		return u.AddrPort()
	}
	return netip.AddrPort{}
}

func (l *PlainLink) mapErr(err error) error {
	if l.closed.Load() || errors.Is(err, net.ErrClosed) {
		return link.ErrClosed
	}
	return fmt.Errorf("udplink: %w", err)
}

// WriteBatch sends the UDP payload of each frame to the frame's destination
// address and port, one datagram per system call. Frames are refused as
// Link.WriteBatch refuses them (a FrameError; the frames before it are
// sent, and n counts them).
func (l *PlainLink) WriteBatch(frames [][]byte) (n int, err error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if l.closed.Load() {
		return 0, link.ErrClosed
	}
	for n < len(frames) {
		frame := frames[n]
		f, err := l.check(frame)
		if err != nil {
			return n, &link.FrameError{Index: n, Err: err}
		}
		if err := l.send(frame[f.Payload:f.End], &f); err != nil {
			if errors.Is(err, net.ErrClosed) || l.closed.Load() {
				return n, link.ErrClosed
			}
			if errors.Is(err, syscall.EMSGSIZE) {
				err = link.ErrTooLarge
			}
			return n, &link.FrameError{Index: n, Err: err}
		}
		n++
	}
	return n, nil
}

func (l *PlainLink) send(payload []byte, f *link.Frame) error {
	if f.TOS != l.tos {
		// The TOS is the socket's: set it when it changes (a failure
		// only loses the marking).
		if l.v6 {
			_ = ipv6.NewConn(l.conn).SetTrafficClass(int(f.TOS))
		} else {
			_ = ipv4.NewConn(l.conn).SetTOS(int(f.TOS))
		}
		l.tos = f.TOS
	}
	dst := f.Dst
	if l.v6 && dst.IsLinkLocalUnicast() && l.zone != "" {
		dst = dst.WithZone(l.zone)
	}
	to := netip.AddrPortFrom(dst, f.DstPort)
	var err error
	switch {
	case l.p4 != nil:
		_, err = l.p4.WriteTo(payload, &ipv4.ControlMessage{Src: f.Src.AsSlice()}, net.UDPAddrFromAddrPort(to))
	case l.p6 != nil:
		_, err = l.p6.WriteTo(payload, &ipv6.ControlMessage{Src: f.Src.AsSlice()}, net.UDPAddrFromAddrPort(to))
	default:
		_, err = l.conn.WriteToUDPAddrPort(payload, to)
	}
	return err
}

// check parses frame and refuses what the link cannot send.
func (l *PlainLink) check(frame []byte) (link.Frame, error) {
	return checkFrame(frame, l.v6, l.wildcard, l.addr, l.port)
}

// checkFrame parses frame and refuses what a socket bound to addr:port
// (IPv6 or not, wildcard or not) cannot send: another family, another
// source port, another source address. Both links use it.
func checkFrame(frame []byte, v6, wildcard bool, addr netip.Addr, port uint16) (link.Frame, error) {
	f, err := link.ParseFrame(frame)
	if err != nil {
		return f, err
	}
	if (f.Version == 6) != v6 {
		return f, linkerr.Family
	}
	if f.SrcPort != port {
		return f, linkerr.SourcePort
	}
	if !wildcard && f.Src != addr {
		return f, linkerr.SourceAddr
	}
	return f, nil
}

// LocalAddr returns the bound address and port.
func (l *PlainLink) LocalAddr() netip.AddrPort { return netip.AddrPortFrom(l.addr, l.port) }

// ServesAddr reports whether addr is the link's address, or of its family
// when the link is bound to the wildcard address (link.AddrServer).
func (l *PlainLink) ServesAddr(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	if l.wildcard {
		return addr.Is6() == l.v6
	}
	return addr == l.addr
}

// Stats returns the drop counter; GSO and GRO are always off.
func (l *PlainLink) Stats() Stats {
	return Stats{Truncated: l.truncated.Load()}
}

// MTU returns the MTU of the interface holding the bound address (1500
// when bound to a wildcard).
func (l *PlainLink) MTU() int { return l.mtu }

// HardwareAddr returns the MAC of that interface (zero on loopback or a
// wildcard); it is the destination MAC of synthesized frames.
func (l *PlainLink) HardwareAddr() net.HardwareAddr { return l.mac }

// Info reports a synthetic kernel UDP link. Only Linux is known to send
// IPv4 ID 0 from an unconnected socket.
func (l *PlainLink) Info() link.Info {
	return link.Info{Kind: link.KindUDP, Name: l.name, Synthetic: true, UncheckedICRC: !l.v6, FixedSourcePort: l.port, IPIDZero: !l.v6 && runtime.GOOS == "linux"}
}

// Close closes the socket; blocked ReadBatch calls return link.ErrClosed,
// as does a second Close.
func (l *PlainLink) Close() error {
	if l.closed.Swap(true) {
		return link.ErrClosed
	}
	return l.conn.Close()
}
