package roce

import (
	"context"
	"net/netip"
)

// Host is the host side of the network interface a device runs on: it
// resolves neighbours and reports the interface's addresses, MTU, carrier and
// neighbour changes. The device never asks the operating system itself, so it
// builds anywhere; package netdev implements Host over rtnetlink and passes
// it in Options.Host, as wireguard-go's tun.Device reports its events to the
// device that reads it and gVisor's link resolvers answer for its stack.
//
// The device owns its Host once OpenLink succeeds and closes it on Close.
type Host interface {
	// Follow starts reporting the interface to ev, until ctx ends or the
	// Host is closed. Before it returns it calls ev.AddrsChanged with the
	// current addresses, so the GID table is complete when OpenLink
	// returns; later changes come from goroutines of the Host's own.
	Follow(ctx context.Context, ev HostEvents) error
	// Resolve returns the MAC address of the next hop towards dst, and
	// that next hop (dst itself or its gateway), asking the host to
	// resolve it (ARP, ND) if it has no entry. It waits at most until ctx
	// ends or the Host is closed (then ErrClosed); a failure wraps
	// ErrNoNeighbour.
	Resolve(ctx context.Context, dst netip.Addr) (mac [6]byte, nextHop netip.Addr, err error)
	// Close stops following and makes Resolve return.
	Close() error
}

// HostEvents receives what a Host reports. The device implements it. A
// Host may call it from any goroutine but makes the calls of each method
// one at a time, and stops calling once Follow's context ended.
type HostEvents interface {
	// AddrsChanged gives the interface's addresses, IPv4 first, each
	// family in the host's order: the GID table follows them.
	AddrsChanged(addrs []netip.Addr)
	// LinkChanged gives the interface's IP MTU and whether it is up (its
	// carrier): the active MTU and the port state follow them.
	LinkChanged(mtu int, up bool)
	// NeighbourChanged gives a valid neighbour entry that is new or has a
	// new MAC: destinations behind that next hop move with it.
	NeighbourChanged(ip netip.Addr, mac [6]byte)
}

// hostEvents is the device's HostEvents, kept off Device's method set.
type hostEvents struct{ d *Device }

func (e hostEvents) AddrsChanged(addrs []netip.Addr) {
	d := e.d
	old := d.gids.Load()
	if err := d.setGIDTable(buildGIDTable(old, d.mac, d.servedAddrs(addrs))); err != nil {
		d.log.Warn("roce: link keeps its old address filter", "interface", d.info.Name, "err", err)
	}
	d.log.Debug("roce: GID table updated", "interface", d.info.Name, "addrs", addrs)
}

func (e hostEvents) LinkChanged(mtu int, up bool) { e.d.linkChanged(mtu, up) }

func (e hostEvents) NeighbourChanged(ip netip.Addr, mac [6]byte) { e.d.neigh.update(ip, mac) }
