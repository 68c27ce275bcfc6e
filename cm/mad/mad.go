package mad

import (
	"encoding/binary"
	"strconv"

	"github.com/goroce/goroce/ib"
)

// Sizes of a MAD and its parts.
const (
	Size       = 256 // every CM MAD is a 256-byte management datagram
	HeaderSize = 24  // MAD common header
	DataSize   = Size - HeaderSize
)

// Values of the MAD header for the Communication Manager.
const (
	BaseVersion    = 1    // IB_MGMT_BASE_VERSION
	ClassCM        = 0x07 // IB_MGMT_CLASS_CM
	ClassVersionCM = 2    // IB_CM_CLASS_VERSION
)

// Method is the MAD method (bits 6–0 of byte 3).
type Method uint8

// MAD methods (ib_mad.h). The CM uses only MethodSend.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
)

// AttrID is the MAD attribute ID; for class CM it names the message.
type AttrID uint16

// CM attribute IDs.
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001A
)

var attrNames = map[AttrID]string{
	AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP",
	AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP", AttrLAP: "LAP", AttrAPR: "APR",
}

// String returns the message name ("REQ", "SIDR_REP", ...) or the hex value.
func (a AttrID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return "AttrID(0x" + strconv.FormatUint(uint64(a), 16) + ")"
}

// IsCM reports whether a is one of the eleven CM messages.
func (a AttrID) IsCM() bool { return a >= AttrREQ && a <= AttrAPR }

// MAD header field offsets (ib_mad.h: struct ib_mad_hdr).
const (
	madBaseVersion   = 0
	madMgmtClass     = 1
	madClassVersion  = 2
	madMethod        = 3
	madStatus        = 4
	madClassSpecific = 6
	madTID           = 8
	madAttrID        = 16
	madAttrMod       = 20
	responseBit      = 0x80
)

// MAD is a view of a management datagram: the 24-byte common header followed
// by the class data.
type MAD []byte

// MADFields holds the fields of the MAD common header.
type MADFields struct {
	BaseVersion   uint8
	MgmtClass     uint8
	ClassVersion  uint8
	Response      bool // R bit
	Method        Method
	Status        uint16
	ClassSpecific uint16
	TID           uint64
	AttrID        AttrID
	AttrMod       uint32
}

// BaseVersion returns the MAD base version.
func (m MAD) BaseVersion() uint8 { return m[madBaseVersion] }

// MgmtClass returns the management class.
func (m MAD) MgmtClass() uint8 { return m[madMgmtClass] }

// ClassVersion returns the class version.
func (m MAD) ClassVersion() uint8 { return m[madClassVersion] }

// Response reports the R (response) bit.
func (m MAD) Response() bool { return m[madMethod]&responseBit != 0 }

// Method returns the method without the R bit.
func (m MAD) Method() Method { return Method(m[madMethod] &^ responseBit) }

// Status returns the status word.
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[madStatus:]) }

// ClassSpecific returns the class-specific word.
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[madClassSpecific:]) }

// TID returns the transaction ID.
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[madTID:]) }

// SetTID sets the transaction ID.
func (m MAD) SetTID(v uint64) { binary.BigEndian.PutUint64(m[madTID:], v) }

// AttrID returns the attribute ID.
func (m MAD) AttrID() AttrID { return AttrID(binary.BigEndian.Uint16(m[madAttrID:])) }

// AttrMod returns the attribute modifier.
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[madAttrMod:]) }

// Data returns the class data after the header (232 bytes for a full MAD).
func (m MAD) Data() []byte { return m[HeaderSize:] }

// Encode writes the header fields, zeroing the reserved word.
func (m MAD) Encode(f *MADFields) {
	m[madBaseVersion] = f.BaseVersion
	m[madMgmtClass] = f.MgmtClass
	m[madClassVersion] = f.ClassVersion
	mb := byte(f.Method) &^ responseBit
	if f.Response {
		mb |= responseBit
	}
	m[madMethod] = mb
	binary.BigEndian.PutUint16(m[madStatus:], f.Status)
	binary.BigEndian.PutUint16(m[madClassSpecific:], f.ClassSpecific)
	binary.BigEndian.PutUint64(m[madTID:], f.TID)
	binary.BigEndian.PutUint16(m[madAttrID:], uint16(f.AttrID))
	m[18], m[19] = 0, 0
	binary.BigEndian.PutUint32(m[madAttrMod:], f.AttrMod)
}

// Fields decodes the header; a short view reads as zero-padded.
func (m MAD) Fields() MADFields {
	m = full(m, HeaderSize)
	return MADFields{
		BaseVersion: m.BaseVersion(), MgmtClass: m.MgmtClass(), ClassVersion: m.ClassVersion(),
		Response: m.Response(), Method: m.Method(), Status: m.Status(),
		ClassSpecific: m.ClassSpecific(), TID: m.TID(), AttrID: m.AttrID(), AttrMod: m.AttrMod(),
	}
}

// CMHeader returns the header fields of a CM message of type a: base version
// 1, class CM, class version 2, method Send.
func CMHeader(a AttrID, tid uint64) MADFields {
	return MADFields{BaseVersion: BaseVersion, MgmtClass: ClassCM, ClassVersion: ClassVersionCM,
		Method: MethodSend, TID: tid, AttrID: a}
}

// ParseMAD returns a view of the first Size bytes of b after checking that
// it is a whole MAD with base version 1. Longer input (a receive buffer) is
// cut to Size. The class is not checked; see [ParseCM].
func ParseMAD(b []byte) (MAD, error) {
	if len(b) < Size {
		return nil, &ParseError{Msg: "mad", Offset: len(b), Err: ib.ErrTruncated, Reason: "shorter than 256 bytes"}
	}
	m := MAD(b[:Size:Size])
	if m.BaseVersion() != BaseVersion {
		return nil, &ParseError{Msg: "mad", Offset: madBaseVersion, Err: ib.ErrUnsupported, Reason: "base version is not 1"}
	}
	return m, nil
}

// ParseCM is ParseMAD plus the checks the Linux MAD layer applies before it
// hands a MAD to the CM: class 0x07, class version 2, method Send without the
// R bit, and a CM attribute ID.
func ParseCM(b []byte) (MAD, error) {
	m, err := ParseMAD(b)
	if err != nil {
		return nil, err
	}
	switch {
	case m.MgmtClass() != ClassCM:
		return nil, &ParseError{Msg: "mad", Offset: madMgmtClass, Err: ib.ErrUnsupported, Reason: "not class CM"}
	case m.ClassVersion() != ClassVersionCM:
		return nil, &ParseError{Msg: "mad", Offset: madClassVersion, Err: ib.ErrUnsupported, Reason: "CM class version is not 2"}
	case m[madMethod] != byte(MethodSend):
		return nil, &ParseError{Msg: "mad", Offset: madMethod, Err: ib.ErrUnsupported, Reason: "method is not Send"}
	case !m.AttrID().IsCM():
		return nil, &ParseError{Msg: "mad", Offset: madAttrID, Err: ib.ErrUnsupported, Reason: "not a CM message"}
	}
	return m, nil
}

// ParseError describes why a decoder rejected its input. It wraps
// ib.ErrTruncated, ib.ErrMalformed or ib.ErrUnsupported.
type ParseError struct {
	Msg    string // "mad", "cma_hdr", ...
	Offset int    // byte offset of the fault in the decoder's input
	Err    error
	Reason string
}

// Error implements error.
func (e *ParseError) Error() string {
	return "cm: " + e.Msg + " at offset " + strconv.Itoa(e.Offset) + ": " + e.Err.Error() + ": " + e.Reason
}

// Unwrap returns the wrapped sentinel.
func (e *ParseError) Unwrap() error { return e.Err }

// full returns b if it holds n bytes, else a zero-padded copy (bad input only).
func full(b []byte, n int) []byte {
	if len(b) >= n {
		return b
	}
	c := make([]byte, n)
	copy(c, b)
	return c
}

// top returns the w most significant bits of b shifted down.
func top(b byte, w uint) uint8 { return b >> (8 - w) }

// bitsAt returns w bits of b starting k bits below the most significant bit.
func bitsAt(b byte, k, w uint) uint8 { return (b >> (8 - k - w)) & (1<<w - 1) }

// place returns v's low w bits positioned k bits below the most significant bit.
func place(v uint8, k, w uint) byte { return (v & (1<<w - 1)) << (8 - k - w) }

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// setPrivate copies p into dst and zeroes the rest.
func setPrivate(dst, p []byte) {
	n := copy(dst, p)
	clear(dst[n:])
}

// clone returns a copy of b (Fields must not alias the wire buffer).
func clone(b []byte) []byte { return append([]byte(nil), b...) }
