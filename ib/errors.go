package ib

import (
	"errors"
	"strconv"
)

// Sentinel errors wrapped by every *ParseError; test with errors.Is.
var (
	// ErrTruncated reports input shorter than a header or a length field demands.
	ErrTruncated = errors.New("truncated")
	// ErrMalformed reports a field whose value is inconsistent or out of range.
	ErrMalformed = errors.New("malformed")
	// ErrUnsupported reports a well-formed frame that is not RoCEv2 as this
	// package handles it (other ethertype/protocol/port, IPv4 options, fragments,
	// unknown opcode or transport version).
	ErrUnsupported = errors.New("unsupported")
	// ErrBadICRC reports an ICRC that does not match the packet.
	ErrBadICRC = errors.New("ib: bad ICRC")
	// ErrShortBuffer reports a Build/BuildIB buffer smaller than FrameSpec.Len.
	ErrShortBuffer = errors.New("ib: buffer too small for frame")
	// ErrInvalidSpec is wrapped by every *SpecError returned by Build/BuildIB.
	ErrInvalidSpec = errors.New("ib: invalid frame spec")
)

// ParseError describes why Parse, ParseIB or a checked header constructor
// rejected its input.
type ParseError struct {
	// Layer names the header at fault: "ethernet", "vlan", "ipv4", "ipv6",
	// "udp", "bth", "rdeth", "deth", "xrceth", "feth", "reth", "atomiceth",
	// "aeth", "atomicacketh", "immdt", "ieth", "cnp", "payload" or "icrc".
	Layer string
	// Offset is the byte offset, within the input given to the decoder, of the
	// header or field at fault.
	Offset int
	// Err is ErrTruncated, ErrMalformed or ErrUnsupported.
	Err error
	// Reason is a short static description of the check that failed.
	Reason string
}

// Error implements error.
func (e *ParseError) Error() string {
	s := "ib: " + e.Layer + " at offset " + strconv.Itoa(e.Offset) + ": "
	if e.Err != nil {
		s += e.Err.Error()
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns the sentinel (ErrTruncated, ErrMalformed or ErrUnsupported).
func (e *ParseError) Unwrap() error { return e.Err }

// SpecError describes a FrameSpec that Build or BuildIB cannot encode.
type SpecError struct {
	// Field names the FrameSpec field at fault.
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *SpecError) Error() string { return "ib: invalid frame spec: " + e.Field + ": " + e.Reason }

// Unwrap returns ErrInvalidSpec.
func (e *SpecError) Unwrap() error { return ErrInvalidSpec }

// errNilPacket is returned by Parse and ParseIB when given a nil *Packet.
var errNilPacket = &ParseError{Layer: "packet", Err: ErrMalformed, Reason: "nil *Packet"}

// errNoIP is returned by VerifyICRC for packets decoded without an IP header;
// preallocated so the check stays allocation-free.
var errNoIP = &ParseError{Layer: "ipv4", Err: ErrUnsupported, Reason: "no IP header (packet decoded by ParseIB); use ICRC with the IP header"}
