package ib

import (
	"encoding/binary"
	"net/netip"
)

// Sizes of the encapsulation headers in bytes, and the RoCEv2 UDP port.
const (
	EthernetSize = 14
	VLANTagSize  = 4
	IPv4Size     = 20 // without options; RoCEv2 never uses them
	IPv6Size     = 40
	UDPSize      = 8
	RoCEv2Port   = 4791
)

// EtherTypes and IP protocol numbers used by RoCEv2.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86DD
	EtherTypeVLAN = 0x8100
	// EtherTypeQinQ is the 802.1ad service tag; Parse rejects it as unsupported.
	EtherTypeQinQ   = 0x88A8
	IPProtocolUDP   = 17
	ipv4Version     = 4
	ipv6Version     = 6
	ipv4FlagDF      = 0x4000
	ipv4FlagMF      = 0x2000
	ipv4FragOffMask = 0x1fff
)

const (
	ethDst       = 0
	ethSrc       = 6
	ethType      = 12
	vlanTCI      = 0
	vlanType     = 2
	ipv4VerIHL   = 0
	ipv4TOS      = 1
	ipv4TotalLen = 2
	ipv4ID       = 4
	ipv4FlagsOff = 6
	ipv4TTL      = 8
	ipv4Proto    = 9
	ipv4Csum     = 10
	ipv4Src      = 12
	ipv4Dst      = 16
	ipv6VTF      = 0 // version, traffic class, flow label
	ipv6PayLen   = 4
	ipv6Next     = 6
	ipv6Hop      = 7
	ipv6Src      = 8
	ipv6Dst      = 24
	udpSrc       = 0
	udpDst       = 2
	udpLen       = 4
	udpCsum      = 6
)

// Ethernet is a view of a 14-byte Ethernet II header.
type Ethernet []byte

// EthernetFields holds the fields of an Ethernet header.
type EthernetFields struct {
	Dst, Src  [6]byte
	EtherType uint16
}

// Dst returns the destination MAC address.
func (b Ethernet) Dst() [6]byte { return [6]byte(b[ethDst : ethDst+6]) }

// SetDst sets the destination MAC address.
func (b Ethernet) SetDst(a [6]byte) { copy(b[ethDst:ethDst+6], a[:]) }

// Src returns the source MAC address.
func (b Ethernet) Src() [6]byte { return [6]byte(b[ethSrc : ethSrc+6]) }

// SetSrc sets the source MAC address.
func (b Ethernet) SetSrc(a [6]byte) { copy(b[ethSrc:ethSrc+6], a[:]) }

// EtherType returns the EtherType (0x8100 when a VLAN tag follows).
func (b Ethernet) EtherType() uint16 { return binary.BigEndian.Uint16(b[ethType:]) }

// SetEtherType sets the EtherType.
func (b Ethernet) SetEtherType(t uint16) { binary.BigEndian.PutUint16(b[ethType:], t) }

// Encode writes f into b.
func (b Ethernet) Encode(f *EthernetFields) {
	b.SetDst(f.Dst)
	b.SetSrc(f.Src)
	b.SetEtherType(f.EtherType)
}

// Fields decodes b; a short view reads as zero-padded.
func (b Ethernet) Fields() EthernetFields {
	b = full(b, EthernetSize)
	return EthernetFields{Dst: b.Dst(), Src: b.Src(), EtherType: b.EtherType()}
}

// VLANTag is a view of the 4 bytes after an Ethernet header whose EtherType is
// 0x8100: the tag control information and the inner EtherType.
type VLANTag []byte

// VLANTagFields holds the fields of a VLANTag.
type VLANTagFields struct {
	PCP       uint8  // 3-bit priority code point
	DEI       bool   // drop eligible indicator
	VID       uint16 // 12-bit VLAN ID
	EtherType uint16 // inner EtherType
}

// TCI returns the tag control information (PCP, DEI and VID).
func (b VLANTag) TCI() uint16 { return binary.BigEndian.Uint16(b[vlanTCI:]) }

// PCP returns the 3-bit priority code point.
func (b VLANTag) PCP() uint8 { return b[vlanTCI] >> 5 }

// SetPCP sets the priority code point; only the low 3 bits are used.
func (b VLANTag) SetPCP(p uint8) { b[vlanTCI] = b[vlanTCI]&0x1f | p<<5 }

// DEI reports the drop eligible indicator.
func (b VLANTag) DEI() bool { return b[vlanTCI]&0x10 != 0 }

// SetDEI sets the drop eligible indicator.
func (b VLANTag) SetDEI(v bool) { setBit(&b[vlanTCI], 0x10, v) }

// VID returns the 12-bit VLAN ID.
func (b VLANTag) VID() uint16 { return binary.BigEndian.Uint16(b[vlanTCI:]) & 0x0fff }

// SetVID sets the VLAN ID; only the low 12 bits are used.
func (b VLANTag) SetVID(v uint16) {
	binary.BigEndian.PutUint16(b[vlanTCI:], binary.BigEndian.Uint16(b[vlanTCI:])&0xf000|v&0x0fff)
}

// EtherType returns the inner EtherType.
func (b VLANTag) EtherType() uint16 { return binary.BigEndian.Uint16(b[vlanType:]) }

// SetEtherType sets the inner EtherType.
func (b VLANTag) SetEtherType(t uint16) { binary.BigEndian.PutUint16(b[vlanType:], t) }

// Encode writes f into b.
func (b VLANTag) Encode(f *VLANTagFields) {
	tci := uint16(f.PCP&7)<<13 | f.VID&0x0fff
	if f.DEI {
		tci |= 0x1000
	}
	binary.BigEndian.PutUint16(b[vlanTCI:], tci)
	b.SetEtherType(f.EtherType)
}

// Fields decodes b; a short view reads as zero-padded.
func (b VLANTag) Fields() VLANTagFields {
	b = full(b, VLANTagSize)
	return VLANTagFields{PCP: b.PCP(), DEI: b.DEI(), VID: b.VID(), EtherType: b.EtherType()}
}

// IPv4 is a view of a 20-byte IPv4 header (no options).
type IPv4 []byte

// IPv4Fields holds the fields of an IPv4 header. Version is always 4 and the
// header length always 20 on Encode.
type IPv4Fields struct {
	TOS            uint8 // DSCP<<2 | ECN; the IB traffic class
	TotalLength    uint16
	ID             uint16
	DontFragment   bool
	MoreFragments  bool
	FragmentOffset uint16 // in 8-byte units
	TTL            uint8
	Protocol       uint8
	Checksum       uint16
	Src, Dst       netip.Addr
}

// Version returns the IP version nibble.
func (b IPv4) Version() uint8 { return b[ipv4VerIHL] >> 4 }

// HeaderLength returns the header length in bytes (IHL*4).
func (b IPv4) HeaderLength() int { return int(b[ipv4VerIHL]&0x0f) * 4 }

// TOS returns the type-of-service byte (DSCP and ECN).
func (b IPv4) TOS() uint8 { return b[ipv4TOS] }

// SetTOS sets the type-of-service byte.
func (b IPv4) SetTOS(v uint8) { b[ipv4TOS] = v }

// TotalLength returns the datagram length including the header.
func (b IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(b[ipv4TotalLen:]) }

// SetTotalLength sets the datagram length.
func (b IPv4) SetTotalLength(v uint16) { binary.BigEndian.PutUint16(b[ipv4TotalLen:], v) }

// ID returns the identification field (covered by the ICRC).
func (b IPv4) ID() uint16 { return binary.BigEndian.Uint16(b[ipv4ID:]) }

// SetID sets the identification field.
func (b IPv4) SetID(v uint16) { binary.BigEndian.PutUint16(b[ipv4ID:], v) }

// DontFragment reports the DF flag (covered by the ICRC).
func (b IPv4) DontFragment() bool { return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&ipv4FlagDF != 0 }

// SetDontFragment sets the DF flag.
func (b IPv4) SetDontFragment(v bool) { setBit(&b[ipv4FlagsOff], ipv4FlagDF>>8, v) }

// MoreFragments reports the MF flag.
func (b IPv4) MoreFragments() bool { return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&ipv4FlagMF != 0 }

// SetMoreFragments sets the MF flag.
func (b IPv4) SetMoreFragments(v bool) { setBit(&b[ipv4FlagsOff], ipv4FlagMF>>8, v) }

// FragmentOffset returns the fragment offset in 8-byte units.
func (b IPv4) FragmentOffset() uint16 {
	return binary.BigEndian.Uint16(b[ipv4FlagsOff:]) & ipv4FragOffMask
}

// SetFragmentOffset sets the fragment offset; only the low 13 bits are used.
func (b IPv4) SetFragmentOffset(v uint16) {
	f := binary.BigEndian.Uint16(b[ipv4FlagsOff:])
	binary.BigEndian.PutUint16(b[ipv4FlagsOff:], f&^ipv4FragOffMask|v&ipv4FragOffMask)
}

// fragmented reports MF or a fragment offset: a fragment, which RoCEv2
// never sends.
func (b IPv4) fragmented() bool {
	return binary.BigEndian.Uint16(b[ipv4FlagsOff:])&(ipv4FlagMF|ipv4FragOffMask) != 0
}

// TTL returns the time to live (the IB hop limit).
func (b IPv4) TTL() uint8 { return b[ipv4TTL] }

// SetTTL sets the time to live.
func (b IPv4) SetTTL(v uint8) { b[ipv4TTL] = v }

// Protocol returns the payload protocol number.
func (b IPv4) Protocol() uint8 { return b[ipv4Proto] }

// SetProtocol sets the payload protocol number.
func (b IPv4) SetProtocol(v uint8) { b[ipv4Proto] = v }

// Checksum returns the header checksum field.
func (b IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[ipv4Csum:]) }

// SetChecksum sets the header checksum field.
func (b IPv4) SetChecksum(v uint16) { binary.BigEndian.PutUint16(b[ipv4Csum:], v) }

// Src returns the source address.
func (b IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Src : ipv4Src+4])) }

// SetSrc sets the source address (v4 or v4-mapped; others write 0.0.0.0).
func (b IPv4) SetSrc(a netip.Addr) { putAddr4(b[ipv4Src:ipv4Src+4], a) }

// Dst returns the destination address.
func (b IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Dst : ipv4Dst+4])) }

// SetDst sets the destination address (v4 or v4-mapped; others write 0.0.0.0).
func (b IPv4) SetDst(a netip.Addr) { putAddr4(b[ipv4Dst:ipv4Dst+4], a) }

// ComputeChecksum returns the header checksum that belongs in the checksum
// field, computed over the first HeaderLength bytes with that field as zero.
func (b IPv4) ComputeChecksum() uint16 {
	n := b.HeaderLength()
	if n < IPv4Size || n > len(b) {
		n = IPv4Size
	}
	if n == IPv4Size {
		// The only size RoCEv2 sends: nine words, unrolled, as the
		// transmit path puts one header per frame.
		h := b[:IPv4Size]
		be := binary.BigEndian
		s := uint32(be.Uint16(h[0:])) + uint32(be.Uint16(h[2:])) + uint32(be.Uint16(h[4:])) +
			uint32(be.Uint16(h[6:])) + uint32(be.Uint16(h[8:])) + uint32(be.Uint16(h[12:])) +
			uint32(be.Uint16(h[14:])) + uint32(be.Uint16(h[16:])) + uint32(be.Uint16(h[18:]))
		return ^foldSum(s)
	}
	s := onesSum(0, b[:ipv4Csum]) + onesSum(0, b[ipv4Csum+2:n])
	return ^foldSum(s)
}

// UpdateChecksum recomputes and stores the header checksum.
func (b IPv4) UpdateChecksum() { b.SetChecksum(b.ComputeChecksum()) }

// ChecksumValid reports whether the stored header checksum is correct.
func (b IPv4) ChecksumValid() bool { return b.ComputeChecksum() == b.Checksum() }

// Encode writes f into b with version 4 and IHL 5. The checksum is written as
// given; call UpdateChecksum afterwards to compute it.
func (b IPv4) Encode(f *IPv4Fields) {
	_ = b[IPv4Size-1]
	b[ipv4VerIHL] = ipv4Version<<4 | IPv4Size/4
	b[ipv4TOS] = f.TOS
	binary.BigEndian.PutUint16(b[ipv4TotalLen:], f.TotalLength)
	binary.BigEndian.PutUint16(b[ipv4ID:], f.ID)
	flags := f.FragmentOffset & ipv4FragOffMask
	if f.DontFragment {
		flags |= ipv4FlagDF
	}
	if f.MoreFragments {
		flags |= ipv4FlagMF
	}
	binary.BigEndian.PutUint16(b[ipv4FlagsOff:], flags)
	b[ipv4TTL] = f.TTL
	b[ipv4Proto] = f.Protocol
	binary.BigEndian.PutUint16(b[ipv4Csum:], f.Checksum)
	putAddr4(b[ipv4Src:ipv4Src+4], f.Src)
	putAddr4(b[ipv4Dst:ipv4Dst+4], f.Dst)
}

// Fields decodes b; a short view reads as zero-padded.
func (b IPv4) Fields() IPv4Fields {
	b = full(b, IPv4Size)
	return IPv4Fields{
		TOS: b.TOS(), TotalLength: b.TotalLength(), ID: b.ID(),
		DontFragment: b.DontFragment(), MoreFragments: b.MoreFragments(),
		FragmentOffset: b.FragmentOffset(), TTL: b.TTL(), Protocol: b.Protocol(),
		Checksum: b.Checksum(), Src: b.Src(), Dst: b.Dst(),
	}
}

// IPv6 is a view of a 40-byte IPv6 header.
type IPv6 []byte

// IPv6Fields holds the fields of an IPv6 header. Version is always 6 on Encode.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32 // 20 bits
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      netip.Addr
}

// Version returns the IP version nibble.
func (b IPv6) Version() uint8 { return b[ipv6VTF] >> 4 }

// TrafficClass returns the traffic class (DSCP and ECN).
func (b IPv6) TrafficClass() uint8 { return uint8(binary.BigEndian.Uint32(b[ipv6VTF:]) >> 20) }

// SetTrafficClass sets the traffic class.
func (b IPv6) SetTrafficClass(v uint8) {
	w := binary.BigEndian.Uint32(b[ipv6VTF:])
	binary.BigEndian.PutUint32(b[ipv6VTF:], w&^0x0ff00000|uint32(v)<<20)
}

// FlowLabel returns the 20-bit flow label.
func (b IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(b[ipv6VTF:]) & 0xfffff }

// SetFlowLabel sets the flow label; only the low 20 bits are used.
func (b IPv6) SetFlowLabel(v uint32) {
	w := binary.BigEndian.Uint32(b[ipv6VTF:])
	binary.BigEndian.PutUint32(b[ipv6VTF:], w&^0xfffff|v&0xfffff)
}

// PayloadLength returns the length of everything after the 40-byte header.
func (b IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(b[ipv6PayLen:]) }

// SetPayloadLength sets the payload length.
func (b IPv6) SetPayloadLength(v uint16) { binary.BigEndian.PutUint16(b[ipv6PayLen:], v) }

// NextHeader returns the next header (protocol) number.
func (b IPv6) NextHeader() uint8 { return b[ipv6Next] }

// SetNextHeader sets the next header number.
func (b IPv6) SetNextHeader(v uint8) { b[ipv6Next] = v }

// HopLimit returns the hop limit.
func (b IPv6) HopLimit() uint8 { return b[ipv6Hop] }

// SetHopLimit sets the hop limit.
func (b IPv6) SetHopLimit(v uint8) { b[ipv6Hop] = v }

// Src returns the source address.
func (b IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(b[ipv6Src : ipv6Src+16])) }

// SetSrc sets the source address (v4 addresses are written v4-mapped).
func (b IPv6) SetSrc(a netip.Addr) { putAddr16(b[ipv6Src:ipv6Src+16], a) }

// Dst returns the destination address.
func (b IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(b[ipv6Dst : ipv6Dst+16])) }

// SetDst sets the destination address (v4 addresses are written v4-mapped).
func (b IPv6) SetDst(a netip.Addr) { putAddr16(b[ipv6Dst:ipv6Dst+16], a) }

// Encode writes f into b with version 6.
func (b IPv6) Encode(f *IPv6Fields) {
	_ = b[IPv6Size-1]
	binary.BigEndian.PutUint32(b[ipv6VTF:], ipv6Version<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(b[ipv6PayLen:], f.PayloadLength)
	b[ipv6Next] = f.NextHeader
	b[ipv6Hop] = f.HopLimit
	putAddr16(b[ipv6Src:ipv6Src+16], f.Src)
	putAddr16(b[ipv6Dst:ipv6Dst+16], f.Dst)
}

// Fields decodes b; a short view reads as zero-padded.
func (b IPv6) Fields() IPv6Fields {
	b = full(b, IPv6Size)
	return IPv6Fields{
		TrafficClass: b.TrafficClass(), FlowLabel: b.FlowLabel(), PayloadLength: b.PayloadLength(),
		NextHeader: b.NextHeader(), HopLimit: b.HopLimit(), Src: b.Src(), Dst: b.Dst(),
	}
}

// UDP is a view of an 8-byte UDP header.
type UDP []byte

// UDPFields holds the fields of a UDP header.
type UDPFields struct {
	SrcPort, DstPort uint16
	Length           uint16 // header + data
	Checksum         uint16 // 0 = none (what rxe sends)
}

// SrcPort returns the source port (flow entropy for RoCEv2).
func (b UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[udpSrc:]) }

// SetSrcPort sets the source port.
func (b UDP) SetSrcPort(v uint16) { binary.BigEndian.PutUint16(b[udpSrc:], v) }

// DstPort returns the destination port (4791 for RoCEv2).
func (b UDP) DstPort() uint16 { return binary.BigEndian.Uint16(b[udpDst:]) }

// SetDstPort sets the destination port.
func (b UDP) SetDstPort(v uint16) { binary.BigEndian.PutUint16(b[udpDst:], v) }

// Length returns the UDP length (header + data).
func (b UDP) Length() uint16 { return binary.BigEndian.Uint16(b[udpLen:]) }

// SetLength sets the UDP length.
func (b UDP) SetLength(v uint16) { binary.BigEndian.PutUint16(b[udpLen:], v) }

// Checksum returns the checksum field.
func (b UDP) Checksum() uint16 { return binary.BigEndian.Uint16(b[udpCsum:]) }

// SetChecksum sets the checksum field.
func (b UDP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(b[udpCsum:], v) }

// Encode writes f into b.
func (b UDP) Encode(f *UDPFields) {
	b.SetSrcPort(f.SrcPort)
	b.SetDstPort(f.DstPort)
	b.SetLength(f.Length)
	b.SetChecksum(f.Checksum)
}

// Fields decodes b; a short view reads as zero-padded.
func (b UDP) Fields() UDPFields {
	b = full(b, UDPSize)
	return UDPFields{SrcPort: b.SrcPort(), DstPort: b.DstPort(), Length: b.Length(), Checksum: b.Checksum()}
}

// UDPChecksum returns the UDP checksum of datagram (UDP header + data, with
// the checksum field counted as zero) under the pseudo-header of the IPv4
// (20-byte) or IPv6 (40-byte) header ip. A result of zero is returned as
// 0xFFFF, since zero on the wire means "no checksum".
func UDPChecksum(ip, datagram []byte) uint16 {
	var s uint32
	switch {
	case len(ip) >= IPv6Size && ip[0]>>4 == ipv6Version:
		s = onesSum(s, ip[ipv6Src:ipv6Dst+16])
	case len(ip) >= IPv4Size:
		s = onesSum(s, ip[ipv4Src:ipv4Dst+4])
	}
	s += IPProtocolUDP + uint32(len(datagram)&0xffff) + uint32(len(datagram)>>16)
	if len(datagram) >= UDPSize {
		s = onesSum(s, datagram[:udpCsum])
		s = onesSum(s, datagram[UDPSize:])
	} else {
		s = onesSum(s, datagram)
	}
	c := ^foldSum(s)
	if c == 0 {
		c = 0xffff
	}
	return c
}

// onesSum adds b, as big-endian 16-bit words, to the running sum s. An odd
// trailing byte is padded with zero. Callers fold with foldSum.
func onesSum(s uint32, b []byte) uint32 {
	// Accumulate in 64 bits so long payloads cannot overflow before folding.
	acc := uint64(s)
	for len(b) >= 8 {
		acc += uint64(binary.BigEndian.Uint32(b)) + uint64(binary.BigEndian.Uint32(b[4:]))
		b = b[8:]
	}
	for len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	for acc>>32 != 0 {
		acc = acc&0xffffffff + acc>>32
	}
	// Fold 32 to at most 17 bits so the result fits a uint32 sum again.
	v := uint32(acc)
	v = v&0xffff + v>>16
	return v
}

// foldSum folds a 32-bit one's-complement sum to 16 bits.
func foldSum(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// putAddr4 writes a v4 or v4-mapped address, or zeros for anything else.
func putAddr4(b []byte, a netip.Addr) {
	a = a.Unmap()
	if !a.Is4() {
		clear(b[:4])
		return
	}
	v := a.As4()
	copy(b[:4], v[:])
}

// putAddr16 writes a 16-byte address (v4 as v4-mapped), or zeros if invalid.
func putAddr16(b []byte, a netip.Addr) {
	if !a.IsValid() {
		clear(b[:16])
		return
	}
	v := a.As16()
	copy(b[:16], v[:])
}
