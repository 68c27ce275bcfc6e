package ib

import "encoding/binary"

// Dynamically Connected (DC) transport, goroce's framing.
//
// DC is a Mellanox/NVIDIA transport outside the IBTA specification; its wire
// format is not public. What is public (Wireshark's InfiniBand dissector): DC
// packets use the RD opcode space 0x40–0x55 with the RD operation names; the
// BTH is followed by 8 more bytes Wireshark does not decode; after them come
// RD's header sequences (RDETH and DETH on requests, RDETH on responses, then
// the operation's own headers); and opcode 0x55 (RD's RESYNC slot) with
// SE = 0 is a "DC connect" packet whose 8 bytes are followed by a 16-byte
// DCCETH, also not decoded. goroce lays DC out exactly so, which Wireshark
// decodes cleanly; what the 8 bytes, the DCCETH and the RD headers' fields
// mean is goroce's own choice. Interoperability with ConnectX is unverified.
// docs/dc.md describes every field.

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
	dcethKey  = 0 // requests and CONNECT: 64 bits
	dcethDCTN = 1 // responses: 24 bits, bytes 0 and 4–7 zero
)

// DCETH is a view of the 8 bytes that follow the BTH of every DC packet. On
// requests and CONNECT they carry the 64-bit DC access key (big-endian, as
// mlx5's address vector carries dc_key); on responses, bytes 1–3 carry the
// responding DCT's number and the rest is zero.
type DCETH []byte

// DCETHFields holds the fields of a DCETH: Key on requests, DCTN on
// responses (Encode writes DCTN when Key is zero).
type DCETHFields struct {
	Key  uint64
	DCTN uint32 // 24 bits
}

// Key returns the DC access key of a request.
func (b DCETH) Key() uint64 { return binary.BigEndian.Uint64(b[dcethKey:]) }

// DCTN returns the DCT number of a response.
func (b DCETH) DCTN() uint32 { return Uint24(b[dcethDCTN:]) }

// Encode writes f into b: the key if it is non-zero, else the DCT number.
func (b DCETH) Encode(f *DCETHFields) {
	_ = b[DCETHSize-1]
	if f.Key != 0 {
		binary.BigEndian.PutUint64(b[dcethKey:], f.Key)
		return
	}
	clear(b[:DCETHSize])
	PutUint24(b[dcethDCTN:], f.DCTN)
}

// Fields decodes b as both readings; a short view reads as zero-padded.
func (b DCETH) Fields() DCETHFields {
	b = full(b, DCETHSize)
	return DCETHFields{Key: b.Key(), DCTN: b.DCTN()}
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
	dccethFlags = 0
	dccethDCI   = 1 // 24 bits
	dccethConn  = 5 // 24 bits; byte 4 and bytes 8–15 reserved
)

// DCCETH is a view of the 16-byte DC connect header: a flags byte, the
// connecting DCI's QP number, and the connection number the following
// requests carry in their RDETH.
type DCCETH []byte

// DCCETHFields holds the fields of a DCCETH.
type DCCETHFields struct {
	Flags uint8  // DCCDisconnect
	DCI   uint32 // 24 bits
	Conn  uint32 // 24 bits
}

// Flags returns the flags byte.
func (b DCCETH) Flags() uint8 { return b[dccethFlags] }

// DCI returns the connecting DCI's QP number.
func (b DCCETH) DCI() uint32 { return Uint24(b[dccethDCI:]) }

// Conn returns the connection number.
func (b DCCETH) Conn() uint32 { return Uint24(b[dccethConn:]) }

// Encode writes f into b, zeroing the reserved bytes.
func (b DCCETH) Encode(f *DCCETHFields) {
	_ = b[DCCETHSize-1]
	clear(b[:DCCETHSize])
	b[dccethFlags] = f.Flags
	PutUint24(b[dccethDCI:], f.DCI)
	PutUint24(b[dccethConn:], f.Conn)
}

// Fields decodes b; a short view reads as zero-padded.
func (b DCCETH) Fields() DCCETHFields {
	b = full(b, DCCETHSize)
	return DCCETHFields{Flags: b.Flags(), DCI: b.DCI(), Conn: b.Conn()}
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
		// RD's entry has RD's header sequence (RDETH, and DETH on
		// requests) and the operation's own headers and class.
		info := opcodeTable[Opcode(TransportRD)|Opcode(op)]
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
