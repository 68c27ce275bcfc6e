package udplink

import (
	"encoding/binary"

	"github.com/goroce/goroce/link"
)

// rxHeader builds the synthesized headers of received datagrams. The
// datagrams of one receive buffer (every segment of a coalesced run) and,
// mostly, of one batch share their sender, destination and TOS, so the
// header is put once and copied, with only the lengths (and the IPv4
// checksum) rewritten when the payload length changes. The bytes are those
// link.Header.Put writes.
type rxHeader struct {
	h    link.Header
	b    [link.MaxHeaderSize]byte
	n    int // header size; 0: nothing built yet
	plen int // payload length b carries
}

// set makes h the header of the datagrams that follow.
func (r *rxHeader) set(h *link.Header) {
	if r.n != 0 && *h == r.h {
		return
	}
	r.h = *h
	r.n = h.Put(r.b[:], 0)
	r.plen = 0
}

// size is the header size of the current header.
func (r *rxHeader) size() int { return r.n }

// put writes the current header for a payload of plen bytes into b[:size].
func (r *rxHeader) put(b []byte, plen int) {
	if plen != r.plen {
		r.setLen(plen)
	}
	copy(b[:r.n], r.b[:r.n])
}

// setLen rewrites the length fields for a payload of plen bytes.
func (r *rxHeader) setLen(plen int) {
	ip := r.b[link.EthernetSize:]
	var udp []byte
	if binary.BigEndian.Uint16(r.b[12:]) == link.EtherTypeIPv4 {
		binary.BigEndian.PutUint16(ip[2:], uint16(link.IPv4Size+link.UDPSize+plen))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], link.IPv4Checksum(ip[:link.IPv4Size]))
		udp = ip[link.IPv4Size:]
	} else {
		binary.BigEndian.PutUint16(ip[4:], uint16(link.UDPSize+plen))
		udp = ip[link.IPv6Size:]
	}
	binary.BigEndian.PutUint16(udp[4:], uint16(link.UDPSize+plen))
	r.plen = plen
}
