package ib

import (
	"encoding/binary"
	"math/bits"
)

// Packet holds views of every header of one decoded RoCEv2 packet. All
// slices alias the decoded buffer; headers the packet does not carry are nil.
type Packet struct {
	Eth  Ethernet
	VLAN VLANTag // nil if untagged
	IPv4 IPv4    // exactly one of IPv4/IPv6 is set by Parse; neither by ParseIB
	IPv6 IPv6
	UDP  UDP

	BTH          BTH
	RDETH        RDETH
	DETH         DETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	FETH         FETH
	XRCETH       XRCETH
	CNPReserved  []byte
	DCETH        DCETH  // DC only (ParseDC)
	DCCETH       DCCETH // DC CONNECT only (ParseDC)

	Payload []byte // data only, pad excluded
	Pad     []byte
	ICRC    []byte

	// IB is the whole IB packet, BTH through ICRC (the UDP payload).
	IB []byte
	// Info is the opcode table entry of BTH.Opcode().
	Info OpcodeInfo

	ip       []byte // IP header as transmitted
	datagram []byte // UDP header through ICRC
	err      ParseError
}

// Reset clears every view so the packet holds nothing. An error returned by
// an earlier Parse into p stays readable.
func (p *Packet) Reset() {
	// Cleared in place, not by assigning a composite literal: that builds
	// the whole zero Packet on the stack and copies it over, which was
	// most of the cost of decoding a small packet.
	err := p.err
	*p = Packet{}
	p.err = err
}

// fail resets p, records a parse error in it and reports false; Parse returns a pointer
// to the recorded error so that rejecting a packet does not allocate.
func (p *Packet) fail(layer string, off int, err error, reason string) bool {
	*p = Packet{err: ParseError{Layer: layer, Offset: off, Err: err, Reason: reason}}
	return false
}

// Parse decodes a whole Ethernet frame (optionally with one 802.1Q tag,
// IPv4 without options or IPv6 without extension headers, UDP to port 4791)
// into p. Lengths come from the IP and UDP length fields; bytes after the IP
// datagram (Ethernet padding) are ignored. Parse does not verify the ICRC
// (use p.VerifyICRC), the IPv4 header checksum or a UDP checksum: the ICRC
// covers every field those protect that matters to the transport.
//
// On failure p is reset and the error is a *ParseError stored inside p: it
// stays valid until the next failing Parse or ParseIB into p (copy it to keep
// it longer). Parse never allocates.
func Parse(frame []byte, p *Packet) error {
	if p == nil {
		return errNilPacket
	}
	if !p.parse(frame, &opcodeTable) {
		return &p.err
	}
	return nil
}

// ParseIB decodes an IB packet, BTH through ICRC (a RoCEv2 UDP payload as a
// kernel UDP socket delivers it), into p. The encapsulation views and the
// ICRC check are unavailable; compute the ICRC with ICRC if the IP header is
// known. Errors are as for Parse, with offsets relative to b.
func ParseIB(b []byte, p *Packet) error {
	if p == nil {
		return errNilPacket
	}
	p.Reset()
	if !p.parseIB(b, 0, &opcodeTable) {
		return &p.err
	}
	return nil
}

// parse decodes frame with the opcode table tbl.
func (p *Packet) parse(frame []byte, tbl *[256]OpcodeInfo) bool {
	p.Reset()
	var w encapWalk
	if c, off := walkEncap(frame, &w, nil, true); c != encapOK {
		k := &encapChecks[c]
		return p.fail(k.layer, off+k.field, k.err, k.reason)
	}
	p.Eth = Ethernet(frame[:EthernetSize:EthernetSize])
	if w.vlan {
		p.VLAN = VLANTag(frame[EthernetSize : EthernetSize+VLANTagSize : EthernetSize+VLANTagSize])
	}
	ip, off := w.ipOff, w.udpOff
	p.ip = frame[ip:off:off]
	if w.v6 {
		p.IPv6 = p.ip
	} else {
		p.IPv4 = p.ip
	}
	end := w.end
	p.UDP = UDP(frame[off : off+UDPSize : off+UDPSize])
	p.datagram = frame[off:end:end]
	return p.parseIB(frame[off+UDPSize:end:end], off+UDPSize, tbl)
}

// parseIB decodes BTH … ICRC from b with the opcode table tbl; base is b's
// offset in the caller's input.
func (p *Packet) parseIB(b []byte, base int, tbl *[256]OpcodeInfo) bool {
	if len(b) < BTHSize {
		return p.fail("bth", base, ErrTruncated, "shorter than BTH")
	}
	bth := BTH(b[:BTHSize:BTHSize])
	if bth.TVer() != 0 {
		return p.fail("bth", base+bthFlags, ErrUnsupported, "transport header version is not 0")
	}
	info := &tbl[bth.Opcode()]
	if !info.Valid {
		return p.fail("bth", base+bthOpcode, ErrUnsupported, "undefined opcode")
	}
	if info.HeaderLen > len(b) {
		// Some header does not fit: the first in wire order is the error.
		for i, h := range headerOrder {
			if info.Headers&h == 0 {
				continue
			}
			if e := int(info.offsets[i]) + h.Size(); e > len(b) {
				return p.fail(h.Layer(), base+int(info.offsets[i]), ErrTruncated, "no room for header the opcode requires")
			}
		}
	}
	// Every header fits: visit only those the opcode has, in any order.
	for m := info.Headers; m != 0; m &= m - 1 {
		i := headerIndex[bits.TrailingZeros16(uint16(m))]
		o := int(info.offsets[i])
		e := o + int(headerSizes[i])
		p.setHeader(headerOrder[i], b[o:e:e])
	}
	hl := info.HeaderLen
	if len(b)-hl < ICRCSize {
		return p.fail("icrc", base+hl, ErrTruncated, "no room for ICRC")
	}
	rest := len(b) - hl - ICRCSize // payload + pad
	pad := int(bth.PadCount())
	if !info.Payload && rest != 0 {
		return p.fail("payload", base+hl, ErrMalformed, "data after headers of an opcode without payload")
	}
	if pad > rest {
		return p.fail("bth", base+bthFlags, ErrMalformed, "pad count beyond payload")
	}
	dataEnd := hl + rest - pad
	icrc := len(b) - ICRCSize
	p.BTH = bth
	p.Payload = b[hl:dataEnd:dataEnd]
	p.Pad = b[dataEnd:icrc:icrc]
	p.ICRC = b[icrc:len(b):len(b)]
	p.IB = b
	p.Info = *info
	return true
}

// setHeader sets the view of extended header h to v.
func (p *Packet) setHeader(h HeaderMask, v []byte) {
	switch h {
	case HdrRDETH:
		p.RDETH = v
	case HdrDETH:
		p.DETH = v
	case HdrRETH:
		p.RETH = v
	case HdrAtomicETH:
		p.AtomicETH = v
	case HdrAETH:
		p.AETH = v
	case HdrAtomicAckETH:
		p.AtomicAckETH = v
	case HdrImmDt:
		p.ImmDt = v
	case HdrIETH:
		p.IETH = v
	case HdrFETH:
		p.FETH = v
	case HdrXRCETH:
		p.XRCETH = v
	case HdrCNPReserved:
		p.CNPReserved = v
	case HdrDCETH:
		p.DCETH = v
	case HdrDCCETH:
		p.DCCETH = v
	}
}

// headerIndex maps a HeaderMask bit number to the header's position in
// headerOrder; headerSizes holds the sizes in that order.
var headerIndex, headerSizes = func() (idx, size [NumHeaders]uint8) {
	for i, h := range headerOrder {
		idx[bits.TrailingZeros16(uint16(h))] = uint8(i)
		size[i] = uint8(h.Size())
	}
	return
}()

// VerifyICRC checks the ICRC of a packet decoded by Parse. It returns
// ErrBadICRC on mismatch and a *ParseError if p holds no IP header (ParseIB).
func (p *Packet) VerifyICRC() error {
	if p == nil || p.ip == nil || len(p.datagram) < UDPSize+BTHSize+ICRCSize {
		return errNoIP
	}
	n := len(p.datagram) - ICRCSize
	if ICRC(p.ip, p.datagram[:n]) != binary.LittleEndian.Uint32(p.datagram[n:]) {
		return ErrBadICRC
	}
	return nil
}

// ComputeICRC returns the ICRC the packet decoded by Parse should carry
// (0 if p holds no IP header).
func (p *Packet) ComputeICRC() uint32 {
	if p.ip == nil || len(p.datagram) < UDPSize+ICRCSize {
		return 0
	}
	return ICRC(p.ip, p.datagram[:len(p.datagram)-ICRCSize])
}

// UDPChecksumValid reports whether the UDP checksum is absent (zero) or correct.
func (p *Packet) UDPChecksumValid() bool {
	if p.UDP == nil || p.UDP.Checksum() == 0 {
		return true
	}
	return UDPChecksum(p.ip, p.datagram) == p.UDP.Checksum()
}

// SetFrameICRC computes the ICRC of a complete frame and writes it into the
// frame's last four IB bytes. It fails if the frame does not parse.
func SetFrameICRC(frame []byte) error {
	var p Packet
	if !p.parseAny(frame) {
		e := p.err
		return &e
	}
	n := len(p.datagram) - ICRCSize
	PutICRC(p.datagram[n:], ICRC(p.ip, p.datagram[:n]))
	return nil
}

// parseAny parses frame as Parse does or, failing that, as ParseDC does:
// the ICRC helpers need only the lengths, and a DC frame need not fit RD's
// header layout.
func (p *Packet) parseAny(frame []byte) bool {
	return p.parse(frame, &opcodeTable) || p.parse(frame, &dcProfileTable)
}

// VerifyFrameICRC parses frame and checks its ICRC: nil, ErrBadICRC, or the
// *ParseError that rejected the frame.
func VerifyFrameICRC(frame []byte) error {
	var p Packet
	if !p.parseAny(frame) {
		e := p.err
		return &e
	}
	return p.VerifyICRC()
}
