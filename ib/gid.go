package ib

import "net/netip"

// GID is a 16-byte InfiniBand global identifier. On RoCEv2 it is the IP
// address: IPv6 verbatim, IPv4 as the v4-mapped address ::ffff:a.b.c.d.
type GID [16]byte

// GIDFromAddr returns the GID of an IP address (the zero GID if a is invalid).
func GIDFromAddr(a netip.Addr) GID {
	if !a.IsValid() {
		return GID{}
	}
	return GID(a.As16())
}

// Addr returns the IP address of g, unmapped to IPv4 when g is v4-mapped.
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// IsIPv4 reports whether g is a v4-mapped GID (rxe sends such traffic over IPv4).
func (g GID) IsIPv4() bool { return netip.AddrFrom16(g).Is4In6() }

// String returns the GID in IPv6 notation (v4-mapped as ::ffff:a.b.c.d).
func (g GID) String() string { return netip.AddrFrom16(g).String() }
