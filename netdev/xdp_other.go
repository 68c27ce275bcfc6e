//go:build !linux

package netdev

import (
	"errors"
	"fmt"
	"net"

	"github.com/goroce/goroce/link"
)

// XDPOptions would tune the AF_XDP link, which only Linux has.
type XDPOptions struct{}

func openXDP(ifi *net.Interface, _ XDPOptions, _ uint16) (link.Link, error) {
	return nil, fmt.Errorf("AF_XDP on %s needs Linux: %w", ifi.Name, errors.ErrUnsupported)
}
