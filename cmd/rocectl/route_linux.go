package main

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// routeInterface is the interface the kernel's route to a leaves through.
func routeInterface(a netip.Addr) (string, error) {
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil || len(routes) == 0 {
		return "", fmt.Errorf("no route to %v: %v", a, err)
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", err
	}
	return l.Attrs().Name, nil
}
