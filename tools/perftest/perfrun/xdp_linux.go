package perfrun

import (
	"time"

	"github.com/goroce/goroce/netdev"
)

// xdpOptions are the AF_XDP link's options for --xdp-busy-poll.
func xdpOptions(busyPoll time.Duration) netdev.XDPOptions {
	return netdev.XDPOptions{BusyPoll: busyPoll}
}
