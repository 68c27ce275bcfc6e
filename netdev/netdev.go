package netdev

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

// LinkKind selects the packet link Open uses.
type LinkKind int

const (
	// LinkAuto tries AF_XDP and falls back to the kernel UDP link.
	LinkAuto LinkKind = iota
	// LinkXDP requires AF_XDP; Open fails if it is unavailable.
	LinkXDP
	// LinkUDP uses a kernel UDP socket (no root needed).
	LinkUDP
)

func (k LinkKind) String() string {
	switch k {
	case LinkAuto:
		return "auto"
	case LinkXDP:
		return "xdp"
	case LinkUDP:
		return "udp"
	}
	return fmt.Sprintf("LinkKind(%d)", int(k))
}

// Options configure Open. The zero value is right for most uses.
type Options struct {
	// Device configures the device itself. Open sets Interface, Host and
	// Fallback; Port is also the port the kernel UDP link binds and the
	// AF_XDP steering program matches (default 4791).
	Device roce.Options
	// Link selects the link (default: AF_XDP, falling back to UDP).
	Link LinkKind
	// XDP tunes the AF_XDP link (queue, frame size, mode). When the
	// interface MTU does not fit a 4096-byte UMEM frame, Open turns on
	// Multibuffer itself.
	//
	// XDP.BusyPoll turns on the kernel's preferred busy polling
	// (SO_PREFER_BUSY_POLL, Linux 5.11): a waiter that finds the RX ring
	// empty then runs the device's NAPI poll in a recvfrom of its own.
	// It is off by default (0 or negative): on veth, where the sender's
	// sendto already runs the receiver's NAPI poll, it did not lower the
	// send-lat minimum, and on a loaded host it raised the average, the
	// p99 and the CPU time of a ping-pong two- to fourfold, a system call
	// per empty poll (see README.md). It may pay off on a NIC whose
	// interrupts are deferred (napi_defer_hard_irqs, gro_flush_timeout).
	//
	// Off Linux there is no AF_XDP: XDPOptions is empty, LinkXDP fails
	// with errors.ErrUnsupported and LinkAuto uses the UDP link.
	XDP XDPOptions
	// UDPAddr is the local address the kernel UDP link binds (default: the
	// interface's first IPv4 address, else its first non-link-local IPv6
	// address).
	UDPAddr netip.Addr
	// UDPQueues is the number of receive queues of the kernel UDP link
	// (udplink.Options.Queues; 0: one), each read by a goroutine of the
	// device. As many transmit shards (Options.Device.Shards) keep each
	// QP's receive and transmit on the same queue.
	UDPQueues int
}

// Open opens a device on interface ifname: AF_XDP by default, the kernel UDP
// link with Options.Link = LinkUDP or when AF_XDP is unavailable (the reason
// is logged and reported in Info().Fallback). The device follows the
// interface through rtnetlink (see OpenLink). It must be called from a thread
// in the interface's network namespace (the netlink watchers bind there); the
// Device may then be used from anywhere. ctx bounds the setup.
func Open(ctx context.Context, ifname string, opts Options) (*roce.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("netdev: interface %q: %w", ifname, err)
	}
	dopts := opts.Device
	log := dopts.Logger
	if log == nil {
		log = slog.Default()
	}
	var l link.Link
	fallback := ""
	if opts.Link == LinkAuto || opts.Link == LinkXDP {
		xl, err := openXDP(ifi, opts.XDP, dopts.Port)
		if err != nil {
			if opts.Link == LinkXDP {
				return nil, fmt.Errorf("netdev: AF_XDP on %s: %w", ifname, err)
			}
			fallback = err.Error()
			log.Warn("netdev: AF_XDP unavailable, falling back to the kernel UDP link", "interface", ifname, "err", err)
		} else {
			l = xl
		}
	}
	if l == nil {
		addr := opts.UDPAddr
		if !addr.IsValid() {
			addr = preferredAddr(ifi)
			if !addr.IsValid() {
				return nil, fmt.Errorf("netdev: %s: %w", ifname, roce.ErrNoAddress)
			}
		}
		port := dopts.Port
		if port == 0 {
			port = ib.RoCEv2Port
		}
		ul, err := udplink.ListenOptions(netip.AddrPortFrom(addr, port), udplink.Options{Queues: opts.UDPQueues})
		if err != nil {
			return nil, fmt.Errorf("netdev: UDP link on %s: %w", ifname, err)
		}
		l = ul
	}
	dopts.Logger = log
	dopts.Fallback = fallback
	d, err := OpenLink(l, ifname, dopts)
	if err != nil {
		l.Close()
		return nil, err
	}
	return d, nil
}

// OpenLink opens a device over l, an open link on interface ifname (a link
// Open would not pick, or one wrapped by the caller), that follows ifname as
// Open's devices do: the interface's addresses make the GID table, its MTU
// and carrier the port, and its kernel neighbour table resolves MAC
// addresses, all through rtnetlink (opts.Interface and opts.Host are set
// here). It must be called from a thread in the interface's network
// namespace. As with roce.OpenLink, the device owns l; if OpenLink fails,
// the caller still owns it.
func OpenLink(l link.Link, ifname string, opts roce.Options) (*roce.Device, error) {
	h, err := openHost(ifname)
	if err != nil {
		return nil, err
	}
	opts.Interface = ifname
	opts.Host = h
	d, err := roce.OpenLink(l, opts)
	if err != nil {
		h.Close()
		return nil, err
	}
	return d, nil
}

// preferredAddr is the address the UDP link binds by default: the first
// IPv4 address, else the first IPv6 address that is not link-local (a
// link-local one would need a zone the GID does not carry).
func preferredAddr(ifi *net.Interface) netip.Addr {
	list, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}
	}
	var v6 netip.Addr
	for _, a := range list {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() {
			return ip
		}
		if !v6.IsValid() && !ip.IsLinkLocalUnicast() {
			v6 = ip
		}
	}
	return v6
}
