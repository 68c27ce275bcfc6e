//go:build !linux

package perfrun

import (
	"time"

	"github.com/goroce/goroce/netdev"
)

// xdpOptions: there is no AF_XDP link off Linux, so --xdp-busy-poll has
// nothing to tune.
func xdpOptions(time.Duration) netdev.XDPOptions { return netdev.XDPOptions{} }
