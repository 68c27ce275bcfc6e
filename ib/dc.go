package ib

import "encoding/binary"

// Dynamically Connected (DC) transport, goroce's framing.
//
// DC is a Mellanox/NVIDIA transport outside the IBTA specification; its wire
// format is not public. What is public (Wireshark's InfiniBand dissector): DC
// packets use the RD opcode space 0x40–0x55 with the RD operation names, the
// BTH is followed by 8 more bytes Wireshark does not decode, and opcode 0x55
// (RD's RESYNC slot) with SE = 0 is a "DC connect" packet whose 8 bytes are
// followed by a 16-byte DCCETH, also not decoded. Everything inside those 8
// and 16 bytes below is goroce's own choice, and so is the layout after them
// (the RC layout: RETH, AtomicETH, AETH, AtomicAckETH, ImmDt as an RC packet
// of the same operation carries them). Interoperability with ConnectX is
// unverified. The full description, field by field, is in the qp package
// documentation (DC transport).

// Sizes of the DC headers.
const (
	DCETHSize  = 8
	DCCETHSize = 16
)

// DC opcodes: the RD opcode space as DC uses it.
const (
	TransportDC = TransportRD

	DCSendFirst          = Opcode(TransportDC) | opSendFirst
	DCSendMiddle         = Opcode(TransportDC) | opSendMiddle
	DCSendLast           = Opcode(TransportDC) | opSendLast
	DCSendLastImm        = Opcode(TransportDC) | opSendLastImm
	DCSendOnly           = Opcode(TransportDC) | opSendOnly
	DCSendOnlyImm        = Opcode(TransportDC) | opSendOnlyImm
	DCWriteFirst         = Opcode(TransportDC) | opWriteFirst
	DCWriteMiddle        = Opcode(TransportDC) | opWriteMiddle
	DCWriteLast          = Opcode(TransportDC) | opWriteLast
	DCWriteLastImm       = Opcode(TransportDC) | opWriteLastImm
	DCWriteOnly          = Opcode(TransportDC) | opWriteOnly
	DCWriteOnlyImm       = Opcode(TransportDC) | opWriteOnlyImm
	DCReadRequest        = Opcode(TransportDC) | opReadRequest
	DCReadResponseFirst  = Opcode(TransportDC) | opReadResponseFirst
	DCReadResponseMiddle = Opcode(TransportDC) | opReadResponseMiddle
	DCReadResponseLast   = Opcode(TransportDC) | opReadResponseLast
	DCReadResponseOnly   = Opcode(TransportDC) | opReadResponseOnly
	DCAck                = Opcode(TransportDC) | opAck
	DCAtomicAck          = Opcode(TransportDC) | opAtomicAck
	DCCompareSwap        = Opcode(TransportDC) | opCompareSwap
	DCFetchAdd           = Opcode(TransportDC) | opFetchAdd
	// DCConnect (RD RESYNC's slot) opens or closes a DC connection; it
	// carries a DCCETH and no payload, and is sent with SE = 0.
	DCConnect = Opcode(TransportDC) | 0x15
)

// DCETH field offsets (goroce's choice).
const (
	dcethGen   = 0
	dcethSrcQP = 1 // 24 bits
	// bytes 4–7 reserved: written as zero, ignored on receive
)

// DCETH is a view of the 8 bytes that follow the BTH of every DC packet.
// Byte 0 is the connection generation, bytes 1–3 the sender's QP number
// (the DCI on requests and CONNECT, the DCT number on responses), bytes 4–7
// are reserved.
type DCETH []byte

// DCETHFields holds the fields of a DCETH.
type DCETHFields struct {
	Gen   uint8  // connection generation: a DCI bumps it on every CONNECT to a new target
	SrcQP uint32 // 24 bits
}

// Gen returns the connection generation.
func (b DCETH) Gen() uint8 { return b[dcethGen] }

// SrcQP returns the 24-bit sender QP number.
func (b DCETH) SrcQP() uint32 { return get24(b[dcethSrcQP:]) }

// Encode writes f into b, zeroing the reserved bytes.
func (b DCETH) Encode(f *DCETHFields) {
	_ = b[DCETHSize-1]
	b[dcethGen] = f.Gen
	put24(b[dcethSrcQP:], f.SrcQP)
	b[4], b[5], b[6], b[7] = 0, 0, 0, 0
}

// Fields decodes b; a short view reads as zero-padded.
func (b DCETH) Fields() DCETHFields {
	b = full(b, DCETHSize)
	return DCETHFields{Gen: b.Gen(), SrcQP: b.SrcQP()}
}

// ParseDCETH returns the DCETH at the start of b, or a *ParseError if b is too short.
func ParseDCETH(b []byte) (DCETH, error) { v, err := checkedView(b, DCETHSize, "dceth"); return v, err }

// DCCETH flags.
const (
	// DCCDisconnect marks a CONNECT that closes the connection instead.
	DCCDisconnect = 0x01
)

// DCCETH field offsets (goroce's choice).
const (
	dccethKey   = 0 // 64 bits
	dccethFlags = 8
	// bytes 9–15 reserved
)

// DCCETH is a view of the 16-byte DC connect header: the 64-bit DC access
// key (big-endian, as mlx5's address vector carries dc_key), a flags byte
// and seven reserved bytes.
type DCCETH []byte

// DCCETHFields holds the fields of a DCCETH.
type DCCETHFields struct {
	Key   uint64
	Flags uint8 // DCCDisconnect
}

// Key returns the DC access key.
func (b DCCETH) Key() uint64 { return binary.BigEndian.Uint64(b[dccethKey:]) }

// Flags returns the flags byte.
func (b DCCETH) Flags() uint8 { return b[dccethFlags] }

// Encode writes f into b, zeroing the reserved bytes.
func (b DCCETH) Encode(f *DCCETHFields) {
	_ = b[DCCETHSize-1]
	binary.BigEndian.PutUint64(b[dccethKey:], f.Key)
	b[dccethFlags] = f.Flags
	clear(b[dccethFlags+1 : DCCETHSize])
}

// Fields decodes b; a short view reads as zero-padded.
func (b DCCETH) Fields() DCCETHFields {
	b = full(b, DCCETHSize)
	return DCCETHFields{Key: b.Key(), Flags: b.Flags()}
}

// ParseDCCETH returns the DCCETH at the start of b, or a *ParseError if b is too short.
func ParseDCCETH(b []byte) (DCCETH, error) {
	v, err := checkedView(b, DCCETHSize, "dcceth")
	return v, err
}

// opsDC are the operations DC defines: RC's without invalidate, FLUSH and
// ATOMIC_WRITE (Wireshark's table stops at DC Fetch Add).
const opsDC = opsSendWrite | opsReadAtomic

// dcProfileTable is opcodeTable with the RD space read as DC.
var dcProfileTable = buildDCProfile()

func buildDCProfile() [256]OpcodeInfo {
	t := opcodeTable
	for op := 0; op < 32; op++ {
		t[Opcode(TransportRD)|Opcode(op)] = OpcodeInfo{}
		if opsDC&(1<<op) == 0 {
			continue
		}
		// The RC entry has the operation's own headers and class.
		info := opcodeTable[Opcode(TransportRC)|Opcode(op)]
		info.Name = "DC " + operations[op].name
		info.Headers |= HdrDCETH
		t[Opcode(TransportDC)|Opcode(op)] = withOffsets(info)
	}
	t[DCConnect] = withOffsets(OpcodeInfo{Valid: true, Name: "DC CONNECT", Headers: HdrDCETH | HdrDCCETH,
		Position: PositionOnly, IsRequest: true})
	return t
}

// DCInfo returns the table entry of o as ParseDC reads it: o's own entry
// outside the RD space, the DC entry inside it.
func DCInfo(o Opcode) OpcodeInfo { return dcProfileTable[o] }

// ParseDC decodes a frame as Parse does, except that the RD opcode space
// (0x40–0x5F) is read as DC, as Wireshark reads it. No Linux driver speaks
// RD, so a device that runs DC queue pairs parses every frame with ParseDC.
// Errors and allocation behaviour are as for Parse.
func ParseDC(frame []byte, p *Packet) error {
	if p == nil {
		return errNilPacket
	}
	if !p.parse(frame, &dcProfileTable) {
		return &p.err
	}
	return nil
}

// ParseDCIB is ParseIB with the RD opcode space read as DC.
func ParseDCIB(b []byte, p *Packet) error {
	if p == nil {
		return errNilPacket
	}
	p.Reset()
	if !p.parseIB(b, 0, &dcProfileTable) {
		return &p.err
	}
	return nil
}
