//go:build !linux

package netdev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/goroce/goroce/roce"
)

// host is the roce.Host of an interface where there is no rtnetlink to
// follow it through: its addresses are listed once, when the device opens,
// and neighbours are not resolved (the kernel UDP link, the only one off
// Linux, leaves link-layer headers to the kernel).
type host struct{ ifname string }

func openHost(ifname string) (*host, error) { return &host{ifname: ifname}, nil }

// Follow reports the interface's addresses, IPv4 first, once.
func (h *host) Follow(ctx context.Context, ev roce.HostEvents) error {
	ifi, err := net.InterfaceByName(h.ifname)
	if err != nil {
		return fmt.Errorf("netdev: interface %q: %w", h.ifname, err)
	}
	list, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("netdev: addresses of %s: %w", h.ifname, err)
	}
	var addrs []netip.Addr
	for _, a := range list {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				addrs = append(addrs, ip.Unmap())
			}
		}
	}
	sort.SliceStable(addrs, func(i, j int) bool { return addrs[i].Is4() && !addrs[j].Is4() })
	ev.AddrsChanged(addrs)
	return nil
}

// Resolve fails: resolving neighbours needs Linux's neighbour table.
func (h *host) Resolve(_ context.Context, dst netip.Addr) ([6]byte, netip.Addr, error) {
	return [6]byte{}, dst, fmt.Errorf("%w: %v via %s: resolving neighbours needs Linux: %w", roce.ErrNoNeighbour, dst, h.ifname, errors.ErrUnsupported)
}

func (h *host) Close() error { return nil }
