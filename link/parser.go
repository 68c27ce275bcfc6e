package link

import "encoding/binary"

// Parser is ParseFrame for a stream of frames, most of which repeat the
// headers of the frame before: one sender's datagrams, or the segments of
// one coalesced run, differ only in their lengths, IPv4 ID and checksums.
// A frame whose other header bytes equal those of the last frame parsed
// whole is checked by its lengths alone, and the addresses, ports and the
// rest are kept from that frame instead of decoded again. The zero value
// is ready; a Parser is not safe for concurrent use.
type Parser struct {
	f    Frame
	hdr  [parserWords * 8]byte // the last frame's headers, padded with zeros
	mask [parserWords]uint64   // which of their bytes a repeat must match
	nw   int                   // words of hdr compared; 0: nothing cached
}

// parserWords covers the largest header prefix, rounded up to whole words.
const parserWords = (MaxHeaderSize + 7) / 8

// Parse walks b as ParseFrame does and returns the same result, in a
// Frame owned by p and valid until the next call. same reports that b
// repeats the headers of the previous frame that parsed without error in
// every field of the Frame but Payload's length (End): a caller may keep
// what it derived from them.
func (p *Parser) Parse(b []byte) (f *Frame, same bool, err error) {
	if p.nw > 0 && p.repeats(b) && p.lengths(b) {
		return &p.f, true, nil
	}
	fr, err := ParseFrame(b)
	if err != nil {
		return nil, false, err
	}
	p.f = fr
	p.remember(b)
	return &p.f, false, nil
}

// repeats reports whether b's headers match the cached ones in every byte
// the mask keeps.
func (p *Parser) repeats(b []byte) bool {
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
// match the cached frame's, and sets p.f.End from them. It reports false
// for any length ParseFrame would refuse: the caller then takes the slow
// walk, which returns ParseFrame's own error.
func (p *Parser) lengths(b []byte) bool {
	ip := b[p.f.IPOffset:]
	var ipEnd int
	if p.f.Version == 4 {
		total := int(binary.BigEndian.Uint16(ip[2:]))
		if total < IPv4Size+UDPSize || total > len(ip) {
			return false
		}
		ipEnd = p.f.IPOffset + total
	} else {
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if plen < UDPSize || IPv6Size+plen > len(ip) {
			return false
		}
		ipEnd = p.f.IPOffset + IPv6Size + plen
	}
	ulen := int(binary.BigEndian.Uint16(b[p.f.UDPOffset+4:]))
	if ulen < UDPSize || ulen > ipEnd-p.f.UDPOffset {
		return false
	}
	p.f.End = p.f.UDPOffset + ulen
	return true
}

// remember caches the headers of b, just parsed into p.f, and which of
// their bytes a repeat must match: all but the IP and UDP lengths, the
// IPv4 ID and the checksums, none of which the Frame reports.
func (p *Parser) remember(b []byte) {
	n := p.f.Payload
	p.nw = (n + 7) / 8
	clear(p.hdr[:])
	copy(p.hdr[:], b[:n])
	var m [parserWords * 8]byte
	for i := range m[:n] {
		m[i] = 0xff
	}
	ip := m[p.f.IPOffset:]
	if p.f.Version == 4 {
		clear(ip[2:6])   // total length, ID
		clear(ip[10:12]) // header checksum
	} else {
		clear(ip[4:6]) // payload length
	}
	clear(m[p.f.UDPOffset+4 : p.f.UDPOffset+8]) // UDP length, checksum
	for i := range p.mask {
		p.mask[i] = binary.LittleEndian.Uint64(m[i*8:])
	}
}
