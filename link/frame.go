package link

import (
	"encoding/binary"
	"net/netip"
)

// Sizes of the headers a link walks or synthesizes.
const (
	EthernetSize = 14
	VLANTagSize  = 4
	IPv4Size     = 20
	IPv6Size     = 40
	UDPSize      = 8

	// MaxHeaderSize is the largest Ethernet+VLAN+IP+UDP prefix a link
	// synthesizes or accepts in front of a UDP payload.
	MaxHeaderSize = EthernetSize + VLANTagSize + IPv6Size + UDPSize
)

// EtherTypes the walk understands.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86DD
	EtherTypeVLAN = 0x8100
)

const ipProtoUDP = 17

// Frame is the result of walking an Ethernet frame's headers. It holds
// offsets into the frame, not copies, so parsing never allocates.
type Frame struct {
	VLAN      bool   // one 802.1Q tag was present
	VLANTCI   uint16 // its tag control information
	IPOffset  int    // start of the IP header
	UDPOffset int    // start of the UDP header
	Payload   int    // start of the UDP payload
	End       int    // end of the UDP payload (Ethernet padding excluded)
	Version   int    // 4 or 6
	Src, Dst  netip.Addr
	SrcPort   uint16
	DstPort   uint16
	TOS       uint8 // IPv4 TOS or IPv6 traffic class (DSCP+ECN)
	TTL       uint8 // IPv4 TTL or IPv6 hop limit
	FlowLabel uint32
}

// ParseFrame walks Ethernet [+802.1Q] + IPv4/IPv6 + UDP. It accepts no IP
// options, IPv4 fragments or IPv6 extension headers, which RoCEv2 never
// uses. Errors are ErrTruncated, ErrNotIP, ErrNotUDP or ErrMalformed.
func ParseFrame(b []byte) (Frame, error) {
	var f Frame
	if len(b) < EthernetSize {
		return f, ErrTruncated
	}
	off := EthernetSize
	et := binary.BigEndian.Uint16(b[12:])
	if et == EtherTypeVLAN {
		if len(b) < EthernetSize+VLANTagSize {
			return f, ErrTruncated
		}
		f.VLAN = true
		f.VLANTCI = binary.BigEndian.Uint16(b[14:])
		et = binary.BigEndian.Uint16(b[16:])
		off += VLANTagSize
	}
	f.IPOffset = off
	ip := b[off:]
	var ipEnd int
	switch et {
	case EtherTypeIPv4:
		if len(ip) < IPv4Size {
			return f, ErrTruncated
		}
		if ip[0] != 0x45 { // version 4, no options
			return f, ErrMalformed
		}
		total := int(binary.BigEndian.Uint16(ip[2:]))
		if total < IPv4Size+UDPSize {
			return f, ErrMalformed
		}
		if total > len(ip) {
			return f, ErrTruncated
		}
		if binary.BigEndian.Uint16(ip[6:])&0x3FFF != 0 { // MF or offset
			return f, ErrMalformed
		}
		if ip[9] != ipProtoUDP {
			return f, ErrNotUDP
		}
		f.Version = 4
		f.TOS = ip[1]
		f.TTL = ip[8]
		f.Src = netip.AddrFrom4([4]byte(ip[12:16]))
		f.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
		f.UDPOffset = off + IPv4Size
		ipEnd = off + total
	case EtherTypeIPv6:
		if len(ip) < IPv6Size {
			return f, ErrTruncated
		}
		if ip[0]>>4 != 6 {
			return f, ErrMalformed
		}
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if plen < UDPSize {
			return f, ErrMalformed
		}
		if IPv6Size+plen > len(ip) {
			return f, ErrTruncated
		}
		if ip[6] != ipProtoUDP {
			return f, ErrNotUDP
		}
		f.Version = 6
		vtf := binary.BigEndian.Uint32(ip[0:])
		f.TOS = uint8(vtf >> 20)
		f.FlowLabel = vtf & 0xFFFFF
		f.TTL = ip[7]
		f.Src = netip.AddrFrom16([16]byte(ip[8:24]))
		f.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
		f.UDPOffset = off + IPv6Size
		ipEnd = off + IPv6Size + plen
	default:
		return f, ErrNotIP
	}
	udp := b[f.UDPOffset:ipEnd]
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < UDPSize || ulen > len(udp) {
		return f, ErrMalformed
	}
	f.SrcPort = binary.BigEndian.Uint16(udp[0:])
	f.DstPort = binary.BigEndian.Uint16(udp[2:])
	f.Payload = f.UDPOffset + UDPSize
	f.End = f.UDPOffset + ulen
	return f, nil
}

// Header describes the Ethernet+IP+UDP prefix a link synthesizes in front
// of a received datagram.
type Header struct {
	Dst, Src         [6]byte // MAC addresses
	SrcAddr, DstAddr netip.Addr
	SrcPort, DstPort uint16
	TOS              uint8 // IPv4 TOS / IPv6 traffic class
	TTL              uint8 // IPv4 TTL / IPv6 hop limit
	FlowLabel        uint32
	IPID             uint16 // IPv4 only
	DF               bool   // IPv4 only
}

// HeaderSize returns the size of the prefix Put writes for this header
// (Ethernet + IPv4 or IPv6 + UDP, as v4 says).
func (h *Header) HeaderSize() int {
	if h.v4() {
		return EthernetSize + IPv4Size + UDPSize
	}
	return EthernetSize + IPv6Size + UDPSize
}

// v4 reports whether Put writes an IPv4 header: when both addresses are
// IPv4 or IPv4-mapped. Any other pair, mixed families included, is written
// as IPv6 with the addresses' 16-byte forms, never a panic.
func (h *Header) v4() bool {
	return h.SrcAddr.Unmap().Is4() && h.DstAddr.Unmap().Is4()
}

// Put writes the Ethernet, IP and UDP headers for a payload of payloadLen
// bytes into b[:h.HeaderSize()] and returns that size. The IPv4 header
// checksum is computed; the UDP checksum is left zero (RoCEv2 does not use
// it, and the ICRC masks it). Both addresses IPv4 (or IPv4-mapped: they are
// unmapped) give an IPv4 header, anything else IPv6; b must be large enough.
func (h *Header) Put(b []byte, payloadLen int) int {
	src, dst := h.SrcAddr.Unmap(), h.DstAddr.Unmap()
	n := h.HeaderSize()
	_ = b[n-1]
	copy(b[0:6], h.Dst[:])
	copy(b[6:12], h.Src[:])
	ip := b[EthernetSize:]
	var udp []byte
	if h.v4() {
		binary.BigEndian.PutUint16(b[12:], EtherTypeIPv4)
		ip[0] = 0x45
		ip[1] = h.TOS
		binary.BigEndian.PutUint16(ip[2:], uint16(IPv4Size+UDPSize+payloadLen))
		binary.BigEndian.PutUint16(ip[4:], h.IPID)
		var frag uint16
		if h.DF {
			frag = 0x4000
		}
		binary.BigEndian.PutUint16(ip[6:], frag)
		ip[8] = h.TTL
		ip[9] = ipProtoUDP
		ip[10], ip[11] = 0, 0
		s4, d4 := src.As4(), dst.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:], IPv4Checksum(ip[:IPv4Size]))
		udp = ip[IPv4Size:]
	} else {
		binary.BigEndian.PutUint16(b[12:], EtherTypeIPv6)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(h.TOS)<<20|h.FlowLabel&0xFFFFF)
		binary.BigEndian.PutUint16(ip[4:], uint16(UDPSize+payloadLen))
		ip[6] = ipProtoUDP
		ip[7] = h.TTL
		s16, d16 := src.As16(), dst.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
		udp = ip[IPv6Size:]
	}
	binary.BigEndian.PutUint16(udp[0:], h.SrcPort)
	binary.BigEndian.PutUint16(udp[2:], h.DstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(UDPSize+payloadLen))
	udp[6], udp[7] = 0, 0
	return n
}

// IPv4Checksum returns the Internet checksum of an IPv4 header whose
// checksum field is zero (or, over a header with a valid checksum, zero).
func IPv4Checksum(hdr []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(hdr); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(hdr[i:]))
	}
	if len(hdr)%2 == 1 {
		sum += uint32(hdr[len(hdr)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xFFFF + sum>>16
	}
	return ^uint16(sum)
}
