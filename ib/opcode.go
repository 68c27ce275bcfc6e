package ib

import "strconv"

// Opcode is the BTH OpCode: transport in bits 7-5, operation in bits 4-0.
type Opcode uint8

// Transport is the transport field of an opcode (its top three bits).
type Transport uint8

// Transports (IBTA vol 1 Table 38; CNP from RoCEv2 Annex A17).
const (
	TransportRC  Transport = 0x00
	TransportUC  Transport = 0x20
	TransportRD  Transport = 0x40
	TransportUD  Transport = 0x60
	TransportCNP Transport = 0x80
	TransportXRC Transport = 0xA0
	// TransportReserved (0xC0) and TransportMSP (0xE0, manufacturer specific)
	// carry no opcodes this package understands.
	TransportReserved Transport = 0xC0
	TransportMSP      Transport = 0xE0
)

// String returns "RC", "UC", "RD", "UD", "CNP", "XRC", "reserved" or "MSP".
func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	case TransportXRC:
		return "XRC"
	case TransportMSP:
		return "MSP"
	}
	return "reserved"
}

// Operation codes within a transport (ib_pack.h IB_OPCODE_*).
const (
	opSendFirst          = 0x00
	opSendMiddle         = 0x01
	opSendLast           = 0x02
	opSendLastImm        = 0x03
	opSendOnly           = 0x04
	opSendOnlyImm        = 0x05
	opWriteFirst         = 0x06
	opWriteMiddle        = 0x07
	opWriteLast          = 0x08
	opWriteLastImm       = 0x09
	opWriteOnly          = 0x0a
	opWriteOnlyImm       = 0x0b
	opReadRequest        = 0x0c
	opReadResponseFirst  = 0x0d
	opReadResponseMiddle = 0x0e
	opReadResponseLast   = 0x0f
	opReadResponseOnly   = 0x10
	opAck                = 0x11
	opAtomicAck          = 0x12
	opCompareSwap        = 0x13
	opFetchAdd           = 0x14
	opSendLastInv        = 0x16
	opSendOnlyInv        = 0x17
	opFlush              = 0x1c
	opAtomicWrite        = 0x1d
)

// Opcodes. RC, UC, RD and UD follow Linux ib_pack.h; FLUSH and ATOMIC_WRITE
// are the IBTA 1.5 additions implemented by rxe since Linux 6.2; XRC mirrors RC
// (requests carry an XRCETH); CNP is the RoCEv2 congestion notification.
const (
	RCSendFirst          = Opcode(TransportRC) | opSendFirst
	RCSendMiddle         = Opcode(TransportRC) | opSendMiddle
	RCSendLast           = Opcode(TransportRC) | opSendLast
	RCSendLastImm        = Opcode(TransportRC) | opSendLastImm
	RCSendOnly           = Opcode(TransportRC) | opSendOnly
	RCSendOnlyImm        = Opcode(TransportRC) | opSendOnlyImm
	RCWriteFirst         = Opcode(TransportRC) | opWriteFirst
	RCWriteMiddle        = Opcode(TransportRC) | opWriteMiddle
	RCWriteLast          = Opcode(TransportRC) | opWriteLast
	RCWriteLastImm       = Opcode(TransportRC) | opWriteLastImm
	RCWriteOnly          = Opcode(TransportRC) | opWriteOnly
	RCWriteOnlyImm       = Opcode(TransportRC) | opWriteOnlyImm
	RCReadRequest        = Opcode(TransportRC) | opReadRequest
	RCReadResponseFirst  = Opcode(TransportRC) | opReadResponseFirst
	RCReadResponseMiddle = Opcode(TransportRC) | opReadResponseMiddle
	RCReadResponseLast   = Opcode(TransportRC) | opReadResponseLast
	RCReadResponseOnly   = Opcode(TransportRC) | opReadResponseOnly
	RCAck                = Opcode(TransportRC) | opAck
	RCAtomicAck          = Opcode(TransportRC) | opAtomicAck
	RCCompareSwap        = Opcode(TransportRC) | opCompareSwap
	RCFetchAdd           = Opcode(TransportRC) | opFetchAdd
	RCSendLastInv        = Opcode(TransportRC) | opSendLastInv
	RCSendOnlyInv        = Opcode(TransportRC) | opSendOnlyInv
	RCFlush              = Opcode(TransportRC) | opFlush
	RCAtomicWrite        = Opcode(TransportRC) | opAtomicWrite

	UCSendFirst    = Opcode(TransportUC) | opSendFirst
	UCSendMiddle   = Opcode(TransportUC) | opSendMiddle
	UCSendLast     = Opcode(TransportUC) | opSendLast
	UCSendLastImm  = Opcode(TransportUC) | opSendLastImm
	UCSendOnly     = Opcode(TransportUC) | opSendOnly
	UCSendOnlyImm  = Opcode(TransportUC) | opSendOnlyImm
	UCWriteFirst   = Opcode(TransportUC) | opWriteFirst
	UCWriteMiddle  = Opcode(TransportUC) | opWriteMiddle
	UCWriteLast    = Opcode(TransportUC) | opWriteLast
	UCWriteLastImm = Opcode(TransportUC) | opWriteLastImm
	UCWriteOnly    = Opcode(TransportUC) | opWriteOnly
	UCWriteOnlyImm = Opcode(TransportUC) | opWriteOnlyImm

	RDSendFirst          = Opcode(TransportRD) | opSendFirst
	RDSendMiddle         = Opcode(TransportRD) | opSendMiddle
	RDSendLast           = Opcode(TransportRD) | opSendLast
	RDSendLastImm        = Opcode(TransportRD) | opSendLastImm
	RDSendOnly           = Opcode(TransportRD) | opSendOnly
	RDSendOnlyImm        = Opcode(TransportRD) | opSendOnlyImm
	RDWriteFirst         = Opcode(TransportRD) | opWriteFirst
	RDWriteMiddle        = Opcode(TransportRD) | opWriteMiddle
	RDWriteLast          = Opcode(TransportRD) | opWriteLast
	RDWriteLastImm       = Opcode(TransportRD) | opWriteLastImm
	RDWriteOnly          = Opcode(TransportRD) | opWriteOnly
	RDWriteOnlyImm       = Opcode(TransportRD) | opWriteOnlyImm
	RDReadRequest        = Opcode(TransportRD) | opReadRequest
	RDReadResponseFirst  = Opcode(TransportRD) | opReadResponseFirst
	RDReadResponseMiddle = Opcode(TransportRD) | opReadResponseMiddle
	RDReadResponseLast   = Opcode(TransportRD) | opReadResponseLast
	RDReadResponseOnly   = Opcode(TransportRD) | opReadResponseOnly
	RDAck                = Opcode(TransportRD) | opAck
	RDAtomicAck          = Opcode(TransportRD) | opAtomicAck
	RDCompareSwap        = Opcode(TransportRD) | opCompareSwap
	RDFetchAdd           = Opcode(TransportRD) | opFetchAdd
	RDFlush              = Opcode(TransportRD) | opFlush

	UDSendOnly    = Opcode(TransportUD) | opSendOnly
	UDSendOnlyImm = Opcode(TransportUD) | opSendOnlyImm

	CNP = Opcode(TransportCNP) | 0x01

	XRCSendFirst          = Opcode(TransportXRC) | opSendFirst
	XRCSendMiddle         = Opcode(TransportXRC) | opSendMiddle
	XRCSendLast           = Opcode(TransportXRC) | opSendLast
	XRCSendLastImm        = Opcode(TransportXRC) | opSendLastImm
	XRCSendOnly           = Opcode(TransportXRC) | opSendOnly
	XRCSendOnlyImm        = Opcode(TransportXRC) | opSendOnlyImm
	XRCWriteFirst         = Opcode(TransportXRC) | opWriteFirst
	XRCWriteMiddle        = Opcode(TransportXRC) | opWriteMiddle
	XRCWriteLast          = Opcode(TransportXRC) | opWriteLast
	XRCWriteLastImm       = Opcode(TransportXRC) | opWriteLastImm
	XRCWriteOnly          = Opcode(TransportXRC) | opWriteOnly
	XRCWriteOnlyImm       = Opcode(TransportXRC) | opWriteOnlyImm
	XRCReadRequest        = Opcode(TransportXRC) | opReadRequest
	XRCReadResponseFirst  = Opcode(TransportXRC) | opReadResponseFirst
	XRCReadResponseMiddle = Opcode(TransportXRC) | opReadResponseMiddle
	XRCReadResponseLast   = Opcode(TransportXRC) | opReadResponseLast
	XRCReadResponseOnly   = Opcode(TransportXRC) | opReadResponseOnly
	XRCAck                = Opcode(TransportXRC) | opAck
	XRCAtomicAck          = Opcode(TransportXRC) | opAtomicAck
	XRCCompareSwap        = Opcode(TransportXRC) | opCompareSwap
	XRCFetchAdd           = Opcode(TransportXRC) | opFetchAdd
	XRCSendLastInv        = Opcode(TransportXRC) | opSendLastInv
	XRCSendOnlyInv        = Opcode(TransportXRC) | opSendOnlyInv
)

// HeaderMask is a set of extended transport headers.
type HeaderMask uint16

// Extended transport headers. When several are present they follow the BTH
// in the order HeaderOrder returns.
const (
	HdrRDETH HeaderMask = 1 << iota
	HdrDETH
	HdrRETH
	HdrAtomicETH
	HdrAETH
	HdrAtomicAckETH
	HdrImmDt
	HdrIETH
	HdrFETH
	HdrXRCETH
	// HdrCNPReserved is the 16-byte reserved block of a CNP.
	HdrCNPReserved
	// HdrDCETH and HdrDCCETH are goroce's DC headers (dc.go), decoded only
	// by ParseDC and ParseDCIB.
	HdrDCETH
	HdrDCCETH
)

// headerOrder lists every extended header in wire order: RD's RDETH and
// DETH come first, then XRC's XRCETH, then the operation's own headers
// (FLUSH puts FETH before RETH; WRITE-with-immediate puts RETH before ImmDt;
// ATOMIC ACKNOWLEDGE puts AETH before AtomicAckETH).
var headerOrder = [NumHeaders]HeaderMask{
	HdrDCETH, HdrDCCETH, HdrRDETH, HdrDETH, HdrXRCETH, HdrFETH, HdrRETH, HdrAtomicETH, HdrAETH,
	HdrAtomicAckETH, HdrImmDt, HdrIETH, HdrCNPReserved,
}

// NumHeaders is the number of distinct extended headers (the bits of HeaderMask).
const NumHeaders = 13

// HeaderOrder returns every extended header in wire order; no opcode carries
// two headers in any other order.
func HeaderOrder() [NumHeaders]HeaderMask { return headerOrder }

// Size returns the size in bytes of a single header h, or 0 if h is not
// exactly one header.
func (h HeaderMask) Size() int {
	switch h {
	case HdrRDETH:
		return RDETHSize
	case HdrDETH:
		return DETHSize
	case HdrRETH:
		return RETHSize
	case HdrAtomicETH:
		return AtomicETHSize
	case HdrAETH:
		return AETHSize
	case HdrAtomicAckETH:
		return AtomicAckETHSize
	case HdrImmDt:
		return ImmDtSize
	case HdrIETH:
		return IETHSize
	case HdrFETH:
		return FETHSize
	case HdrXRCETH:
		return XRCETHSize
	case HdrCNPReserved:
		return CNPReservedSize
	case HdrDCETH:
		return DCETHSize
	case HdrDCCETH:
		return DCCETHSize
	}
	return 0
}

// String lists the headers in h in wire order, e.g. "RETH|ImmDt"; "none" if empty.
func (h HeaderMask) String() string {
	names := [NumHeaders]string{"DCETH", "DCCETH", "RDETH", "DETH", "XRCETH", "FETH", "RETH", "AtomicETH", "AETH", "AtomicAckETH", "ImmDt", "IETH", "CNPReserved"}
	s := ""
	for i, x := range headerOrder {
		if h&x != 0 {
			if s != "" {
				s += "|"
			}
			s += names[i]
		}
	}
	if rest := h &^ (HdrDCCETH<<1 - 1); rest != 0 {
		if s != "" {
			s += "|"
		}
		s += "0x" + strconv.FormatUint(uint64(rest), 16)
	}
	if s == "" {
		return "none"
	}
	return s
}

// Layer returns the ParseError layer name of a single header h.
func (h HeaderMask) Layer() string {
	switch h {
	case HdrRDETH:
		return "rdeth"
	case HdrDETH:
		return "deth"
	case HdrRETH:
		return "reth"
	case HdrAtomicETH:
		return "atomiceth"
	case HdrAETH:
		return "aeth"
	case HdrAtomicAckETH:
		return "atomicacketh"
	case HdrImmDt:
		return "immdt"
	case HdrIETH:
		return "ieth"
	case HdrFETH:
		return "feth"
	case HdrXRCETH:
		return "xrceth"
	case HdrCNPReserved:
		return "cnp"
	case HdrDCETH:
		return "dceth"
	case HdrDCCETH:
		return "dcceth"
	}
	return "?"
}

// Position is where a packet sits within its message.
type Position uint8

// Positions. Single-packet operations (READ request, ACK, atomics, FLUSH,
// CNP) are PositionOnly. The zero value marks an undefined opcode.
const (
	PositionFirst Position = 1 + iota
	PositionMiddle
	PositionLast
	PositionOnly
)

// String returns "first", "middle", "last", "only" or "none".
func (p Position) String() string {
	switch p {
	case PositionFirst:
		return "first"
	case PositionMiddle:
		return "middle"
	case PositionLast:
		return "last"
	case PositionOnly:
		return "only"
	}
	return "none"
}

// IsStart reports whether the packet starts a message (FIRST or ONLY).
func (p Position) IsStart() bool { return p == PositionFirst || p == PositionOnly }

// IsEnd reports whether the packet ends a message (LAST or ONLY).
func (p Position) IsEnd() bool { return p == PositionLast || p == PositionOnly }

// OpcodeInfo describes one opcode: its headers, layout and class. The zero
// value (Valid false) describes an undefined opcode.
type OpcodeInfo struct {
	Valid     bool
	Name      string // e.g. "RC SEND_ONLY"; see Opcode.String
	Headers   HeaderMask
	Payload   bool // data bytes (and pad) may follow the headers
	Position  Position
	HeaderLen int // BTH through the last extended header; the payload starts here

	IsRequest       bool // sent by a requester (everything but responses and CNP)
	IsSend          bool
	IsWrite         bool // RDMA WRITE (not ATOMIC_WRITE)
	IsRead          bool // RDMA READ request
	IsReadResponse  bool
	IsAtomic        bool // CompareSwap or FetchAdd
	IsAtomicWrite   bool
	IsFlush         bool
	IsAck           bool // ACKNOWLEDGE or ATOMIC ACKNOWLEDGE (carries an AETH, no data)
	HasImm          bool
	HasInv          bool
	ConsumesRecvWQE bool // RWR: consumes a receive WQE at the responder
	Completes       bool // C: generates a responder completion

	offsets [len(headerOrder)]uint8
}

// Offset returns the offset of header h from the start of the BTH, or -1 if
// the opcode does not carry h.
func (o OpcodeInfo) Offset(h HeaderMask) int {
	for i, x := range headerOrder {
		if x == h {
			if o.Headers&h == 0 {
				return -1
			}
			return int(o.offsets[i])
		}
	}
	return -1
}

// Info returns the table entry of o (Valid false if o is undefined).
func (o Opcode) Info() OpcodeInfo { return opcodeTable[o] }

// Valid reports whether o is a defined opcode.
func (o Opcode) Valid() bool { return opcodeTable[o].Valid }

// Transport returns the transport encoded in the top three bits of o.
func (o Opcode) Transport() Transport { return Transport(o & 0xe0) }

// String returns the transport and the ib_pack.h operation name separated by
// a space, e.g. "RC SEND_ONLY", "UD SEND_ONLY_WITH_IMMEDIATE", "CNP"; an
// undefined opcode prints as "Opcode(0x15)".
func (o Opcode) String() string {
	if opcodeTable[o].Valid {
		return opcodeTable[o].Name
	}
	return "Opcode(0x" + strconv.FormatUint(uint64(o), 16) + ")"
}

// opDesc describes one operation independently of the transport.
type opDesc struct {
	name     string
	headers  HeaderMask
	payload  bool
	position Position
	// class flags
	send, write, read, readResp, atomic, atomicWrite, flush, ack, imm, inv, rwr, completes bool
}

// operations is the per-operation half of the opcode table (rxe_opcode.c;
// IBTA vol 1 Table 38).
var operations = [32]opDesc{
	opSendFirst:          {name: "SEND_FIRST", payload: true, position: PositionFirst, send: true, rwr: true},
	opSendMiddle:         {name: "SEND_MIDDLE", payload: true, position: PositionMiddle, send: true},
	opSendLast:           {name: "SEND_LAST", payload: true, position: PositionLast, send: true, completes: true},
	opSendLastImm:        {name: "SEND_LAST_WITH_IMMEDIATE", headers: HdrImmDt, payload: true, position: PositionLast, send: true, imm: true, completes: true},
	opSendOnly:           {name: "SEND_ONLY", payload: true, position: PositionOnly, send: true, rwr: true, completes: true},
	opSendOnlyImm:        {name: "SEND_ONLY_WITH_IMMEDIATE", headers: HdrImmDt, payload: true, position: PositionOnly, send: true, imm: true, rwr: true, completes: true},
	opWriteFirst:         {name: "RDMA_WRITE_FIRST", headers: HdrRETH, payload: true, position: PositionFirst, write: true},
	opWriteMiddle:        {name: "RDMA_WRITE_MIDDLE", payload: true, position: PositionMiddle, write: true},
	opWriteLast:          {name: "RDMA_WRITE_LAST", payload: true, position: PositionLast, write: true},
	opWriteLastImm:       {name: "RDMA_WRITE_LAST_WITH_IMMEDIATE", headers: HdrImmDt, payload: true, position: PositionLast, write: true, imm: true, rwr: true, completes: true},
	opWriteOnly:          {name: "RDMA_WRITE_ONLY", headers: HdrRETH, payload: true, position: PositionOnly, write: true},
	opWriteOnlyImm:       {name: "RDMA_WRITE_ONLY_WITH_IMMEDIATE", headers: HdrRETH | HdrImmDt, payload: true, position: PositionOnly, write: true, imm: true, rwr: true, completes: true},
	opReadRequest:        {name: "RDMA_READ_REQUEST", headers: HdrRETH, position: PositionOnly, read: true},
	opReadResponseFirst:  {name: "RDMA_READ_RESPONSE_FIRST", headers: HdrAETH, payload: true, position: PositionFirst, readResp: true},
	opReadResponseMiddle: {name: "RDMA_READ_RESPONSE_MIDDLE", payload: true, position: PositionMiddle, readResp: true},
	opReadResponseLast:   {name: "RDMA_READ_RESPONSE_LAST", headers: HdrAETH, payload: true, position: PositionLast, readResp: true},
	opReadResponseOnly:   {name: "RDMA_READ_RESPONSE_ONLY", headers: HdrAETH, payload: true, position: PositionOnly, readResp: true},
	opAck:                {name: "ACKNOWLEDGE", headers: HdrAETH, position: PositionOnly, ack: true},
	opAtomicAck:          {name: "ATOMIC_ACKNOWLEDGE", headers: HdrAETH | HdrAtomicAckETH, position: PositionOnly, ack: true},
	opCompareSwap:        {name: "COMPARE_SWAP", headers: HdrAtomicETH, position: PositionOnly, atomic: true},
	opFetchAdd:           {name: "FETCH_ADD", headers: HdrAtomicETH, position: PositionOnly, atomic: true},
	opSendLastInv:        {name: "SEND_LAST_WITH_INVALIDATE", headers: HdrIETH, payload: true, position: PositionLast, send: true, inv: true, completes: true},
	opSendOnlyInv:        {name: "SEND_ONLY_WITH_INVALIDATE", headers: HdrIETH, payload: true, position: PositionOnly, send: true, inv: true, rwr: true, completes: true},
	opFlush:              {name: "FLUSH", headers: HdrFETH | HdrRETH, position: PositionOnly, flush: true},
	opAtomicWrite:        {name: "ATOMIC_WRITE", headers: HdrRETH, payload: true, position: PositionOnly, atomicWrite: true},
}

// Which operations each transport defines (ib_pack.h enum; XRC as RC without
// FLUSH/ATOMIC_WRITE).
const (
	opsSendWrite = 1<<opSendFirst | 1<<opSendMiddle | 1<<opSendLast | 1<<opSendLastImm |
		1<<opSendOnly | 1<<opSendOnlyImm | 1<<opWriteFirst | 1<<opWriteMiddle | 1<<opWriteLast |
		1<<opWriteLastImm | 1<<opWriteOnly | 1<<opWriteOnlyImm
	opsReadAtomic = 1<<opReadRequest | 1<<opReadResponseFirst | 1<<opReadResponseMiddle |
		1<<opReadResponseLast | 1<<opReadResponseOnly | 1<<opAck | 1<<opAtomicAck |
		1<<opCompareSwap | 1<<opFetchAdd
	opsInv = 1<<opSendLastInv | 1<<opSendOnlyInv
	opsRC  = opsSendWrite | opsReadAtomic | opsInv | 1<<opFlush | 1<<opAtomicWrite
	opsUC  = opsSendWrite
	opsRD  = opsSendWrite | opsReadAtomic | 1<<opFlush
	opsUD  = 1<<opSendOnly | 1<<opSendOnlyImm
	opsXRC = opsSendWrite | opsReadAtomic | opsInv
)

// opcodeTable is the single source of truth for every opcode's layout and
// class, filled once from operations and the per-transport rules.
var opcodeTable = buildOpcodeTable()

func buildOpcodeTable() (t [256]OpcodeInfo) {
	transports := [...]struct {
		t   Transport
		ops uint32
	}{{TransportRC, opsRC}, {TransportUC, opsUC}, {TransportRD, opsRD}, {TransportUD, opsUD}, {TransportXRC, opsXRC}}
	for _, tr := range transports {
		for op := 0; op < 32; op++ {
			if tr.ops&(1<<op) == 0 {
				continue
			}
			d := operations[op]
			info := OpcodeInfo{
				Valid: true, Name: tr.t.String() + " " + d.name, Payload: d.payload, Position: d.position,
				IsSend: d.send, IsWrite: d.write, IsRead: d.read, IsReadResponse: d.readResp,
				IsAtomic: d.atomic, IsAtomicWrite: d.atomicWrite, IsFlush: d.flush, IsAck: d.ack,
				HasImm: d.imm, HasInv: d.inv, ConsumesRecvWQE: d.rwr, Completes: d.completes,
			}
			info.IsRequest = !d.readResp && !d.ack
			h := d.headers
			switch tr.t {
			case TransportRD:
				// RD requests carry RDETH and DETH; responses only RDETH.
				h |= HdrRDETH
				if info.IsRequest {
					h |= HdrDETH
				}
			case TransportUD:
				h |= HdrDETH
			case TransportXRC:
				if info.IsRequest {
					h |= HdrXRCETH
				}
			}
			info.Headers = h
			t[Opcode(tr.t)|Opcode(op)] = withOffsets(info)
		}
	}
	t[CNP] = withOffsets(OpcodeInfo{Valid: true, Name: "CNP", Headers: HdrCNPReserved, Position: PositionOnly})
	return t
}

// withOffsets fills the header offsets and HeaderLen of info from headerOrder.
func withOffsets(info OpcodeInfo) OpcodeInfo {
	off := BTHSize
	for i, h := range headerOrder {
		if info.Headers&h != 0 {
			info.offsets[i] = uint8(off)
			off += h.Size()
		}
	}
	info.HeaderLen = off
	return info
}
