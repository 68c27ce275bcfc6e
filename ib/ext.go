package ib

import "encoding/binary"

// Extended transport header field offsets (rxe_hdr.h; IBTA vol 1 §9.3).
const (
	rdethEEC      = 1 // byte 0 reserved
	dethQKey      = 0
	dethSrcQP     = 5 // byte 4 reserved
	rethVA        = 0
	rethRKey      = 8
	rethDMALen    = 12
	atomicVA      = 0
	atomicRKey    = 8
	atomicSwapAdd = 12
	atomicCompare = 20
	aethSyndrome  = 0
	aethMSN       = 1
	atomicAckOrig = 0
	immDtImm      = 0
	iethRKey      = 0
	fethWord      = 3 // placement and selectivity live in the last byte of the word
	fethPLTMask   = 0x0f
	fethSelMask   = 0x30
	xrcethSRQN    = 1 // byte 0 reserved
)

// RDETH is a view of the 4-byte Reliable Datagram ETH.
type RDETH []byte

// RDETHFields holds the fields of an RDETH.
type RDETHFields struct {
	EEC uint32 // 24-bit EE context
}

// EEC returns the 24-bit EE context number.
func (b RDETH) EEC() uint32 { return Uint24(b[rdethEEC:]) }

// SetEEC sets the EE context number; only the low 24 bits are used.
func (b RDETH) SetEEC(v uint32) { PutUint24(b[rdethEEC:], v) }

// Encode writes f into b, zeroing the reserved byte.
func (b RDETH) Encode(f *RDETHFields) { b[0] = 0; b.SetEEC(f.EEC) }

// Fields decodes b; a short view reads as zero-padded.
func (b RDETH) Fields() RDETHFields { b = full(b, RDETHSize); return RDETHFields{EEC: b.EEC()} }

// ParseRDETH returns the RDETH at the start of b, or a *ParseError if b is too short.
func ParseRDETH(b []byte) (RDETH, error) { v, err := checkedView(b, RDETHSize, "rdeth"); return v, err }

// DETH is a view of the 8-byte Datagram ETH.
type DETH []byte

// DETHFields holds the fields of a DETH.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32 // 24 bits
}

// QKey returns the queue key.
func (b DETH) QKey() uint32 { return binary.BigEndian.Uint32(b[dethQKey:]) }

// SetQKey sets the queue key.
func (b DETH) SetQKey(v uint32) { binary.BigEndian.PutUint32(b[dethQKey:], v) }

// SrcQP returns the 24-bit source QP number.
func (b DETH) SrcQP() uint32 { return Uint24(b[dethSrcQP:]) }

// SetSrcQP sets the source QP number; only the low 24 bits are used.
func (b DETH) SetSrcQP(v uint32) { PutUint24(b[dethSrcQP:], v) }

// Encode writes f into b, zeroing the reserved byte.
func (b DETH) Encode(f *DETHFields) { b.SetQKey(f.QKey); b[4] = 0; b.SetSrcQP(f.SrcQP) }

// Fields decodes b; a short view reads as zero-padded.
func (b DETH) Fields() DETHFields {
	b = full(b, DETHSize)
	return DETHFields{QKey: b.QKey(), SrcQP: b.SrcQP()}
}

// ParseDETH returns the DETH at the start of b, or a *ParseError if b is too short.
func ParseDETH(b []byte) (DETH, error) { v, err := checkedView(b, DETHSize, "deth"); return v, err }

// RETH is a view of the 16-byte RDMA ETH.
type RETH []byte

// RETHFields holds the fields of a RETH.
type RETHFields struct {
	VA     uint64
	RKey   uint32
	DMALen uint32 // total length of the RDMA operation
}

// VA returns the virtual address.
func (b RETH) VA() uint64 { return binary.BigEndian.Uint64(b[rethVA:]) }

// SetVA sets the virtual address.
func (b RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[rethVA:], v) }

// RKey returns the remote key.
func (b RETH) RKey() uint32 { return binary.BigEndian.Uint32(b[rethRKey:]) }

// SetRKey sets the remote key.
func (b RETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[rethRKey:], v) }

// DMALen returns the DMA length of the whole operation.
func (b RETH) DMALen() uint32 { return binary.BigEndian.Uint32(b[rethDMALen:]) }

// SetDMALen sets the DMA length.
func (b RETH) SetDMALen(v uint32) { binary.BigEndian.PutUint32(b[rethDMALen:], v) }

// Encode writes f into b.
func (b RETH) Encode(f *RETHFields) { b.SetVA(f.VA); b.SetRKey(f.RKey); b.SetDMALen(f.DMALen) }

// Fields decodes b; a short view reads as zero-padded.
func (b RETH) Fields() RETHFields {
	b = full(b, RETHSize)
	return RETHFields{VA: b.VA(), RKey: b.RKey(), DMALen: b.DMALen()}
}

// ParseRETH returns the RETH at the start of b, or a *ParseError if b is too short.
func ParseRETH(b []byte) (RETH, error) { v, err := checkedView(b, RETHSize, "reth"); return v, err }

// AtomicETH is a view of the 28-byte Atomic ETH.
type AtomicETH []byte

// AtomicETHFields holds the fields of an AtomicETH.
type AtomicETHFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64 // swap value (CmpSwap) or addend (FetchAdd)
	Compare uint64 // compare value (CmpSwap only)
}

// VA returns the virtual address (8-byte aligned on valid requests).
func (b AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(b[atomicVA:]) }

// SetVA sets the virtual address.
func (b AtomicETH) SetVA(v uint64) { binary.BigEndian.PutUint64(b[atomicVA:], v) }

// RKey returns the remote key.
func (b AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(b[atomicRKey:]) }

// SetRKey sets the remote key.
func (b AtomicETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[atomicRKey:], v) }

// SwapAdd returns the swap (CmpSwap) or add (FetchAdd) operand.
func (b AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(b[atomicSwapAdd:]) }

// SetSwapAdd sets the swap/add operand.
func (b AtomicETH) SetSwapAdd(v uint64) { binary.BigEndian.PutUint64(b[atomicSwapAdd:], v) }

// Compare returns the compare operand.
func (b AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(b[atomicCompare:]) }

// SetCompare sets the compare operand.
func (b AtomicETH) SetCompare(v uint64) { binary.BigEndian.PutUint64(b[atomicCompare:], v) }

// Encode writes f into b.
func (b AtomicETH) Encode(f *AtomicETHFields) {
	b.SetVA(f.VA)
	b.SetRKey(f.RKey)
	b.SetSwapAdd(f.SwapAdd)
	b.SetCompare(f.Compare)
}

// Fields decodes b; a short view reads as zero-padded.
func (b AtomicETH) Fields() AtomicETHFields {
	b = full(b, AtomicETHSize)
	return AtomicETHFields{VA: b.VA(), RKey: b.RKey(), SwapAdd: b.SwapAdd(), Compare: b.Compare()}
}

// ParseAtomicETH returns the AtomicETH at the start of b, or a *ParseError if b is too short.
func ParseAtomicETH(b []byte) (AtomicETH, error) {
	v, err := checkedView(b, AtomicETHSize, "atomiceth")
	return v, err
}

// AETH is a view of the 4-byte ACK ETH.
type AETH []byte

// AETHFields holds the fields of an AETH.
type AETHFields struct {
	Syndrome Syndrome
	MSN      uint32 // 24-bit message sequence number
}

// Syndrome returns the ACK/NAK syndrome.
func (b AETH) Syndrome() Syndrome { return Syndrome(b[aethSyndrome]) }

// SetSyndrome sets the syndrome.
func (b AETH) SetSyndrome(s Syndrome) { b[aethSyndrome] = uint8(s) }

// MSN returns the 24-bit message sequence number.
func (b AETH) MSN() uint32 { return Uint24(b[aethMSN:]) }

// SetMSN sets the message sequence number; only the low 24 bits are used.
func (b AETH) SetMSN(v uint32) { PutUint24(b[aethMSN:], v) }

// Encode writes f into b.
func (b AETH) Encode(f *AETHFields) { b.SetSyndrome(f.Syndrome); b.SetMSN(f.MSN) }

// Fields decodes b; a short view reads as zero-padded.
func (b AETH) Fields() AETHFields {
	b = full(b, AETHSize)
	return AETHFields{Syndrome: b.Syndrome(), MSN: b.MSN()}
}

// ParseAETH returns the AETH at the start of b, or a *ParseError if b is too short.
func ParseAETH(b []byte) (AETH, error) { v, err := checkedView(b, AETHSize, "aeth"); return v, err }

// AtomicAckETH is a view of the 8-byte Atomic Acknowledge ETH.
type AtomicAckETH []byte

// AtomicAckETHFields holds the fields of an AtomicAckETH.
type AtomicAckETHFields struct {
	Orig uint64 // value at the target before the atomic operation
}

// Orig returns the original remote data.
func (b AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(b[atomicAckOrig:]) }

// SetOrig sets the original remote data.
func (b AtomicAckETH) SetOrig(v uint64) { binary.BigEndian.PutUint64(b[atomicAckOrig:], v) }

// Encode writes f into b.
func (b AtomicAckETH) Encode(f *AtomicAckETHFields) { b.SetOrig(f.Orig) }

// Fields decodes b; a short view reads as zero-padded.
func (b AtomicAckETH) Fields() AtomicAckETHFields {
	b = full(b, AtomicAckETHSize)
	return AtomicAckETHFields{Orig: b.Orig()}
}

// ParseAtomicAckETH returns the AtomicAckETH at the start of b, or a *ParseError if b is too short.
func ParseAtomicAckETH(b []byte) (AtomicAckETH, error) {
	v, err := checkedView(b, AtomicAckETHSize, "atomicacketh")
	return v, err
}

// ImmDt is a view of the 4-byte Immediate Data header.
type ImmDt []byte

// ImmDtFields holds the fields of an ImmDt.
type ImmDtFields struct {
	Imm uint32 // opaque; delivered in network order by verbs
}

// Imm returns the immediate data.
func (b ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(b[immDtImm:]) }

// SetImm sets the immediate data.
func (b ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(b[immDtImm:], v) }

// Encode writes f into b.
func (b ImmDt) Encode(f *ImmDtFields) { b.SetImm(f.Imm) }

// Fields decodes b; a short view reads as zero-padded.
func (b ImmDt) Fields() ImmDtFields { b = full(b, ImmDtSize); return ImmDtFields{Imm: b.Imm()} }

// ParseImmDt returns the ImmDt at the start of b, or a *ParseError if b is too short.
func ParseImmDt(b []byte) (ImmDt, error) { v, err := checkedView(b, ImmDtSize, "immdt"); return v, err }

// IETH is a view of the 4-byte Invalidate ETH.
type IETH []byte

// IETHFields holds the fields of an IETH.
type IETHFields struct {
	RKey uint32 // R_Key to invalidate at the responder
}

// RKey returns the R_Key to invalidate.
func (b IETH) RKey() uint32 { return binary.BigEndian.Uint32(b[iethRKey:]) }

// SetRKey sets the R_Key to invalidate.
func (b IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(b[iethRKey:], v) }

// Encode writes f into b.
func (b IETH) Encode(f *IETHFields) { b.SetRKey(f.RKey) }

// Fields decodes b; a short view reads as zero-padded.
func (b IETH) Fields() IETHFields { b = full(b, IETHSize); return IETHFields{RKey: b.RKey()} }

// ParseIETH returns the IETH at the start of b, or a *ParseError if b is too short.
func ParseIETH(b []byte) (IETH, error) { v, err := checkedView(b, IETHSize, "ieth"); return v, err }

// FETH is a view of the 4-byte FLUSH ETH (IBTA 1.5 memory placement extension).
type FETH []byte

// FETHFields holds the fields of a FETH.
type FETHFields struct {
	Placement   uint8 // 4 bits: 1 global visibility, 2 persistence
	Selectivity uint8 // 2 bits: 0 memory range (RETH), 1 whole MR
}

// Placement returns the 4-bit placement type.
func (b FETH) Placement() uint8 { return b[fethWord] & fethPLTMask }

// SetPlacement sets the placement type; only the low 4 bits are used.
func (b FETH) SetPlacement(v uint8) { b[fethWord] = b[fethWord]&^fethPLTMask | v&fethPLTMask }

// Selectivity returns the 2-bit selectivity level.
func (b FETH) Selectivity() uint8 { return (b[fethWord] & fethSelMask) >> 4 }

// SetSelectivity sets the selectivity level; only the low 2 bits are used.
func (b FETH) SetSelectivity(v uint8) { b[fethWord] = b[fethWord]&^fethSelMask | (v<<4)&fethSelMask }

// Encode writes f into b, zeroing the reserved bits.
func (b FETH) Encode(f *FETHFields) {
	b[0], b[1], b[2] = 0, 0, 0
	b[fethWord] = f.Placement&fethPLTMask | (f.Selectivity<<4)&fethSelMask
}

// Fields decodes b; a short view reads as zero-padded.
func (b FETH) Fields() FETHFields {
	b = full(b, FETHSize)
	return FETHFields{Placement: b.Placement(), Selectivity: b.Selectivity()}
}

// ParseFETH returns the FETH at the start of b, or a *ParseError if b is too short.
func ParseFETH(b []byte) (FETH, error) { v, err := checkedView(b, FETHSize, "feth"); return v, err }

// XRCETH is a view of the 4-byte XRC ETH.
type XRCETH []byte

// XRCETHFields holds the fields of an XRCETH.
type XRCETHFields struct {
	SRQN uint32 // 24-bit XRC SRQ number
}

// SRQN returns the 24-bit XRC SRQ number.
func (b XRCETH) SRQN() uint32 { return Uint24(b[xrcethSRQN:]) }

// SetSRQN sets the XRC SRQ number; only the low 24 bits are used.
func (b XRCETH) SetSRQN(v uint32) { PutUint24(b[xrcethSRQN:], v) }

// Encode writes f into b, zeroing the reserved byte.
func (b XRCETH) Encode(f *XRCETHFields) { b[0] = 0; b.SetSRQN(f.SRQN) }

// Fields decodes b; a short view reads as zero-padded.
func (b XRCETH) Fields() XRCETHFields { b = full(b, XRCETHSize); return XRCETHFields{SRQN: b.SRQN()} }

// ParseXRCETH returns the XRCETH at the start of b, or a *ParseError if b is too short.
func ParseXRCETH(b []byte) (XRCETH, error) {
	v, err := checkedView(b, XRCETHSize, "xrceth")
	return v, err
}
