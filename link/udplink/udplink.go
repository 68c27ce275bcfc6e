package udplink

import (
	"fmt"
	"net"
	"net/netip"
)

// DefaultPort is the RoCEv2 UDP port.
const DefaultPort = 4791

// Options tune a Link. The zero value is right for a device. Batch,
// DisableGSO and DisableGRO are Linux's; a PlainLink ignores them.
type Options struct {
	// EphemeralPort binds a kernel-chosen port when the address passed to
	// Listen has port 0, instead of DefaultPort (tests, benchmarks).
	EphemeralPort bool
	// Batch is the most datagrams, or runs of them with GSO/GRO, moved
	// per system call (default 64).
	Batch int
	// MaxDatagram is the largest UDP payload received (default 9216);
	// longer datagrams are dropped and counted in Stats.Truncated.
	MaxDatagram int
	// SocketBuffer sets SO_RCVBUF and SO_SNDBUF (default 4 MiB; the
	// *BUFFORCE variants are tried first so root is not capped by
	// net.core.rmem_max).
	SocketBuffer int
	// DisableGSO sends every datagram as its own sendmmsg entry instead of
	// a run of equal-size datagrams to one destination as one entry with
	// UDP_SEGMENT (Linux 4.18; without it the link does so anyway).
	DisableGSO bool
	// DisableGRO leaves UDP_GRO (Linux 5.0) off: the kernel then hands over
	// every datagram on its own, cutting runs a local sender kept whole.
	DisableGRO bool
	// WildcardMTU is the MTU a link bound to a wildcard address reports
	// (default 1500): no one interface holds that address. A link bound
	// to an address reports its interface's MTU whatever this says.
	WildcardMTU int
	// Queues is the number of receive queues (default 1, at most
	// MaxQueues; Linux only): sockets bound to the same address and port
	// with SO_REUSEPORT, among which a classic BPF program steers every
	// datagram by the destination QPN of its BTH, to queue QPN mod Queues.
	// A QP's packets therefore always arrive on one queue, in order, and
	// the queue matches the QP's transmit shard when a device has as many
	// shards (roce.Options.Shards). Each queue is a Link of its own
	// (RxQueues); the link itself reads only the first, so a reader must
	// read them all, as a device does (link.MultiQueue). Frames are sent
	// from the first. GRO is off on such a link: it joins datagrams of a
	// flow, which may carry several QPs (a peer on the kernel UDP link
	// sends all of them from one port), and the whole buffer would go to
	// the queue of its first datagram's QP. For the same reason a GSO run
	// never joins datagrams of two QPs, whatever the link's queues.
	Queues int
}

// MaxQueues is the most receive queues a Link takes (Options.Queues).
const MaxQueues = 64

const (
	defaultBatch        = 64
	defaultMaxDatagram  = 9216
	defaultSocketBuffer = 4 << 20
	// headroom in front of each receive buffer for the synthesized headers.
	headroom = 64
	// oobSize is the control-message space per datagram: PKTINFO + TOS.
	oobSize  = 128
	synthTTL = 64
)

// Stats counts datagrams the link dropped and the offloads' work.
type Stats struct {
	Truncated uint64 // received datagrams longer than MaxDatagram

	GSO          bool   // runs are sent with UDP_SEGMENT
	GRO          bool   // UDP_GRO is on
	GSOSends     uint64 // sendmmsg entries that carried a run of datagrams
	GSODatagrams uint64 // datagrams in those runs
	GSOFallbacks uint64 // runs the kernel refused, resent one datagram at a time
	GROBuffers   uint64 // received buffers holding a coalesced run
	GRODatagrams uint64 // datagrams split out of them
	GROCopied    uint64 // of those, datagrams copied behind a header (the rest stayed where the kernel put them)

	Queues  int  // receive queues (Options.Queues)
	Steered bool // with several, a BPF program steers them by QPN (else the kernel's flow hash)
	// QueueBuffers counts the buffers read from each queue's socket (a
	// datagram, or a run of them with GRO).
	QueueBuffers []uint64
}

func interfaceByIndex(zone string) (*net.Interface, error) {
	var i int
	if _, err := fmt.Sscanf(zone, "%d", &i); err != nil {
		return nil, fmt.Errorf("no interface %q", zone)
	}
	return net.InterfaceByIndex(i)
}

// interfaceOf returns the MTU and MAC of the interface packets from ip
// leave by, or 1500 and a zero MAC when ip is a wildcard or on no
// interface.
func interfaceOf(ip netip.Addr) (int, net.HardwareAddr) {
	zero := make(net.HardwareAddr, 6)
	if ip.IsUnspecified() {
		return 1500, zero
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return 1500, zero
	}
	cands := make([]ifaceAddrs, 0, len(ifs))
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		c := ifaceAddrs{mtu: ifc.MTU, mac: ifc.HardwareAddr, loopback: ifc.Flags&net.FlagLoopback != 0}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				c.prefixes = append(c.prefixes, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()))
			}
		}
		cands = append(cands, c)
	}
	i := pickInterface(ip, cands)
	if i < 0 {
		return 1500, zero
	}
	mac := zero
	if len(cands[i].mac) == 6 {
		mac = cands[i].mac
	}
	return cands[i].mtu, mac
}

// ifaceAddrs is what interfaceOf needs to know of one interface.
type ifaceAddrs struct {
	mtu      int
	mac      net.HardwareAddr
	loopback bool
	prefixes []netip.Prefix
}

// pickInterface returns the index of the interface ip belongs to, or -1.
// An address held exactly wins; otherwise the longest prefix containing
// ip, as the kernel's local table routes it: 127.0.0.2 is not listed on
// lo, but 127.0.0.1/8 is, and packets between loopback addresses go over
// lo with lo's MTU. A loopback address no prefix covers still belongs to
// the loopback interface.
func pickInterface(ip netip.Addr, ifs []ifaceAddrs) int {
	ip = ip.Unmap().WithZone("")
	best, bestBits := -1, -1
	for i, c := range ifs {
		for _, p := range c.prefixes {
			if p.Addr() == ip {
				return i
			}
			if p.Contains(ip) && p.Bits() > bestBits {
				best, bestBits = i, p.Bits()
			}
		}
	}
	if best < 0 && ip.IsLoopback() {
		for i, c := range ifs {
			if c.loopback {
				return i
			}
		}
	}
	return best
}
