//go:build !linux

package roce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// netlinkWatch follows an interface through rtnetlink, which only Linux has.
// Elsewhere a device runs without an interface (Options.Addrs and
// Options.Neighbours), so openNetlink refuses and the methods are never
// reached.
type netlinkWatch struct{ ifname string }

func openNetlink(ifname string) (*netlinkWatch, error) {
	return nil, fmt.Errorf("roce: interface %q: following an interface needs Linux netlink: %w", ifname, errors.ErrUnsupported)
}

func (w *netlinkWatch) Close() error { return nil }

func (w *netlinkWatch) watchAddrs(context.Context, func([]netip.Addr)) error {
	return errors.ErrUnsupported
}

func (w *netlinkWatch) watchLink(context.Context, func(mtu int, up bool)) error {
	return errors.ErrUnsupported
}

func (w *netlinkWatch) watchNeigh(context.Context, func(netip.Addr, [6]byte)) error {
	return errors.ErrUnsupported
}

func (w *netlinkWatch) resolve(_ context.Context, dst netip.Addr) ([6]byte, netip.Addr, error) {
	return [6]byte{}, dst, fmt.Errorf("%w: %v: %w", ErrNoNeighbour, dst, errors.ErrUnsupported)
}
