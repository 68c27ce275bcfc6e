package roce

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// neighbours caches resolved MACs for the data path. The cache is a
// copy-on-write map so lookups take no lock.
type neighbours struct {
	static    map[netip.Addr][6]byte
	host      Host
	synthetic bool
	mu        sync.Mutex
	cache     atomic.Pointer[map[netip.Addr][6]byte]
	hops      map[netip.Addr]netip.Addr // destination → next hop, under mu
}

func newNeighbours(static map[netip.Addr]net.HardwareAddr, host Host, synthetic bool) *neighbours {
	n := &neighbours{static: make(map[netip.Addr][6]byte), host: host, synthetic: synthetic,
		hops: make(map[netip.Addr]netip.Addr)}
	for a, m := range static {
		var mac [6]byte
		copy(mac[:], m)
		n.static[a.Unmap()] = mac
	}
	empty := map[netip.Addr][6]byte{}
	n.cache.Store(&empty)
	return n
}

// lookup is the data-path lookup; it never blocks.
func (n *neighbours) lookup(dst netip.Addr) ([6]byte, bool) {
	if n.synthetic {
		// The kernel builds the link-layer header of a UDP link.
		return [6]byte{}, true
	}
	if m, ok := n.static[dst]; ok {
		return m, true
	}
	m, ok := (*n.cache.Load())[dst]
	return m, ok
}

// resolve finds the MAC for dst and caches it for the data path.
func (n *neighbours) resolve(ctx context.Context, dst netip.Addr) ([6]byte, error) {
	dst = dst.Unmap()
	if m, ok := n.lookup(dst); ok {
		return m, nil
	}
	if n.host == nil {
		return [6]byte{}, fmt.Errorf("%w: %v: no static entry and no interface to ask", ErrNoNeighbour, dst)
	}
	m, nh, err := n.host.Resolve(ctx, dst)
	if err != nil {
		return m, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hops[dst] = nh
	n.storeLocked(map[netip.Addr][6]byte{dst: m})
	return m, nil
}

// storeLocked publishes a new cache with the entries of add changed.
func (n *neighbours) storeLocked(add map[netip.Addr][6]byte) {
	old := *n.cache.Load()
	nm := make(map[netip.Addr][6]byte, len(old)+len(add))
	for k, v := range old {
		nm[k] = v
	}
	for k, v := range add {
		nm[k] = v
	}
	n.cache.Store(&nm)
}

// update follows the host's neighbour table (HostEvents.NeighbourChanged):
// when the MAC of a next hop in use changes, every destination behind it
// moves with it.
func (n *neighbours) update(ip netip.Addr, mac [6]byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := *n.cache.Load()
	var add map[netip.Addr][6]byte
	for dst, nh := range n.hops {
		if nh == ip && cur[dst] != mac {
			if add == nil {
				add = make(map[netip.Addr][6]byte)
			}
			add[dst] = mac
		}
	}
	if add != nil {
		n.storeLocked(add)
	}
}

// ResolveNeighbour returns the MAC address packets to addr are sent to (the
// next hop's), resolving it through Options.Host (ARP/ND) if needed, and waits
// at most until ctx ends. On the kernel UDP link, which leaves link-layer
// headers to the kernel, it returns a zero MAC at once.
func (d *Device) ResolveNeighbour(ctx context.Context, addr netip.Addr) (net.HardwareAddr, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	m, err := d.neigh.resolve(ctx, addr)
	if err != nil {
		d.ctr.noNeighbour.Add(1)
		return nil, err
	}
	return net.HardwareAddr(m[:]), nil
}
