// Package ib implements the wire formats of RoCEv2 (InfiniBand transport
// over UDP/IP over Ethernet): the Base Transport Header, the extended
// transport headers, the Ethernet/802.1Q/IPv4/IPv6/UDP encapsulation, the
// opcode table, 24-bit PSN arithmetic, AETH syndromes, MTU codes, GIDs, the
// UDP source-port conventions of rxe and mlx5, and the Invariant CRC.
//
// Headers are byte-slice views in the style of gVisor's pkg/tcpip/header:
// a view such as [BTH] is a []byte whose accessors read and write the wire
// bytes in place, and whose Fields/Encode methods convert to and from a
// plain struct. Views never allocate. Accessors and Encode expect a view of
// at least the header's size (as produced by [Parse], [Build] or the
// checked constructors such as [ParseBTH]); Fields tolerates a short view
// and reads the missing bytes as zero.
//
// The opcode table ([Opcode.Info]) is the single source of truth for which
// headers each opcode carries, in which order and at which offset; Parse,
// Build and every higher layer derive their layout from it.
//
// [Parse] decodes a whole Ethernet frame into views of each header without
// copying or allocating; errors are *[ParseError] values naming the layer and
// byte offset at fault and wrapping one of [ErrTruncated], [ErrMalformed] or
// [ErrUnsupported]. [Build] writes a complete frame, including the IPv4
// header checksum and the ICRC, into a caller-supplied buffer. [ParseIB] and
// [BuildIB] handle only BTH … ICRC, for links where the kernel owns IP and
// UDP; [ICRCSplit] then computes the ICRC over separately held headers.
//
// This package is the only place the encapsulation is encoded and decoded.
// The device's receive path walks Ethernet/IP/UDP with [EncapParser] (the
// [ParseEncap] walk, which Parse shares, plus a cache of the last frame's
// headers) and then decodes the IB packet with [ParseDCIB]; its transmit
// path and the links that synthesize headers write them with
// [EncapHeader.Put], as Build does. The link package exposes these under its
// own names (link.ParseFrame, link.Parser, link.Header).
//
// The ICRC is computed exactly as Linux rdma_rxe does: a CRC-32 (IEEE) over
// 8 bytes of 0xFF, the IP header and UDP header with their variant fields
// (TOS/traffic class, flow label, TTL/hop limit, IPv4 checksum, UDP checksum)
// set to all ones, the BTH with byte 4 (FECN/BECN) set to all ones, and the
// rest of the packet up to the ICRC, which is stored little-endian.
package ib
