package ib

import "encoding/binary"

// Sizes of the InfiniBand transport headers in bytes.
const (
	BTHSize          = 12
	RDETHSize        = 4
	DETHSize         = 8
	RETHSize         = 16
	AtomicETHSize    = 28
	AETHSize         = 4
	AtomicAckETHSize = 8
	ImmDtSize        = 4
	IETHSize         = 4
	FETHSize         = 4
	XRCETHSize       = 4
	// CNPReservedSize is the reserved block that follows the BTH of a CNP.
	CNPReservedSize = 16
	ICRCSize        = 4
)

// BTH field offsets and bit masks (IBTA vol 1 §9.2; rxe_hdr.h struct rxe_bth).
const (
	bthOpcode   = 0
	bthFlags    = 1 // SE, M, PadCnt, TVer
	bthPKey     = 2
	bthQPN      = 4 // byte 4: FECN, BECN, resv6; bytes 5-7: DestQP
	bthPSN      = 8 // byte 8: AckReq, resv7; bytes 9-11: PSN
	bthSEMask   = 0x80
	bthMigMask  = 0x40
	bthPadMask  = 0x30
	bthTVerMask = 0x0f
	bthFECNMask = 0x80
	bthBECNMask = 0x40
	bthAckMask  = 0x80
	mask24      = 0x00ffffff
)

// BTH is a view of the 12-byte Base Transport Header.
type BTH []byte

// BTHFields holds every field of a BTH. Reserved bits are written as zero.
type BTHFields struct {
	Opcode    Opcode
	Solicited bool
	MigReq    bool
	PadCount  uint8
	TVer      uint8
	PKey      uint16
	FECN      bool
	BECN      bool
	DestQP    uint32
	AckReq    bool
	PSN       PSN
}

// Opcode returns the OpCode field.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// SetOpcode sets the OpCode field.
func (b BTH) SetOpcode(o Opcode) { b[bthOpcode] = uint8(o) }

// Solicited reports the SE (solicited event) bit.
func (b BTH) Solicited() bool { return b[bthFlags]&bthSEMask != 0 }

// SetSolicited sets the SE bit.
func (b BTH) SetSolicited(v bool) { setBit(&b[bthFlags], bthSEMask, v) }

// MigReq reports the M (migration request) bit.
func (b BTH) MigReq() bool { return b[bthFlags]&bthMigMask != 0 }

// SetMigReq sets the M bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[bthFlags], bthMigMask, v) }

// PadCount returns PadCnt, the number of pad bytes after the payload (0-3).
func (b BTH) PadCount() uint8 { return (b[bthFlags] & bthPadMask) >> 4 }

// SetPadCount sets PadCnt; only the low two bits of n are used.
func (b BTH) SetPadCount(n uint8) { b[bthFlags] = b[bthFlags]&^bthPadMask | (n<<4)&bthPadMask }

// TVer returns the transport header version (0 on every valid packet).
func (b BTH) TVer() uint8 { return b[bthFlags] & bthTVerMask }

// SetTVer sets the transport header version; only the low four bits are used.
func (b BTH) SetTVer(v uint8) { b[bthFlags] = b[bthFlags]&^bthTVerMask | v&bthTVerMask }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// SetPKey sets the partition key.
func (b BTH) SetPKey(k uint16) { binary.BigEndian.PutUint16(b[bthPKey:], k) }

// FECN reports the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[bthQPN]&bthFECNMask != 0 }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[bthQPN], bthFECNMask, v) }

// BECN reports the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[bthQPN]&bthBECNMask != 0 }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[bthQPN], bthBECNMask, v) }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return Uint24(b[bthQPN+1:]) }

// SetDestQP sets the destination QP number; only the low 24 bits are used.
func (b BTH) SetDestQP(q uint32) { PutUint24(b[bthQPN+1:], q) }

// AckReq reports the acknowledge-request bit.
func (b BTH) AckReq() bool { return b[bthPSN]&bthAckMask != 0 }

// SetAckReq sets the acknowledge-request bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[bthPSN], bthAckMask, v) }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() PSN { return PSN(Uint24(b[bthPSN+1:])) }

// SetPSN sets the packet sequence number; only the low 24 bits are used.
func (b BTH) SetPSN(p PSN) { PutUint24(b[bthPSN+1:], uint32(p)) }

// Encode writes every field of f into b, zeroing the reserved bits.
func (b BTH) Encode(f *BTHFields) {
	_ = b[BTHSize-1]
	b[bthOpcode] = uint8(f.Opcode)
	b[bthFlags] = boolBit(f.Solicited, bthSEMask) | boolBit(f.MigReq, bthMigMask) |
		(f.PadCount<<4)&bthPadMask | f.TVer&bthTVerMask
	binary.BigEndian.PutUint16(b[bthPKey:], f.PKey)
	b[bthQPN] = boolBit(f.FECN, bthFECNMask) | boolBit(f.BECN, bthBECNMask)
	PutUint24(b[bthQPN+1:], f.DestQP)
	b[bthPSN] = boolBit(f.AckReq, bthAckMask)
	PutUint24(b[bthPSN+1:], uint32(f.PSN))
}

// Fields decodes every field of b; a short view reads as zero-padded.
func (b BTH) Fields() BTHFields {
	b = BTH(full(b, BTHSize))
	return BTHFields{
		Opcode:    b.Opcode(),
		Solicited: b.Solicited(),
		MigReq:    b.MigReq(),
		PadCount:  b.PadCount(),
		TVer:      b.TVer(),
		PKey:      b.PKey(),
		FECN:      b.FECN(),
		BECN:      b.BECN(),
		DestQP:    b.DestQP(),
		AckReq:    b.AckReq(),
		PSN:       b.PSN(),
	}
}

// ParseBTH returns the BTH at the start of b, or a *ParseError if b is too short.
func ParseBTH(b []byte) (BTH, error) {
	v, err := checkedView(b, BTHSize, "bth")
	return BTH(v), err
}

// setBit sets or clears mask in *p.
func setBit(p *uint8, mask uint8, v bool) {
	if v {
		*p |= mask
	} else {
		*p &^= mask
	}
}

// boolBit returns mask if v, else 0.
func boolBit(v bool, mask uint8) uint8 {
	if v {
		return mask
	}
	return 0
}

// Uint24 reads a big-endian 24-bit value (a QPN, PSN, EECN or MSN; the
// CM's MAD fields use the same width).
func Uint24(b []byte) uint32 { _ = b[2]; return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

// PutUint24 writes the low 24 bits of v big-endian.
func PutUint24(b []byte, v uint32) {
	_ = b[2]
	b[0] = byte(v >> 16)
	b[1] = byte(v >> 8)
	b[2] = byte(v)
}

// full returns b if it holds at least n bytes, else a zero-padded copy, so
// that Fields never reads out of bounds (the copy only happens on bad input).
func full(b []byte, n int) []byte {
	if len(b) >= n {
		return b
	}
	c := make([]byte, n)
	copy(c, b)
	return c
}

// checkedView returns b[:n:n] or a truncation error naming layer.
func checkedView(b []byte, n int, layer string) ([]byte, error) {
	if len(b) < n {
		return nil, &ParseError{Layer: layer, Offset: 0, Err: ErrTruncated, Reason: "shorter than header"}
	}
	return b[:n:n], nil
}
