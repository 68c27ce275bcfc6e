//go:build !linux

package udplink

import "net/netip"

// Link is the kernel UDP link. Off Linux it is PlainLink: one datagram
// per system call, no GSO/GRO.
type Link = PlainLink

// Listen opens a link on addr. Port 0 means DefaultPort. The address
// family of addr is the link's. Off Linux a wildcard address needs
// destination control messages (darwin and the BSDs have them, windows
// does not: bind a specific address there).
func Listen(addr netip.AddrPort) (*Link, error) {
	return ListenOptions(addr, Options{})
}

// ListenOptions is Listen with options; off Linux it is ListenPlain.
func ListenOptions(addr netip.AddrPort, opts Options) (*Link, error) {
	return ListenPlain(addr, opts)
}
