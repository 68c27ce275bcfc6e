// Package netdev opens a goroce device on a network interface by name.
//
// Package roce runs a device over any link.Link it is given (roce.OpenLink),
// as gVisor's stack runs over link endpoints it never imports and
// wireguard-go's device takes its tun.Device and conn.Bind as arguments. This
// package is where an interface name becomes such a link: AF_XDP by default
// (package xdplink: the steering program sends UDP port 4791 to the socket,
// everything else to the kernel), falling back to a kernel UDP socket
// (package udplink) when AF_XDP is unavailable or when Options.Link is
// LinkUDP. The fallback is logged with log/slog and reported in
// roce.DeviceInfo.Fallback. When the interface MTU does not fit one 4096-byte
// UMEM frame, Open turns on AF_XDP multi-buffer itself.
//
// The device follows the interface through this package too (roce.Host over
// rtnetlink): its addresses make the GID table, its MTU and carrier the port,
// and the kernel's neighbour table (ARP, ND) resolves MAC addresses.
// OpenLink does the same for a link the caller opened.
//
// The kernel UDP link is bound to one address (Options.UDPAddr, default the
// interface's first IPv4 address, else its first non-link-local IPv6
// address) and so carries one address family.
//
// Keeping this apart keeps the device core (ib, qp, roce, cm) free of eBPF,
// netlink and Linux socket code, so that it builds everywhere and programs
// that run it over their own links do not link AF_XDP.
//
// Off Linux there is neither AF_XDP nor rtnetlink: Open runs the kernel UDP
// link (LinkAuto falls back to it, LinkXDP fails with errors.ErrUnsupported),
// the GID table takes the interface's addresses once, when the device
// opens, and the interface is not followed after that.
package netdev
