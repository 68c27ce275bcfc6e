package mad

import (
	"encoding/binary"
	"strconv"

	"github.com/goroce/goroce/ib"
)

// Private-data capacities of the CM messages (ib_cm.h: IB_CM_*_PRIVATE_DATA_SIZE).
const (
	REQPrivateDataSize     = 92
	MRAPrivateDataSize     = 222
	REJPrivateDataSize     = 148
	REPPrivateDataSize     = 196
	RTUPrivateDataSize     = 224
	DREQPrivateDataSize    = 220
	DREPPrivateDataSize    = 224
	SIDRREQPrivateDataSize = 216
	SIDRREPPrivateDataSize = 136
	LAPPrivateDataSize     = 168
	APRPrivateDataSize     = 148
	ARISize                = 72 // REJ additional reject information, APR/SIDR_REP additional info
)

// PrivateDataSize returns the private-data capacity of message a (0 if a is
// not a CM message).
func PrivateDataSize(a AttrID) int {
	switch a {
	case AttrREQ:
		return REQPrivateDataSize
	case AttrMRA:
		return MRAPrivateDataSize
	case AttrREJ:
		return REJPrivateDataSize
	case AttrREP:
		return REPPrivateDataSize
	case AttrRTU:
		return RTUPrivateDataSize
	case AttrDREQ:
		return DREQPrivateDataSize
	case AttrDREP:
		return DREPPrivateDataSize
	case AttrSIDRREQ:
		return SIDRREQPrivateDataSize
	case AttrSIDRREP:
		return SIDRREPPrivateDataSize
	case AttrLAP:
		return LAPPrivateDataSize
	case AttrAPR:
		return APRPrivateDataSize
	}
	return 0
}

// Message views of a full MAD (m must come from ParseMAD or be Size long).

// REQ returns the CM data as a REQ view.
func (m MAD) REQ() REQ { return REQ(m[HeaderSize:]) }

// MRA returns the CM data as an MRA view.
func (m MAD) MRA() MRA { return MRA(m[HeaderSize:]) }

// REJ returns the CM data as a REJ view.
func (m MAD) REJ() REJ { return REJ(m[HeaderSize:]) }

// REP returns the CM data as a REP view.
func (m MAD) REP() REP { return REP(m[HeaderSize:]) }

// RTU returns the CM data as an RTU view.
func (m MAD) RTU() RTU { return RTU(m[HeaderSize:]) }

// DREQ returns the CM data as a DREQ view.
func (m MAD) DREQ() DREQ { return DREQ(m[HeaderSize:]) }

// DREP returns the CM data as a DREP view.
func (m MAD) DREP() DREP { return DREP(m[HeaderSize:]) }

// SIDRREQ returns the CM data as a SIDR_REQ view.
func (m MAD) SIDRREQ() SIDRREQ { return SIDRREQ(m[HeaderSize:]) }

// SIDRREP returns the CM data as a SIDR_REP view.
func (m MAD) SIDRREP() SIDRREP { return SIDRREP(m[HeaderSize:]) }

// LAP returns the CM data as a LAP view.
func (m MAD) LAP() LAP { return LAP(m[HeaderSize:]) }

// APR returns the CM data as an APR view.
func (m MAD) APR() APR { return APR(m[HeaderSize:]) }

// ---------------------------------------------------------------- paths

// PathFields is a path as the REQ carries it (primary and alternate) and the
// LAP carries the alternate one. On RoCE the LIDs are 0xFFFF and the GIDs
// are the IP addresses.
type PathFields struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID ib.GID
	FlowLabel           uint32 // 20 bits
	PacketRate          uint8  // 6-bit IB rate code
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8 // 4 bits
	SubnetLocal         bool
	LocalACKTimeout     uint8 // 5 bits
}

// REQ path layout relative to the path's first byte (52 primary, 96 alternate).
const (
	pathLocalLID  = 0
	pathRemoteLID = 2
	pathLocalGID  = 4
	pathRemoteGID = 20
	pathFlowWord  = 36 // flow label in bits 31–12, packet rate in bits 5–0
	pathTC        = 40
	pathHopLimit  = 41
	pathSL        = 42 // SL 7–4, subnet local 3
	pathACK       = 43 // local ACK timeout 7–3 (bit 2 of the alternate: SAP supported)
	reqPathSize   = 44
)

func getReqPath(b []byte) PathFields {
	var p PathFields
	p.LocalLID = binary.BigEndian.Uint16(b[pathLocalLID:])
	p.RemoteLID = binary.BigEndian.Uint16(b[pathRemoteLID:])
	copy(p.LocalGID[:], b[pathLocalGID:])
	copy(p.RemoteGID[:], b[pathRemoteGID:])
	w := binary.BigEndian.Uint32(b[pathFlowWord:])
	p.FlowLabel = w >> 12
	p.PacketRate = uint8(w & 0x3f)
	p.TrafficClass = b[pathTC]
	p.HopLimit = b[pathHopLimit]
	p.SL = top(b[pathSL], 4)
	p.SubnetLocal = bitsAt(b[pathSL], 4, 1) != 0
	p.LocalACKTimeout = top(b[pathACK], 5)
	return p
}

// putReqPath writes p; extra holds the low 3 bits of the ACK-timeout byte.
func putReqPath(b []byte, p *PathFields, extra byte) {
	binary.BigEndian.PutUint16(b[pathLocalLID:], p.LocalLID)
	binary.BigEndian.PutUint16(b[pathRemoteLID:], p.RemoteLID)
	copy(b[pathLocalGID:], p.LocalGID[:])
	copy(b[pathRemoteGID:], p.RemoteGID[:])
	binary.BigEndian.PutUint32(b[pathFlowWord:], (p.FlowLabel&0xfffff)<<12|uint32(p.PacketRate&0x3f))
	b[pathTC] = p.TrafficClass
	b[pathHopLimit] = p.HopLimit
	b[pathSL] = place(p.SL, 0, 4) | place(b2u(p.SubnetLocal), 4, 1)
	b[pathACK] = place(p.LocalACKTimeout, 0, 5) | extra
}

// ---------------------------------------------------------------- REQ

// REQ field offsets within the CM data.
const (
	reqLocalCommID = 0
	reqVendorID    = 5
	reqServiceID   = 8
	reqCAGUID      = 16
	reqLocalQKey   = 28
	reqLocalQPN    = 32
	reqRespRes     = 35
	reqLocalEECN   = 36
	reqInitDepth   = 39
	reqRemoteEECN  = 40
	reqByte43      = 43 // remote CM response timeout 7–3, transport 2–1, E2E flow control 0
	reqStartPSN    = 44
	reqByte47      = 47 // local CM response timeout 7–3, retry count 2–0
	reqPKey        = 48
	reqByte50      = 50 // path MTU 7–4, RDC exists 3, RNR retry 2–0
	reqByte51      = 51 // max CM retries 7–4, SRQ 3, extended transport 2–0
	reqPrimary     = 52
	reqAlternate   = 96
	reqPrivate     = 140
)

// TransportType is the REQ Transport Service Type.
type TransportType uint8

// Transport service types.
const (
	TransportRC       TransportType = 0
	TransportUC       TransportType = 1
	TransportRD       TransportType = 2
	TransportExtended TransportType = 3 // see ExtTransportType (1 = XRC)
)

// REQ is a view of a ConnectRequest.
type REQ []byte

// REQFields holds the fields of a REQ.
type REQFields struct {
	LocalCommID             uint32
	VendorID                uint32 // 24 bits (ECE)
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32 // 24 bits
	ResponderResources      uint8
	LocalEECN               uint32
	InitiatorDepth          uint8
	RemoteEECN              uint32
	RemoteCMResponseTimeout uint8 // 5 bits
	Transport               TransportType
	FlowControl             bool
	StartingPSN             uint32 // 24 bits
	LocalCMResponseTimeout  uint8  // 5 bits
	RetryCount              uint8  // 3 bits
	PKey                    uint16
	PathMTU                 ib.MTU // 4 bits
	RDCExists               bool
	RNRRetryCount           uint8 // 3 bits
	MaxCMRetries            uint8 // 4 bits
	SRQ                     bool
	ExtTransportType        uint8 // 3 bits
	Primary, Alternate      PathFields
	SAPSupported            bool
	PrivateData             []byte // up to REQPrivateDataSize; Fields returns all 92 bytes
}

// LocalCommID returns the sender's communication ID.
func (b REQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[reqLocalCommID:]) }

// VendorID returns the 24-bit ECE vendor ID.
func (b REQ) VendorID() uint32 { return ib.Uint24(b[reqVendorID:]) }

// ServiceID returns the service ID.
func (b REQ) ServiceID() uint64 { return binary.BigEndian.Uint64(b[reqServiceID:]) }

// LocalCAGUID returns the sender's CA GUID.
func (b REQ) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(b[reqCAGUID:]) }

// LocalQKey returns the sender's Q_Key (RD/UD).
func (b REQ) LocalQKey() uint32 { return binary.BigEndian.Uint32(b[reqLocalQKey:]) }

// LocalQPN returns the sender's QP number.
func (b REQ) LocalQPN() uint32 { return ib.Uint24(b[reqLocalQPN:]) }

// ResponderResources returns the sender's responder resources.
func (b REQ) ResponderResources() uint8 { return b[reqRespRes] }

// LocalEECN returns the sender's EE context number.
func (b REQ) LocalEECN() uint32 { return ib.Uint24(b[reqLocalEECN:]) }

// InitiatorDepth returns the sender's initiator depth.
func (b REQ) InitiatorDepth() uint8 { return b[reqInitDepth] }

// RemoteEECN returns the remote EE context number.
func (b REQ) RemoteEECN() uint32 { return ib.Uint24(b[reqRemoteEECN:]) }

// RemoteCMResponseTimeout returns the 5-bit remote CM response timeout.
func (b REQ) RemoteCMResponseTimeout() uint8 { return top(b[reqByte43], 5) }

// Transport returns the transport service type.
func (b REQ) Transport() TransportType { return TransportType(bitsAt(b[reqByte43], 5, 2)) }

// FlowControl returns the end-to-end flow control bit.
func (b REQ) FlowControl() bool { return b[reqByte43]&1 != 0 }

// StartingPSN returns the Starting PSN; Linux uses it as the PSN the receiver
// of the message sends from (the sender's expected receive PSN).
func (b REQ) StartingPSN() uint32 { return ib.Uint24(b[reqStartPSN:]) }

// LocalCMResponseTimeout returns the 5-bit local CM response timeout.
func (b REQ) LocalCMResponseTimeout() uint8 { return top(b[reqByte47], 5) }

// RetryCount returns the transport retry count.
func (b REQ) RetryCount() uint8 { return bitsAt(b[reqByte47], 5, 3) }

// PKey returns the partition key.
func (b REQ) PKey() uint16 { return binary.BigEndian.Uint16(b[reqPKey:]) }

// PathMTU returns the path MTU code.
func (b REQ) PathMTU() ib.MTU { return ib.MTU(top(b[reqByte50], 4)) }

// RDCExists returns the RDC Exists bit.
func (b REQ) RDCExists() bool { return bitsAt(b[reqByte50], 4, 1) != 0 }

// RNRRetryCount returns the RNR retry count the receiver's QP should use.
func (b REQ) RNRRetryCount() uint8 { return bitsAt(b[reqByte50], 5, 3) }

// MaxCMRetries returns the maximum number of CM retries.
func (b REQ) MaxCMRetries() uint8 { return top(b[reqByte51], 4) }

// SRQ returns the SRQ bit.
func (b REQ) SRQ() bool { return bitsAt(b[reqByte51], 4, 1) != 0 }

// ExtTransportType returns the extended transport type.
func (b REQ) ExtTransportType() uint8 { return bitsAt(b[reqByte51], 5, 3) }

// Primary returns the primary path.
func (b REQ) Primary() PathFields { return getReqPath(b[reqPrimary:]) }

// Alternate returns the alternate path.
func (b REQ) Alternate() PathFields { return getReqPath(b[reqAlternate:]) }

// SAPSupported returns the SAP Supported bit.
func (b REQ) SAPSupported() bool { return bitsAt(b[reqAlternate+pathACK], 5, 1) != 0 }

// PrivateData returns the private data in place.
func (b REQ) PrivateData() []byte { return b[reqPrivate : reqPrivate+REQPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding the private data.
func (b REQ) Encode(f *REQFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[reqLocalCommID:], f.LocalCommID)
	b[4] = 0
	ib.PutUint24(b[reqVendorID:], f.VendorID)
	binary.BigEndian.PutUint64(b[reqServiceID:], f.ServiceID)
	binary.BigEndian.PutUint64(b[reqCAGUID:], f.LocalCAGUID)
	clear(b[24:28])
	binary.BigEndian.PutUint32(b[reqLocalQKey:], f.LocalQKey)
	ib.PutUint24(b[reqLocalQPN:], f.LocalQPN)
	b[reqRespRes] = f.ResponderResources
	ib.PutUint24(b[reqLocalEECN:], f.LocalEECN)
	b[reqInitDepth] = f.InitiatorDepth
	ib.PutUint24(b[reqRemoteEECN:], f.RemoteEECN)
	b[reqByte43] = place(f.RemoteCMResponseTimeout, 0, 5) | place(uint8(f.Transport), 5, 2) | b2u(f.FlowControl)
	ib.PutUint24(b[reqStartPSN:], f.StartingPSN)
	b[reqByte47] = place(f.LocalCMResponseTimeout, 0, 5) | place(f.RetryCount, 5, 3)
	binary.BigEndian.PutUint16(b[reqPKey:], f.PKey)
	b[reqByte50] = place(uint8(f.PathMTU), 0, 4) | place(b2u(f.RDCExists), 4, 1) | place(f.RNRRetryCount, 5, 3)
	b[reqByte51] = place(f.MaxCMRetries, 0, 4) | place(b2u(f.SRQ), 4, 1) | place(f.ExtTransportType, 5, 3)
	putReqPath(b[reqPrimary:], &f.Primary, 0)
	putReqPath(b[reqAlternate:], &f.Alternate, place(b2u(f.SAPSupported), 5, 1))
	setPrivate(b[reqPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b REQ) Fields() REQFields {
	b = full(b, DataSize)
	return REQFields{
		LocalCommID: b.LocalCommID(), VendorID: b.VendorID(), ServiceID: b.ServiceID(),
		LocalCAGUID: b.LocalCAGUID(), LocalQKey: b.LocalQKey(), LocalQPN: b.LocalQPN(),
		ResponderResources: b.ResponderResources(), LocalEECN: b.LocalEECN(),
		InitiatorDepth: b.InitiatorDepth(), RemoteEECN: b.RemoteEECN(),
		RemoteCMResponseTimeout: b.RemoteCMResponseTimeout(), Transport: b.Transport(),
		FlowControl: b.FlowControl(), StartingPSN: b.StartingPSN(),
		LocalCMResponseTimeout: b.LocalCMResponseTimeout(), RetryCount: b.RetryCount(),
		PKey: b.PKey(), PathMTU: b.PathMTU(), RDCExists: b.RDCExists(),
		RNRRetryCount: b.RNRRetryCount(), MaxCMRetries: b.MaxCMRetries(), SRQ: b.SRQ(),
		ExtTransportType: b.ExtTransportType(), Primary: b.Primary(), Alternate: b.Alternate(),
		SAPSupported: b.SAPSupported(), PrivateData: clone(b.PrivateData()),
	}
}

// ---------------------------------------------------------------- MRA

// MsgType says which message an MRA acknowledges or a REJ rejects.
type MsgType uint8

// Message-MRAed / Message-Rejected values.
const (
	MsgREQ   MsgType = 0
	MsgREP   MsgType = 1
	MsgOther MsgType = 2 // MRA: LAP; REJ: neither REQ nor REP
)

const (
	cmLocalCommID  = 0
	cmRemoteCommID = 4
	mraPrivate     = 10
)

// MRA is a view of a MsgRcptAck.
type MRA []byte

// MRAFields holds the fields of an MRA.
type MRAFields struct {
	LocalCommID, RemoteCommID uint32
	MessageMRAed              MsgType
	ServiceTimeout            uint8 // 5 bits: answer within 4.096 µs × 2^t
	PrivateData               []byte
}

// LocalCommID returns the sender's communication ID.
func (b MRA) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b MRA) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// MessageMRAed returns which message is acknowledged.
func (b MRA) MessageMRAed() MsgType { return MsgType(top(b[8], 2)) }

// ServiceTimeout returns the 5-bit service timeout.
func (b MRA) ServiceTimeout() uint8 { return top(b[9], 5) }

// PrivateData returns the private data in place.
func (b MRA) PrivateData() []byte { return b[mraPrivate : mraPrivate+MRAPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding the private data.
func (b MRA) Encode(f *MRAFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	b[8] = place(uint8(f.MessageMRAed), 0, 2)
	b[9] = place(f.ServiceTimeout, 0, 5)
	setPrivate(b[mraPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b MRA) Fields() MRAFields {
	b = full(b, DataSize)
	return MRAFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		MessageMRAed: b.MessageMRAed(), ServiceTimeout: b.ServiceTimeout(), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- REJ

const (
	rejReason  = 10
	rejARI     = 12
	rejPrivate = 84
)

// REJ is a view of a ConnectReject.
type REJ []byte

// REJFields holds the fields of a REJ.
type REJFields struct {
	LocalCommID, RemoteCommID uint32
	MessageRejected           MsgType
	ARILength                 uint8 // 7 bits: valid bytes of ARI
	Reason                    RejectReason
	ARI                       []byte // up to ARISize; Fields returns all 72 bytes
	PrivateData               []byte
}

// LocalCommID returns the rejecter's communication ID (0 if it had none).
func (b REJ) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b REJ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// MessageRejected returns which message is rejected.
func (b REJ) MessageRejected() MsgType { return MsgType(top(b[8], 2)) }

// ARILength returns the length of the additional reject information.
func (b REJ) ARILength() uint8 { return top(b[9], 7) }

// Reason returns the reject reason.
func (b REJ) Reason() RejectReason { return RejectReason(binary.BigEndian.Uint16(b[rejReason:])) }

// ARI returns the 72-byte additional reject information area in place.
func (b REJ) ARI() []byte { return b[rejARI : rejARI+ARISize] }

// PrivateData returns the private data in place.
func (b REJ) PrivateData() []byte { return b[rejPrivate : rejPrivate+REJPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding ARI and private data.
func (b REJ) Encode(f *REJFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	b[8] = place(uint8(f.MessageRejected), 0, 2)
	b[9] = place(f.ARILength, 0, 7)
	binary.BigEndian.PutUint16(b[rejReason:], uint16(f.Reason))
	setPrivate(b[rejARI:rejARI+ARISize], f.ARI)
	setPrivate(b[rejPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b REJ) Fields() REJFields {
	b = full(b, DataSize)
	return REJFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		MessageRejected: b.MessageRejected(), ARILength: b.ARILength(), Reason: b.Reason(),
		ARI: clone(b.ARI()), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- REP

const (
	repLocalQKey = 8
	repLocalQPN  = 12
	repVendorH   = 15
	repLocalEECN = 16
	repVendorM   = 19
	repStartPSN  = 20
	repVendorL   = 23
	repRespRes   = 24
	repInitDepth = 25
	repByte26    = 26 // target ACK delay 7–3, failover 2–1, E2E flow control 0
	repByte27    = 27 // RNR retry 7–5, SRQ 4
	repCAGUID    = 28
	repPrivate   = 36
)

// REP is a view of a ConnectReply.
type REP []byte

// REPFields holds the fields of a REP.
type REPFields struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32 // 24 bits
	VendorID                  uint32 // 24 bits, split over three bytes on the wire
	LocalEECN                 uint32
	StartingPSN               uint32
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8 // 5 bits
	FailoverAccepted          uint8 // 2 bits
	FlowControl               bool
	RNRRetryCount             uint8 // 3 bits
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               []byte
}

// LocalCommID returns the replier's communication ID.
func (b REP) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the requester's communication ID.
func (b REP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// LocalQKey returns the replier's Q_Key.
func (b REP) LocalQKey() uint32 { return binary.BigEndian.Uint32(b[repLocalQKey:]) }

// LocalQPN returns the replier's QP number.
func (b REP) LocalQPN() uint32 { return ib.Uint24(b[repLocalQPN:]) }

// VendorID returns the 24-bit ECE vendor ID.
func (b REP) VendorID() uint32 {
	return uint32(b[repVendorH])<<16 | uint32(b[repVendorM])<<8 | uint32(b[repVendorL])
}

// LocalEECN returns the replier's EE context number.
func (b REP) LocalEECN() uint32 { return ib.Uint24(b[repLocalEECN:]) }

// StartingPSN returns the replier's starting PSN.
func (b REP) StartingPSN() uint32 { return ib.Uint24(b[repStartPSN:]) }

// ResponderResources returns the replier's responder resources.
func (b REP) ResponderResources() uint8 { return b[repRespRes] }

// InitiatorDepth returns the replier's initiator depth.
func (b REP) InitiatorDepth() uint8 { return b[repInitDepth] }

// TargetACKDelay returns the replier's CA ACK delay.
func (b REP) TargetACKDelay() uint8 { return top(b[repByte26], 5) }

// FailoverAccepted returns the failover-accepted code.
func (b REP) FailoverAccepted() uint8 { return bitsAt(b[repByte26], 5, 2) }

// FlowControl returns the end-to-end flow control bit.
func (b REP) FlowControl() bool { return b[repByte26]&1 != 0 }

// RNRRetryCount returns the RNR retry count the requester's QP should use.
func (b REP) RNRRetryCount() uint8 { return top(b[repByte27], 3) }

// SRQ returns the SRQ bit.
func (b REP) SRQ() bool { return bitsAt(b[repByte27], 3, 1) != 0 }

// LocalCAGUID returns the replier's CA GUID.
func (b REP) LocalCAGUID() uint64 { return binary.BigEndian.Uint64(b[repCAGUID:]) }

// PrivateData returns the private data in place.
func (b REP) PrivateData() []byte { return b[repPrivate : repPrivate+REPPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding the private data.
func (b REP) Encode(f *REPFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	binary.BigEndian.PutUint32(b[repLocalQKey:], f.LocalQKey)
	ib.PutUint24(b[repLocalQPN:], f.LocalQPN)
	b[repVendorH] = byte(f.VendorID >> 16)
	ib.PutUint24(b[repLocalEECN:], f.LocalEECN)
	b[repVendorM] = byte(f.VendorID >> 8)
	ib.PutUint24(b[repStartPSN:], f.StartingPSN)
	b[repVendorL] = byte(f.VendorID)
	b[repRespRes] = f.ResponderResources
	b[repInitDepth] = f.InitiatorDepth
	b[repByte26] = place(f.TargetACKDelay, 0, 5) | place(f.FailoverAccepted, 5, 2) | b2u(f.FlowControl)
	b[repByte27] = place(f.RNRRetryCount, 0, 3) | place(b2u(f.SRQ), 3, 1)
	binary.BigEndian.PutUint64(b[repCAGUID:], f.LocalCAGUID)
	setPrivate(b[repPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b REP) Fields() REPFields {
	b = full(b, DataSize)
	return REPFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		LocalQKey: b.LocalQKey(), LocalQPN: b.LocalQPN(), VendorID: b.VendorID(),
		LocalEECN: b.LocalEECN(), StartingPSN: b.StartingPSN(),
		ResponderResources: b.ResponderResources(), InitiatorDepth: b.InitiatorDepth(),
		TargetACKDelay: b.TargetACKDelay(), FailoverAccepted: b.FailoverAccepted(),
		FlowControl: b.FlowControl(), RNRRetryCount: b.RNRRetryCount(), SRQ: b.SRQ(),
		LocalCAGUID: b.LocalCAGUID(), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- RTU, DREP

const commPrivate = 8

// RTU is a view of a ReadyToUse.
type RTU []byte

// RTUFields holds the fields of an RTU (the same shape as a DREP).
type RTUFields struct {
	LocalCommID, RemoteCommID uint32
	PrivateData               []byte
}

// LocalCommID returns the sender's communication ID.
func (b RTU) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b RTU) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// PrivateData returns the private data in place.
func (b RTU) PrivateData() []byte { return b[commPrivate : commPrivate+RTUPrivateDataSize] }

// Encode writes f, padding the private data.
func (b RTU) Encode(f *RTUFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	setPrivate(b[commPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b RTU) Fields() RTUFields {
	b = full(b, DataSize)
	return RTUFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(), PrivateData: clone(b.PrivateData())}
}

// DREP is a view of a DisconnectReply.
type DREP []byte

// DREPFields holds the fields of a DREP.
type DREPFields = RTUFields

// LocalCommID returns the sender's communication ID.
func (b DREP) LocalCommID() uint32 { return RTU(b).LocalCommID() }

// RemoteCommID returns the receiver's communication ID.
func (b DREP) RemoteCommID() uint32 { return RTU(b).RemoteCommID() }

// PrivateData returns the private data in place.
func (b DREP) PrivateData() []byte { return RTU(b).PrivateData() }

// Encode writes f, padding the private data.
func (b DREP) Encode(f *DREPFields) { RTU(b).Encode(f) }

// Fields decodes b; a short view reads as zero-padded.
func (b DREP) Fields() DREPFields { return RTU(b).Fields() }

// ---------------------------------------------------------------- DREQ

const (
	dreqRemoteQPN = 8
	dreqPrivate   = 12
)

// DREQ is a view of a DisconnectRequest.
type DREQ []byte

// DREQFields holds the fields of a DREQ.
type DREQFields struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32 // 24 bits: must equal the receiver's QPN
	PrivateData               []byte
}

// LocalCommID returns the sender's communication ID.
func (b DREQ) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b DREQ) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// RemoteQPN returns the receiver's QPN/EECN as the sender knows it.
func (b DREQ) RemoteQPN() uint32 { return ib.Uint24(b[dreqRemoteQPN:]) }

// PrivateData returns the private data in place.
func (b DREQ) PrivateData() []byte { return b[dreqPrivate : dreqPrivate+DREQPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding the private data.
func (b DREQ) Encode(f *DREQFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	ib.PutUint24(b[dreqRemoteQPN:], f.RemoteQPN)
	b[11] = 0
	setPrivate(b[dreqPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b DREQ) Fields() DREQFields {
	b = full(b, DataSize)
	return DREQFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		RemoteQPN: b.RemoteQPN(), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- SIDR

const (
	sidrReqPKey      = 4
	sidrReqServiceID = 8
	sidrReqPrivate   = 16
)

// SIDRREQ is a view of a ServiceIDResReq.
type SIDRREQ []byte

// SIDRREQFields holds the fields of a SIDR_REQ.
type SIDRREQFields struct {
	RequestID   uint32
	PKey        uint16
	ServiceID   uint64
	PrivateData []byte
}

// RequestID returns the request ID.
func (b SIDRREQ) RequestID() uint32 { return binary.BigEndian.Uint32(b[0:]) }

// PKey returns the partition key.
func (b SIDRREQ) PKey() uint16 { return binary.BigEndian.Uint16(b[sidrReqPKey:]) }

// ServiceID returns the service ID.
func (b SIDRREQ) ServiceID() uint64 { return binary.BigEndian.Uint64(b[sidrReqServiceID:]) }

// PrivateData returns the private data in place.
func (b SIDRREQ) PrivateData() []byte {
	return b[sidrReqPrivate : sidrReqPrivate+SIDRREQPrivateDataSize]
}

// Encode writes f, zeroing reserved bytes and padding the private data.
func (b SIDRREQ) Encode(f *SIDRREQFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[0:], f.RequestID)
	binary.BigEndian.PutUint16(b[sidrReqPKey:], f.PKey)
	b[6], b[7] = 0, 0
	binary.BigEndian.PutUint64(b[sidrReqServiceID:], f.ServiceID)
	setPrivate(b[sidrReqPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b SIDRREQ) Fields() SIDRREQFields {
	b = full(b, DataSize)
	return SIDRREQFields{RequestID: b.RequestID(), PKey: b.PKey(), ServiceID: b.ServiceID(),
		PrivateData: clone(b.PrivateData())}
}

// SIDRStatus is the SIDR_REP status (ib_cm.h: enum ib_cm_sidr_status).
type SIDRStatus uint8

// SIDR_REP status values.
const (
	SIDRSuccess        SIDRStatus = 0
	SIDRUnsupported    SIDRStatus = 1 // no service bound to the service ID
	SIDRReject         SIDRStatus = 2
	SIDRNoQP           SIDRStatus = 3
	SIDRRedirect       SIDRStatus = 4
	SIDRUnsupportedVer SIDRStatus = 5
)

var sidrNames = [...]string{"success", "unsupported", "reject", "no QP", "redirect", "unsupported version"}

func (s SIDRStatus) String() string {
	if int(s) < len(sidrNames) {
		return sidrNames[s]
	}
	return "SIDR_STATUS_" + strconv.Itoa(int(s))
}

// Error makes a non-success status the error of a refused SIDR request.
func (s SIDRStatus) Error() string { return "cm: SIDR request refused: " + s.String() }

// Is makes every SIDRStatus match ErrRejected, like a RejectReason.
func (s SIDRStatus) Is(target error) bool { return target == ErrRejected }

const (
	sidrRepStatus    = 4
	sidrRepInfoLen   = 5
	sidrRepVendorH   = 6
	sidrRepQPN       = 8
	sidrRepVendorL   = 11
	sidrRepServiceID = 12
	sidrRepQKey      = 20
	sidrRepInfo      = 24
	sidrRepPrivate   = 96
)

// SIDRREP is a view of a ServiceIDResReqResp.
type SIDRREP []byte

// SIDRREPFields holds the fields of a SIDR_REP.
type SIDRREPFields struct {
	RequestID   uint32
	Status      SIDRStatus
	InfoLength  uint8
	VendorID    uint32 // 24 bits
	QPN         uint32 // 24 bits
	ServiceID   uint64
	QKey        uint32
	Info        []byte // up to ARISize
	PrivateData []byte
}

// RequestID returns the request ID being answered.
func (b SIDRREP) RequestID() uint32 { return binary.BigEndian.Uint32(b[0:]) }

// Status returns the SIDR status.
func (b SIDRREP) Status() SIDRStatus { return SIDRStatus(b[sidrRepStatus]) }

// InfoLength returns the additional information length.
func (b SIDRREP) InfoLength() uint8 { return b[sidrRepInfoLen] }

// VendorID returns the 24-bit vendor ID.
func (b SIDRREP) VendorID() uint32 {
	return uint32(binary.BigEndian.Uint16(b[sidrRepVendorH:]))<<8 | uint32(b[sidrRepVendorL])
}

// QPN returns the UD QP number serving the service.
func (b SIDRREP) QPN() uint32 { return ib.Uint24(b[sidrRepQPN:]) }

// ServiceID returns the service ID.
func (b SIDRREP) ServiceID() uint64 { return binary.BigEndian.Uint64(b[sidrRepServiceID:]) }

// QKey returns the Q_Key of the UD QP.
func (b SIDRREP) QKey() uint32 { return binary.BigEndian.Uint32(b[sidrRepQKey:]) }

// Info returns the additional information area in place.
func (b SIDRREP) Info() []byte { return b[sidrRepInfo : sidrRepInfo+ARISize] }

// PrivateData returns the private data in place.
func (b SIDRREP) PrivateData() []byte {
	return b[sidrRepPrivate : sidrRepPrivate+SIDRREPPrivateDataSize]
}

// Encode writes f, padding info and private data.
func (b SIDRREP) Encode(f *SIDRREPFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[0:], f.RequestID)
	b[sidrRepStatus] = uint8(f.Status)
	b[sidrRepInfoLen] = f.InfoLength
	binary.BigEndian.PutUint16(b[sidrRepVendorH:], uint16(f.VendorID>>8))
	ib.PutUint24(b[sidrRepQPN:], f.QPN)
	b[sidrRepVendorL] = byte(f.VendorID)
	binary.BigEndian.PutUint64(b[sidrRepServiceID:], f.ServiceID)
	binary.BigEndian.PutUint32(b[sidrRepQKey:], f.QKey)
	setPrivate(b[sidrRepInfo:sidrRepInfo+ARISize], f.Info)
	setPrivate(b[sidrRepPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b SIDRREP) Fields() SIDRREPFields {
	b = full(b, DataSize)
	return SIDRREPFields{RequestID: b.RequestID(), Status: b.Status(), InfoLength: b.InfoLength(),
		VendorID: b.VendorID(), QPN: b.QPN(), ServiceID: b.ServiceID(), QKey: b.QKey(),
		Info: clone(b.Info()), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- LAP

const (
	lapRemoteQPN = 12
	lapRespTO    = 15
	lapLocalLID  = 20
	lapRemoteLID = 22
	lapLocalGID  = 24
	lapRemoteGID = 40
	lapFlowWord  = 56
	lapTC        = 59
	lapHopLimit  = 60
	lapRate      = 61
	lapSL        = 62
	lapACK       = 63
	lapPrivate   = 64
)

// LAP is a view of a LoadAlternatePath.
type LAP []byte

// LAPFields holds the fields of a LAP.
type LAPFields struct {
	LocalCommID, RemoteCommID uint32
	RemoteQPN                 uint32
	RemoteCMResponseTimeout   uint8
	Alternate                 PathFields
	PrivateData               []byte
}

// LocalCommID returns the sender's communication ID.
func (b LAP) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b LAP) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// RemoteQPN returns the receiver's QPN/EECN.
func (b LAP) RemoteQPN() uint32 { return ib.Uint24(b[lapRemoteQPN:]) }

// RemoteCMResponseTimeout returns the 5-bit remote CM response timeout.
func (b LAP) RemoteCMResponseTimeout() uint8 { return top(b[lapRespTO], 5) }

// Alternate returns the proposed alternate path.
func (b LAP) Alternate() PathFields {
	var p PathFields
	p.LocalLID = binary.BigEndian.Uint16(b[lapLocalLID:])
	p.RemoteLID = binary.BigEndian.Uint16(b[lapRemoteLID:])
	copy(p.LocalGID[:], b[lapLocalGID:])
	copy(p.RemoteGID[:], b[lapRemoteGID:])
	p.FlowLabel = binary.BigEndian.Uint32(b[lapFlowWord:]) >> 12
	p.TrafficClass = b[lapTC]
	p.HopLimit = b[lapHopLimit]
	p.PacketRate = b[lapRate] & 0x3f
	p.SL = top(b[lapSL], 4)
	p.SubnetLocal = bitsAt(b[lapSL], 4, 1) != 0
	p.LocalACKTimeout = top(b[lapACK], 5)
	return p
}

// PrivateData returns the private data in place.
func (b LAP) PrivateData() []byte { return b[lapPrivate : lapPrivate+LAPPrivateDataSize] }

// Encode writes f, zeroing reserved bits and padding the private data.
func (b LAP) Encode(f *LAPFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	clear(b[8:12])
	ib.PutUint24(b[lapRemoteQPN:], f.RemoteQPN)
	b[lapRespTO] = place(f.RemoteCMResponseTimeout, 0, 5)
	clear(b[16:20])
	p := &f.Alternate
	binary.BigEndian.PutUint16(b[lapLocalLID:], p.LocalLID)
	binary.BigEndian.PutUint16(b[lapRemoteLID:], p.RemoteLID)
	copy(b[lapLocalGID:], p.LocalGID[:])
	copy(b[lapRemoteGID:], p.RemoteGID[:])
	binary.BigEndian.PutUint32(b[lapFlowWord:], (p.FlowLabel&0xfffff)<<12)
	b[lapTC] = p.TrafficClass
	b[lapHopLimit] = p.HopLimit
	b[lapRate] = p.PacketRate & 0x3f
	b[lapSL] = place(p.SL, 0, 4) | place(b2u(p.SubnetLocal), 4, 1)
	b[lapACK] = place(p.LocalACKTimeout, 0, 5)
	setPrivate(b[lapPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b LAP) Fields() LAPFields {
	b = full(b, DataSize)
	return LAPFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		RemoteQPN: b.RemoteQPN(), RemoteCMResponseTimeout: b.RemoteCMResponseTimeout(),
		Alternate: b.Alternate(), PrivateData: clone(b.PrivateData())}
}

// ---------------------------------------------------------------- APR

// APRStatus is the AP Status of an APR (ib_cm.h: enum ib_cm_apr_status).
type APRStatus uint8

// APR status values.
const (
	APRSuccess         APRStatus = 0
	APRInvalidCommID   APRStatus = 1
	APRUnsupported     APRStatus = 2
	APRRejected        APRStatus = 3
	APRRedirect        APRStatus = 4
	APRIsCurrent       APRStatus = 5
	APRInvalidQPN      APRStatus = 6
	APRInvalidLID      APRStatus = 7
	APRInvalidGID      APRStatus = 8
	APRInvalidFlowLbl  APRStatus = 9
	APRInvalidTCLass   APRStatus = 10
	APRInvalidHopLimit APRStatus = 11
	APRInvalidPktRate  APRStatus = 12
	APRInvalidSL       APRStatus = 13
)

const (
	aprInfoLen = 8
	aprStatus  = 9
	aprInfo    = 12
	aprPrivate = 84
)

// APR is a view of an AlternatePathResponse.
type APR []byte

// APRFields holds the fields of an APR.
type APRFields struct {
	LocalCommID, RemoteCommID uint32
	InfoLength                uint8
	Status                    APRStatus
	Info                      []byte
	PrivateData               []byte
}

// LocalCommID returns the sender's communication ID.
func (b APR) LocalCommID() uint32 { return binary.BigEndian.Uint32(b[cmLocalCommID:]) }

// RemoteCommID returns the receiver's communication ID.
func (b APR) RemoteCommID() uint32 { return binary.BigEndian.Uint32(b[cmRemoteCommID:]) }

// InfoLength returns the additional information length.
func (b APR) InfoLength() uint8 { return b[aprInfoLen] }

// Status returns the AP status.
func (b APR) Status() APRStatus { return APRStatus(b[aprStatus]) }

// Info returns the additional information area in place.
func (b APR) Info() []byte { return b[aprInfo : aprInfo+ARISize] }

// PrivateData returns the private data in place.
func (b APR) PrivateData() []byte { return b[aprPrivate : aprPrivate+APRPrivateDataSize] }

// Encode writes f, zeroing reserved bytes and padding info and private data.
func (b APR) Encode(f *APRFields) {
	_ = b[DataSize-1]
	binary.BigEndian.PutUint32(b[cmLocalCommID:], f.LocalCommID)
	binary.BigEndian.PutUint32(b[cmRemoteCommID:], f.RemoteCommID)
	b[aprInfoLen] = f.InfoLength
	b[aprStatus] = uint8(f.Status)
	b[10], b[11] = 0, 0
	setPrivate(b[aprInfo:aprInfo+ARISize], f.Info)
	setPrivate(b[aprPrivate:DataSize], f.PrivateData)
}

// Fields decodes b; a short view reads as zero-padded.
func (b APR) Fields() APRFields {
	b = full(b, DataSize)
	return APRFields{LocalCommID: b.LocalCommID(), RemoteCommID: b.RemoteCommID(),
		InfoLength: b.InfoLength(), Status: b.Status(), Info: clone(b.Info()), PrivateData: clone(b.PrivateData())}
}
