package netdev

import (
	"net"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
)

// XDPOptions tune the AF_XDP link (Options.XDP).
type XDPOptions = xdplink.Options

// openXDP opens the AF_XDP link on ifi, steering port (0: 4791) unless
// xo names a port.
func openXDP(ifi *net.Interface, xo XDPOptions, port uint16) (link.Link, error) {
	if xo.Port == 0 {
		xo.Port = port
	}
	fs := xo.FrameSize
	if fs == 0 {
		fs = 4096
	}
	// A full-size frame plus a VLAN tag and the device's tailroom must fit
	// one UMEM chunk, or frames span chunks (multi-buffer).
	if ifi.MTU+link.EthernetSize+link.VLANTagSize > fs-xo.Headroom-256 {
		xo.Multibuffer = true
	}
	return xdplink.Open(ifi.Name, xo)
}
