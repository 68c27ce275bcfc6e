package wire

import (
	"encoding/binary"
	"net/netip"
)

// Datagram rsocket framing (ds_* and udp_svc_* in rsocket.c).
const (
	DSMsgSize       = SndLowat   // each UD message slot (ds_set_qp_size)
	DSGRHLen        = 40         // GRH area in front of every UD receive
	DSIPv4HdrLen    = 8          // DS_IPV4_HDR_LEN
	DSIPv6HdrLen    = 24         // DS_IPV6_HDR_LEN
	DSUDPTag        = 0x55555555 // DS_UDP_TAG
	DSUDPIPv4HdrLen = 16         // DS_UDP_IPV4_HDR_LEN
	DSUDPIPv6HdrLen = 28         // DS_UDP_IPV6_HDR_LEN
	// RDMAUDPQKey is the Q_Key of RDMA_PS_UDP QPs, used by datagram rsockets.
	RDMAUDPQKey = 0x01234567
)

// DSHeader is struct ds_header, the start of every UD SEND payload: the
// sender's address so rrecvfrom can report it.
//
//	IPv4 (8 bytes):  version 4, length 8, port (BE16), IPv4 address
//	IPv6 (24 bytes): version 6, length 24, port (BE16), flowinfo (BE32), IPv6 address
type DSHeader struct {
	Addr     netip.AddrPort
	FlowInfo uint32 // IPv6 only
}

// Len is the encoded length.
func (h DSHeader) Len() int {
	if h.Addr.Addr().Is4() {
		return DSIPv4HdrLen
	}
	return DSIPv6HdrLen
}

// AppendTo appends the header (ds_format_hdr).
func (h DSHeader) AppendTo(b []byte) []byte {
	a := h.Addr.Addr()
	if a.Is4() {
		b = append(b, 4, DSIPv4HdrLen)
		b = binary.BigEndian.AppendUint16(b, h.Addr.Port())
		v := a.As4()
		return append(b, v[:]...)
	}
	b = append(b, 6, DSIPv6HdrLen)
	b = binary.BigEndian.AppendUint16(b, h.Addr.Port())
	b = binary.BigEndian.AppendUint32(b, h.FlowInfo)
	v := a.As16()
	return append(b, v[:]...)
}

// ParseDSHeader decodes the header at the start of a UD payload (after the
// 40-byte GRH area), as ds_valid_recv accepts it: version 4 with length 8
// or version 6 with length 24, and the whole header present.
func ParseDSHeader(b []byte) (DSHeader, error) {
	if len(b) < DSIPv4HdrLen {
		return DSHeader{}, errShort
	}
	port := binary.BigEndian.Uint16(b[2:4])
	switch {
	case b[0] == 4 && b[1] == DSIPv4HdrLen:
		return DSHeader{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)}, nil
	case b[0] == 6 && b[1] == DSIPv6HdrLen:
		if len(b) < DSIPv6HdrLen {
			return DSHeader{}, errShort
		}
		return DSHeader{Addr: netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port),
			FlowInfo: binary.BigEndian.Uint32(b[4:8])}, nil
	}
	return DSHeader{}, errHeader
}

// UDPHeader is struct ds_udp_header, prefixed to datagrams sent over the
// kernel UDP socket while no address handle exists:
//
//	0  4  tag 0x55555555 (BE)
//	4  1  version 4 or 6
//	5  1  op: RS_OP_DATA (payload follows) or RS_OP_CTRL (QPN reply only)
//	6  1  length 16 (IPv4) or 28 (IPv6)
//	7  1  reserved 0
//	8  4  QPN of the sender's UD QP (BE, 24 bits)
//	12 4|16 the sender QP's own address (the receiver ignores it)
type UDPHeader struct {
	Op   Op
	QPN  uint32
	Addr netip.Addr
}

// AppendTo appends the header (ds_sendv_udp).
func (h UDPHeader) AppendTo(b []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, DSUDPTag)
	if h.Addr.Is4() {
		b = append(b, 4, byte(h.Op), DSUDPIPv4HdrLen, 0)
		b = binary.BigEndian.AppendUint32(b, h.QPN&0xFFFFFF)
		v := h.Addr.As4()
		return append(b, v[:]...)
	}
	b = append(b, 6, byte(h.Op), DSUDPIPv6HdrLen, 0)
	b = binary.BigEndian.AppendUint32(b, h.QPN&0xFFFFFF)
	v := h.Addr.As16()
	return append(b, v[:]...)
}

// ParseUDPHeader decodes the header of a datagram that came in on the UDP
// socket from a sender of family v6 (udp_svc_valid_udp_hdr checks tag,
// version and length against it). Stricter than librdmacm: op must be DATA
// or CTRL, the reserved byte and the QPN's top byte zero.
func ParseUDPHeader(b []byte, v6 bool) (UDPHeader, int, error) {
	if len(b) < DSUDPIPv4HdrLen {
		return UDPHeader{}, 0, errShort
	}
	if binary.BigEndian.Uint32(b[0:4]) != DSUDPTag || b[7] != 0 {
		return UDPHeader{}, 0, errHeader
	}
	h := UDPHeader{Op: Op(b[5]), QPN: binary.BigEndian.Uint32(b[8:12])}
	if h.Op != OpData && h.Op != OpCtrl || h.QPN > 0xFFFFFF {
		return UDPHeader{}, 0, errHeader
	}
	switch {
	case !v6 && b[4] == 4 && b[6] == DSUDPIPv4HdrLen:
		h.Addr = netip.AddrFrom4([4]byte(b[12:16]))
		return h, DSUDPIPv4HdrLen, nil
	case v6 && b[4] == 6 && b[6] == DSUDPIPv6HdrLen:
		if len(b) < DSUDPIPv6HdrLen {
			return UDPHeader{}, 0, errShort
		}
		h.Addr = netip.AddrFrom16([16]byte(b[12:28]))
		return h, DSUDPIPv6HdrLen, nil
	}
	return UDPHeader{}, 0, errHeader
}
