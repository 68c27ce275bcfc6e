package udplink

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/link"
)

var _ link.MultiQueue = (*Link)(nil)

// Several receive queues (Options.Queues).
//
// The queues are sockets of one SO_REUSEPORT group. By default the kernel
// picks a group's socket by a hash of the datagram's addresses and ports,
// so one flow stays on one socket; the link steers by QP instead, with a
// classic BPF program the group runs on every datagram (Linux 4.5): it
// reads the destination QPN from the BTH, right behind the UDP header,
// and answers QPN mod Queues, the index of the socket in the group. Every
// packet for a QP then arrives on one queue, in order, whatever source
// port it carries, and that queue is the QP's transmit shard when the
// device has as many shards. A datagram too short to hold a BTH makes the
// program fail, which the kernel takes as queue 0, where the device
// counts it as a bad frame.
//
// SO_REUSEPORT lets any socket of the same user join the group, so a
// second process opening the same address would silently share the
// traffic instead of failing as it does on a link of one socket. The link
// therefore first binds the address without SO_REUSEPORT, which fails if
// anything holds it, and frees it just before the group binds; a link of
// several queues that another program then tries to open fails the same
// way.

// listenQueues opens a link of opts.Queues sockets.
func listenQueues(addr netip.AddrPort, opts Options) (*Link, error) {
	port, err := claimPort(addr, opts)
	if err != nil {
		return nil, err
	}
	addr = netip.AddrPortFrom(addr.Addr(), port)
	one := opts
	one.Queues = 1
	// GRO would join datagrams of different QPs that share a flow (a
	// peer that sends every QP's packets from one port, as this link
	// does) into one buffer, which the steering program would hand to
	// the queue of the first: each datagram must be steered on its own.
	one.DisableGRO = true
	first, err := listenSocket(addr, one, true)
	if err != nil {
		return nil, err
	}
	if err := first.steerByQPN(opts.Queues); err != nil {
		if !errors.Is(err, unix.ENOPROTOOPT) && !errors.Is(err, unix.EINVAL) {
			first.Close()
			return nil, err
		}
		// A kernel without SO_ATTACH_REUSEPORT_CBPF: the flow hash
		// still keeps each flow on one queue.
	}
	for len(first.queues) < opts.Queues {
		q, err := listenSocket(addr, one, true)
		if err != nil {
			first.Close()
			return nil, fmt.Errorf("udplink: queue %d: %w", len(first.queues), err)
		}
		first.queues = append(first.queues, q)
	}
	return first, nil
}

// claimPort checks that nothing holds addr by binding it without
// SO_REUSEPORT, and returns its port (the kernel's pick for an ephemeral
// one). The socket is closed before the group binds the port.
func claimPort(addr netip.AddrPort, opts Options) (uint16, error) {
	probe, err := listenSocket(addr, Options{EphemeralPort: opts.EphemeralPort, Batch: 1, MaxDatagram: 64, SocketBuffer: 4096, DisableGSO: true, DisableGRO: true}, false)
	if err != nil {
		return 0, err
	}
	port := probe.port
	probe.Close()
	return port, nil
}

// steerByQPN attaches the steering program to the group of l's socket.
func (l *Link) steerByQPN(queues int) error {
	prog := []unix.SockFilter{
		// A = the 32 bits at offset 4 of the BTH: reserved byte and
		// destination QPN (a load beyond the datagram fails: queue 0).
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xFFFFFF},
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(queues)},
		{Code: unix.BPF_RET | unix.BPF_A},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	var serr error
	if err := l.rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF, &fprog)
	}); err != nil {
		return l.mapErr(err)
	}
	if serr != nil {
		return fmt.Errorf("udplink: setsockopt SO_ATTACH_REUSEPORT_CBPF: %w", serr)
	}
	l.steer = true
	return nil
}

// RxQueues returns the link's receive queues, this link first
// (link.MultiQueue): each reads only its own socket.
func (l *Link) RxQueues() []link.Link {
	qs := make([]link.Link, len(l.queues))
	for i, q := range l.queues {
		qs[i] = q
	}
	return qs
}
