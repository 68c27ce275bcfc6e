package link

import (
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/linkerr"
)

// Sizes of the headers a link walks or synthesizes (ib's).
const (
	EthernetSize = ib.EthernetSize
	VLANTagSize  = ib.VLANTagSize
	IPv4Size     = ib.IPv4Size
	IPv6Size     = ib.IPv6Size
	UDPSize      = ib.UDPSize

	// MaxHeaderSize is the largest Ethernet+VLAN+IP+UDP prefix a link
	// synthesizes or accepts in front of a UDP payload.
	MaxHeaderSize = ib.MaxEncapSize
)

// EtherTypes the walk understands.
const (
	EtherTypeIPv4 = ib.EtherTypeIPv4
	EtherTypeIPv6 = ib.EtherTypeIPv6
	EtherTypeVLAN = ib.EtherTypeVLAN
)

// Frame is the result of walking an Ethernet frame's headers: offsets
// into the frame, not copies, so parsing never allocates.
type Frame = ib.Encap

// ParseFrame walks Ethernet [+802.1Q] + IPv4/IPv6 + UDP with ib.ParseEncap.
// It accepts no IP options, IPv4 fragments or IPv6 extension headers,
// which RoCEv2 never uses. Errors are ErrMalformed (reasons truncated,
// not-ip, not-udp, header).
func ParseFrame(b []byte) (f Frame, err error) {
	if err = ib.ParseEncap(b, &f); err != nil {
		err = frameErr(err)
	}
	return f, err
}

// frameErr maps ib.ParseEncap's errors to the link's own.
func frameErr(err error) error {
	switch err {
	case ib.ErrTruncated:
		return linkerr.Truncated
	case ib.ErrNotIP:
		return linkerr.NotIP
	case ib.ErrNotUDP:
		return linkerr.NotUDP
	}
	return linkerr.Header
}

// Header describes the Ethernet+IP+UDP prefix a link synthesizes in front
// of a received datagram, and the device in front of a transmitted packet
// (ib.EncapHeader: Put writes it, HeaderSize is its size).
type Header = ib.EncapHeader

// IPv4Checksum returns the Internet checksum over hdr, a 20-byte IPv4
// header: the value for its checksum field when that field is zero, and
// zero when the header's checksum is valid. It is ib.IPv4's checksum (the
// one implementation) in the form the link's callers use; new code can use
// ib.IPv4's UpdateChecksum and ChecksumValid directly.
func IPv4Checksum(hdr []byte) uint16 {
	h := ib.IPv4(hdr)
	// ComputeChecksum leaves out the stored field; add it back in.
	s := uint32(^h.ComputeChecksum()) + uint32(h.Checksum())
	s = s&0xffff + s>>16
	return ^uint16(s)
}
