package udplink

import (
	"github.com/goroce/goroce/ib"
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
	ib.SetEncapLength(r.b[:r.n], plen)
	r.plen = plen
}
