package ib

import (
	"encoding/binary"
	"net/netip"
)

// MaxEncapSize is the largest Ethernet+VLAN+IP+UDP prefix ParseEncap
// accepts and EncapHeader.Put writes in front of a UDP payload.
const MaxEncapSize = EthernetSize + VLANTagSize + IPv6Size + UDPSize

// Errors of ParseEncap and EncapParser. ErrNotIP and ErrNotUDP wrap
// ErrUnsupported; the walk otherwise returns ErrTruncated or ErrMalformed.
var (
	ErrNotIP  error = &encapError{"ib: not an IPv4 or IPv6 frame", ErrUnsupported}
	ErrNotUDP error = &encapError{"ib: not a UDP datagram", ErrUnsupported}
)

type encapError struct {
	msg string
	err error
}

func (e *encapError) Error() string { return e.msg }
func (e *encapError) Unwrap() error { return e.err }

// Encap is the result of walking the Ethernet [+802.1Q], IP and UDP headers
// of a frame (ParseEncap): offsets into the frame and the fields a receiver
// keys on, not copies, so the walk never allocates.
type Encap struct {
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

// ParseEncap walks Ethernet [+802.1Q] + IPv4/IPv6 + UDP to any port, the
// receive path's first step before the IB packet (ParseIB, ParseDCIB). It
// accepts no IP options, IPv4 fragments or IPv6 extension headers, which
// RoCEv2 never uses, and a UDP length up to the IP datagram's end. Errors
// are ErrTruncated, ErrMalformed, ErrNotIP or ErrNotUDP. It shares its
// checks with Parse, which adds the RoCEv2 port and an exact UDP length.
// It decodes into e, as Parse decodes into a Packet, so that the result is
// not copied on its way out; after an error e holds nothing of use.
func ParseEncap(b []byte, e *Encap) error {
	*e = Encap{}
	var w encapWalk
	if c, _ := walkEncap(b, &w, e, false); c != encapOK {
		return encapChecks[c].quick
	}
	return nil
}

// encapWalk is where walkEncap found the headers of a frame.
type encapWalk struct {
	vlan   bool
	v6     bool
	ipOff  int
	udpOff int
	end    int // end of the IP datagram
}

// encapCheck names the check of walkEncap that rejected a frame.
type encapCheck uint8

const (
	encapOK encapCheck = iota
	encapShortEth
	encapShortVLAN
	encapStackedVLAN
	encapNotIP
	encapNotIPVLAN
	encapShortIPv4
	encapIPv4Version
	encapIHLSmall
	encapIPv4Options
	encapNotUDP4
	encapFragment
	encapTotalSmall
	encapTotalBeyond
	encapShortIPv6
	encapIPv6Version
	encapNotUDP6
	encapPayloadSmall
	encapPayloadBeyond
	encapPort
	encapUDPLenSmall
	encapUDPLenBeyond
	encapUDPLenDiffers
)

// encapChecks describes each check: the ParseError Parse reports (field is
// the offset of the field at fault within its header) and the error
// ParseEncap returns.
var encapChecks = [...]struct {
	layer  string
	field  int
	err    error
	reason string
	quick  error
}{
	encapShortEth:      {"ethernet", 0, ErrTruncated, "frame shorter than Ethernet header", ErrTruncated},
	encapShortVLAN:     {"vlan", 0, ErrTruncated, "frame shorter than VLAN tag", ErrTruncated},
	encapStackedVLAN:   {"vlan", vlanType, ErrUnsupported, "stacked VLAN tags", ErrNotIP},
	encapNotIP:         {"ethernet", ethType, ErrUnsupported, "EtherType is not IPv4 or IPv6", ErrNotIP},
	encapNotIPVLAN:     {"vlan", vlanType, ErrUnsupported, "EtherType is not IPv4 or IPv6", ErrNotIP},
	encapShortIPv4:     {"ipv4", 0, ErrTruncated, "frame shorter than IPv4 header", ErrTruncated},
	encapIPv4Version:   {"ipv4", 0, ErrMalformed, "IP version is not 4", ErrMalformed},
	encapIHLSmall:      {"ipv4", 0, ErrMalformed, "IHL below 5", ErrMalformed},
	encapIPv4Options:   {"ipv4", 0, ErrUnsupported, "IPv4 options", ErrMalformed},
	encapNotUDP4:       {"ipv4", ipv4Proto, ErrUnsupported, "protocol is not UDP", ErrNotUDP},
	encapFragment:      {"ipv4", ipv4FlagsOff, ErrUnsupported, "IP fragment", ErrMalformed},
	encapTotalSmall:    {"ipv4", ipv4TotalLen, ErrMalformed, "total length too small for IPv4 and UDP headers", ErrMalformed},
	encapTotalBeyond:   {"ipv4", ipv4TotalLen, ErrTruncated, "total length beyond end of frame", ErrTruncated},
	encapShortIPv6:     {"ipv6", 0, ErrTruncated, "frame shorter than IPv6 header", ErrTruncated},
	encapIPv6Version:   {"ipv6", 0, ErrMalformed, "IP version is not 6", ErrMalformed},
	encapNotUDP6:       {"ipv6", ipv6Next, ErrUnsupported, "next header is not UDP", ErrNotUDP},
	encapPayloadSmall:  {"ipv6", ipv6PayLen, ErrMalformed, "payload length too small for UDP header", ErrMalformed},
	encapPayloadBeyond: {"ipv6", ipv6PayLen, ErrTruncated, "payload length beyond end of frame", ErrTruncated},
	encapPort:          {"udp", udpDst, ErrUnsupported, "destination port is not 4791", ErrNotUDP},
	encapUDPLenSmall:   {"udp", udpLen, ErrMalformed, "length below 8", ErrMalformed},
	encapUDPLenBeyond:  {"udp", udpLen, ErrMalformed, "length beyond IP datagram", ErrMalformed},
	// A sender never produces this; both lengths are covered by the ICRC.
	encapUDPLenDiffers: {"udp", udpLen, ErrMalformed, "length disagrees with IP length", ErrMalformed},
}

// walkEncap checks the Ethernet [+VLAN], IP and UDP headers of b and
// records where they are in w and, unless e is nil, their fields in e (in
// the same pass: the walk is the receive path's). With roce, the UDP destination port must be
// 4791 and the UDP length must fill the IP datagram. On failure it returns
// the check and the offset of the header at fault.
func walkEncap(b []byte, w *encapWalk, e *Encap, roce bool) (encapCheck, int) {
	if len(b) < EthernetSize {
		return encapShortEth, 0
	}
	off := EthernetSize
	et := Ethernet(b[:EthernetSize]).EtherType()
	notIP := encapNotIP
	if et == EtherTypeVLAN {
		if len(b) < off+VLANTagSize {
			return encapShortVLAN, off
		}
		tag := VLANTag(b[off : off+VLANTagSize])
		et = tag.EtherType()
		if et == EtherTypeVLAN || et == EtherTypeQinQ {
			return encapStackedVLAN, off
		}
		if e != nil {
			e.VLAN, e.VLANTCI = true, tag.TCI()
		}
		w.vlan = true
		notIP = encapNotIPVLAN
		off += VLANTagSize
	}
	w.ipOff = off
	switch et {
	case EtherTypeIPv4:
		if len(b) < off+IPv4Size {
			return encapShortIPv4, off
		}
		ip := IPv4(b[off : off+IPv4Size])
		if ip[ipv4VerIHL] != ipv4Version<<4|IPv4Size/4 { // one compare for the usual case
			switch {
			case ip.Version() != ipv4Version:
				return encapIPv4Version, off
			case ip.HeaderLength() < IPv4Size:
				return encapIHLSmall, off
			}
			return encapIPv4Options, off
		}
		if ip.Protocol() != IPProtocolUDP {
			return encapNotUDP4, off
		}
		if ip.fragmented() {
			return encapFragment, off
		}
		tl := int(ip.TotalLength())
		if tl < IPv4Size+UDPSize {
			return encapTotalSmall, off
		}
		if tl > len(b)-off {
			return encapTotalBeyond, off
		}
		w.end = off + tl
		if e != nil {
			e.Version = 4
			e.TOS, e.TTL = ip.TOS(), ip.TTL()
			e.Src, e.Dst = ip.Src(), ip.Dst()
		}
		off += IPv4Size
	case EtherTypeIPv6:
		if len(b) < off+IPv6Size {
			return encapShortIPv6, off
		}
		ip := IPv6(b[off : off+IPv6Size])
		if ip.Version() != ipv6Version {
			return encapIPv6Version, off
		}
		if ip.NextHeader() != IPProtocolUDP {
			return encapNotUDP6, off
		}
		pl := int(ip.PayloadLength())
		if pl < UDPSize {
			return encapPayloadSmall, off
		}
		if pl > len(b)-off-IPv6Size {
			return encapPayloadBeyond, off
		}
		w.v6 = true
		w.end = off + IPv6Size + pl
		if e != nil {
			e.Version = 6
			vtf := binary.BigEndian.Uint32(ip[ipv6VTF:])
			e.TOS, e.FlowLabel, e.TTL = uint8(vtf>>20), vtf&0xfffff, ip.HopLimit()
			e.Src, e.Dst = ip.Src(), ip.Dst()
		}
		off += IPv6Size
	default:
		if notIP == encapNotIPVLAN {
			return notIP, off - VLANTagSize
		}
		return notIP, 0
	}
	w.udpOff = off
	// The IP layer guarantees UDPSize bytes here.
	udp := UDP(b[off : off+UDPSize])
	if roce && udp.DstPort() != RoCEv2Port {
		return encapPort, off
	}
	ul := int(udp.Length())
	switch {
	case ul < UDPSize:
		return encapUDPLenSmall, off
	case roce && ul != w.end-off:
		return encapUDPLenDiffers, off
	case ul > w.end-off:
		return encapUDPLenBeyond, off
	}
	if e != nil {
		e.IPOffset, e.UDPOffset = w.ipOff, off
		e.SrcPort, e.DstPort = udp.SrcPort(), udp.DstPort()
		e.Payload, e.End = off+UDPSize, off+ul
	}
	return encapOK, 0
}

// EncapParser is ParseEncap for a stream of frames, most of which repeat the
// headers of the frame before: one sender's datagrams, or the segments of
// one coalesced run, differ only in their lengths, IPv4 ID and checksums.
// A frame whose other header bytes equal those of the last frame parsed
// whole is checked by its lengths alone, and the addresses, ports and the
// rest are kept from that frame instead of decoded again. The zero value
// is ready; an EncapParser is not safe for concurrent use.
type EncapParser struct {
	e    Encap
	hdr  [parserWords * 8]byte // the last frame's headers, padded with zeros
	mask [parserWords]uint64   // which of their bytes a repeat must match
	nw   int                   // words of hdr compared; 0: nothing cached
}

// parserWords covers the largest header prefix, rounded up to whole words.
const parserWords = (MaxEncapSize + 7) / 8

// Parse walks b as ParseEncap does and returns the same result, in an
// Encap owned by p and valid until the next call. same reports that b
// repeats the headers of the previous frame that parsed without error in
// every field of the Encap but the payload's length (End): a caller may
// keep what it derived from them.
func (p *EncapParser) Parse(b []byte) (e *Encap, same bool, err error) {
	if p.nw > 0 && p.repeats(b) && p.lengths(b) {
		return &p.e, true, nil
	}
	var fr Encap // p.e stays the cached frame's if b fails
	if err := ParseEncap(b, &fr); err != nil {
		return nil, false, err
	}
	p.e = fr
	p.remember(b)
	return &p.e, false, nil
}

// repeats reports whether b's headers match the cached ones in every byte
// the mask keeps.
func (p *EncapParser) repeats(b []byte) bool {
	if len(b) < p.nw*8 {
		return false
	}
	var diff uint64
	for i, m := range p.mask[:p.nw] {
		diff |= (binary.LittleEndian.Uint64(b[i*8:]) ^ binary.LittleEndian.Uint64(p.hdr[i*8:])) & m
	}
	return diff == 0
}

// lengths checks the IP and UDP lengths of b, whose other header fields
// match the cached frame's, and sets p.e.End from them. It reports false
// for any length ParseEncap would refuse: the caller then takes the slow
// walk, which returns ParseEncap's own error.
func (p *EncapParser) lengths(b []byte) bool {
	ip := b[p.e.IPOffset:]
	var ipEnd int
	if p.e.Version == 4 {
		total := int(IPv4(ip).TotalLength())
		if total < IPv4Size+UDPSize || total > len(ip) {
			return false
		}
		ipEnd = p.e.IPOffset + total
	} else {
		plen := int(IPv6(ip).PayloadLength())
		if plen < UDPSize || IPv6Size+plen > len(ip) {
			return false
		}
		ipEnd = p.e.IPOffset + IPv6Size + plen
	}
	ulen := int(UDP(b[p.e.UDPOffset:]).Length())
	if ulen < UDPSize || ulen > ipEnd-p.e.UDPOffset {
		return false
	}
	p.e.End = p.e.UDPOffset + ulen
	return true
}

// remember caches the headers of b, just parsed into p.e, and which of
// their bytes a repeat must match: all but the IP and UDP lengths, the
// IPv4 ID and the checksums, none of which the Encap reports.
func (p *EncapParser) remember(b []byte) {
	n := p.e.Payload
	p.nw = (n + 7) / 8
	clear(p.hdr[:])
	copy(p.hdr[:], b[:n])
	var m [parserWords * 8]byte
	for i := range m[:n] {
		m[i] = 0xff
	}
	ip := m[p.e.IPOffset:]
	if p.e.Version == 4 {
		clear(ip[ipv4TotalLen : ipv4ID+2])
		clear(ip[ipv4Csum : ipv4Csum+2])
	} else {
		clear(ip[ipv6PayLen : ipv6PayLen+2])
	}
	clear(m[p.e.UDPOffset+udpLen : p.e.UDPOffset+UDPSize]) // length, checksum
	for i := range p.mask {
		p.mask[i] = binary.LittleEndian.Uint64(m[i*8:])
	}
}

// EncapHeader describes the Ethernet [+802.1Q] + IP + UDP prefix of a
// frame: what a transmitter puts in front of an IB packet, and what a link
// synthesizes in front of a received datagram.
type EncapHeader struct {
	Dst, Src         [6]byte // MAC addresses
	SrcAddr, DstAddr netip.Addr
	SrcPort, DstPort uint16
	TOS              uint8  // IPv4 TOS / IPv6 traffic class
	TTL              uint8  // IPv4 TTL / IPv6 hop limit
	FlowLabel        uint32 // IPv6 only
	IPID             uint16 // IPv4 only
	DF               bool   // IPv4 only
	VLAN             bool   // add one 802.1Q tag
	VLANID           uint16
	VLANPCP          uint8
}

// v4 reports whether Put writes an IPv4 header: when both addresses are
// IPv4 or IPv4-mapped. Any other pair, mixed families included, is written
// as IPv6 with the addresses' 16-byte forms, never a panic.
func (h *EncapHeader) v4() bool {
	return h.SrcAddr.Unmap().Is4() && h.DstAddr.Unmap().Is4()
}

// HeaderSize returns the size of the prefix Put writes for this header.
func (h *EncapHeader) HeaderSize() int { return h.size(h.v4()) }

// size is HeaderSize for an IPv4 (v4) or IPv6 header.
func (h *EncapHeader) size(v4 bool) int {
	n := EthernetSize + IPv6Size + UDPSize
	if v4 {
		n = EthernetSize + IPv4Size + UDPSize
	}
	if h.VLAN {
		n += VLANTagSize
	}
	return n
}

// Put writes the Ethernet, VLAN (if h.VLAN), IP and UDP headers for a
// payload of payloadLen bytes into b[:h.HeaderSize()] and returns that
// size. The IPv4 header checksum is computed; the UDP checksum is left zero
// (RoCEv2 does not use it, and the ICRC masks it). Both addresses IPv4 (or
// IPv4-mapped: they are unmapped) give an IPv4 header, anything else IPv6;
// b must be large enough. Put does not allocate.
func (h *EncapHeader) Put(b []byte, payloadLen int) int {
	v4 := h.v4()
	n := h.size(v4)
	b = b[:n]
	ipType := uint16(EtherTypeIPv6)
	if v4 {
		ipType = EtherTypeIPv4
	}
	eth := Ethernet(b[:EthernetSize])
	eth.SetDst(h.Dst)
	eth.SetSrc(h.Src)
	off := EthernetSize
	if h.VLAN {
		eth.SetEtherType(EtherTypeVLAN)
		VLANTag(b[off : off+VLANTagSize]).Encode(&VLANTagFields{PCP: h.VLANPCP, VID: h.VLANID, EtherType: ipType})
		off += VLANTagSize
	} else {
		eth.SetEtherType(ipType)
	}
	udpLen := uint16(UDPSize + payloadLen)
	if v4 {
		// Field by field rather than through IPv4Fields: this runs once
		// per transmitted frame.
		ip := IPv4(b[off : off+IPv4Size])
		ip[ipv4VerIHL] = ipv4Version<<4 | IPv4Size/4
		ip.SetTOS(h.TOS)
		ip.SetTotalLength(IPv4Size + udpLen)
		ip.SetID(h.IPID)
		var flags uint16
		if h.DF {
			flags = ipv4FlagDF
		}
		binary.BigEndian.PutUint16(ip[ipv4FlagsOff:], flags)
		ip.SetTTL(h.TTL)
		ip.SetProtocol(IPProtocolUDP)
		ip.SetSrc(h.SrcAddr)
		ip.SetDst(h.DstAddr)
		ip.UpdateChecksum()
		off += IPv4Size
	} else {
		IPv6(b[off : off+IPv6Size]).Encode(&IPv6Fields{
			TrafficClass: h.TOS, FlowLabel: h.FlowLabel, PayloadLength: udpLen,
			NextHeader: IPProtocolUDP, HopLimit: h.TTL, Src: h.SrcAddr, Dst: h.DstAddr,
		})
		off += IPv6Size
	}
	UDP(b[off:n]).Encode(&UDPFields{SrcPort: h.SrcPort, DstPort: h.DstPort, Length: udpLen})
	return n
}

// SetEncapLength rewrites the IP and UDP lengths (and the IPv4 header
// checksum) of the prefix b, as Put wrote it, for a payload of payloadLen
// bytes: a link that synthesizes the same prefix for many datagrams puts
// it once and patches only what differs.
func SetEncapLength(b []byte, payloadLen int) {
	off := EthernetSize
	et := Ethernet(b[:EthernetSize]).EtherType()
	if et == EtherTypeVLAN {
		et = VLANTag(b[off : off+VLANTagSize]).EtherType()
		off += VLANTagSize
	}
	udpLen := uint16(UDPSize + payloadLen)
	if et == EtherTypeIPv4 {
		ip := IPv4(b[off : off+IPv4Size])
		ip.SetTotalLength(IPv4Size + udpLen)
		ip.UpdateChecksum()
		off += IPv4Size
	} else {
		IPv6(b[off : off+IPv6Size]).SetPayloadLength(udpLen)
		off += IPv6Size
	}
	UDP(b[off : off+UDPSize]).SetLength(udpLen)
}
