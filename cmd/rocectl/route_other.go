//go:build !linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
)

// routeInterface: asking the kernel for a route needs Linux's rtnetlink.
func routeInterface(a netip.Addr) (string, error) {
	return "", fmt.Errorf("finding the interface that routes to %v needs Linux (name it with -d): %w", a, errors.ErrUnsupported)
}
