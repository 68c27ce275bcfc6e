package naaice

import (
	"errors"
	"fmt"

	"github.com/goroce/goroce/internal/errclosed"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

var (
	// ErrConnectionEnded reports that the connection ended (the peer
	// disconnected, or the CM gave up) while an operation waited.
	ErrConnectionEnded = errors.New("naaice: connection ended")
	// ErrState reports a call that the context's state does not allow
	// (an MRSP before connecting, an RPC before the MRSP, ...).
	ErrState = errors.New("naaice: call not allowed in this state")
	// ErrClosed reports use of a closed context or server.
	ErrClosed = errclosed.New("naaice: closed")
	// ErrInvalid reports a bad argument (region index, size, function code).
	ErrInvalid = errors.New("naaice: invalid argument")
)

// RPCError is the NAA's non-zero return code of an RPC. The outputs may
// not have been written.
type RPCError struct {
	// Code is the return code as the C host reports it (immediate >> 8,
	// or the low byte when only that is set).
	Code uint32
	// Imm is the immediate as received.
	Imm uint32
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("naaice: NAA returned code %#x (immediate %#08x)", e.Code, e.Imm)
}

// MRSPError is an MRSP error message from the NAA.
type MRSPError struct{ Code mrsp.ErrCode }

func (e *MRSPError) Error() string {
	s := "unknown"
	switch e.Code {
	case mrsp.CodeNoMemory:
		s = "not enough memory"
	case mrsp.CodeInvalidAddress:
		s = "invalid address"
	case mrsp.CodeTooManyRegions:
		s = "too many regions"
	}
	return fmt.Sprintf("naaice: NAA refused the memory regions: code %d (%s)", e.Code, s)
}

// CompletionError is a work completion with an error status: the QP is in
// the error state and the connection is unusable.
type CompletionError struct {
	Status roce.WCStatus
	Opcode roce.WCOpcode
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("naaice: work completion %v failed: %v", e.Opcode, e.Status)
}
