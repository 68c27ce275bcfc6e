package mrsp

import "errors"

// ErrCode is an MRSP error code (byte 1 of an ERR message).
type ErrCode uint8

const (
	CodeNoMemory       ErrCode = 0x01 // not enough memory (address + size exceeds the memory boundary)
	CodeInvalidAddress ErrCode = 0x02 // invalid address (out of bounds)
	CodeTooManyRegions ErrCode = 0x03 // too many regions requested
)

// Error categories, matched with errors.Is.
var (
	// ErrMalformed: a message or immediate that breaks the format.
	ErrMalformed = errors.New("naaice: malformed message")
	// ErrRefused: a well-formed AAR that the NAA's limits or memory cannot
	// serve (too many or too large regions, bad or overlapping addresses).
	ErrRefused = errors.New("naaice: request refused")
	// ErrProtocol: the peer broke the exchange: an event the state does not
	// accept (every *TransitionError), or an A that does not match the AAR.
	ErrProtocol = errors.New("naaice: protocol violation")
	// ErrAborted: the host reported an error (immediate 0).
	ErrAborted = errors.New("naaice: host reported an error")
	// ErrNoWrites: a data phase without writes (no outputs, nothing to
	// send); a condition callers branch on, returned as is.
	ErrNoWrites = errors.New("naaice: data phase without writes")
)

// Error is the type of the errors this package returns apart from
// ErrNoWrites: a category (Kind), a stable Reason token, the text, and the
// MRSP error code an NAA answers with when an AAR fails this check. The
// values are fixed, so returning one allocates nothing.
type Error struct {
	Kind   error  // ErrMalformed, ErrRefused, ErrProtocol or ErrAborted
	Reason string // see the package doc
	Detail string
	Code   ErrCode
}

func (e *Error) Error() string { return "naaice: " + e.Detail }

// Is makes errors.Is(err, e.Kind) true.
func (e *Error) Is(target error) bool { return target == e.Kind }

// ReasonOf returns the Reason of the *Error in err's chain, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Message errors. The C software NAA answers every failure with code 1;
// malformed messages map to it as well.
var (
	errShort          = &Error{ErrMalformed, "short", "short message", CodeNoMemory}
	errLength         = &Error{ErrMalformed, "length", "message length does not match its count", CodeNoMemory}
	errBadType        = &Error{ErrMalformed, "type", "unexpected message type", CodeNoMemory}
	errPadding        = &Error{ErrMalformed, "padding", "padding not zero", CodeNoMemory}
	errNoRegions      = &Error{ErrMalformed, "no-regions", "no regions", CodeNoMemory}
	errZeroCode       = &Error{ErrMalformed, "zero-code", "error message with code 0", CodeNoMemory}
	errFlags          = &Error{ErrMalformed, "flags", "invalid region flags", CodeNoMemory}
	errTooManyRegions = &Error{ErrRefused, "too-many", "too many regions", CodeTooManyRegions}
	errZeroSize       = &Error{ErrRefused, "zero-size", "region of size 0", CodeInvalidAddress}
	errRegionTooLarge = &Error{ErrRefused, "region-size", "region too large", CodeNoMemory}
	errTotalTooLarge  = &Error{ErrRefused, "total-size", "regions exceed the NAA's memory", CodeNoMemory}
	errOutOfMemory    = &Error{ErrRefused, "memory", "region ends past the NAA's memory", CodeNoMemory}
	errInvalidAddress = &Error{ErrRefused, "address", "requested address out of bounds", CodeInvalidAddress}
	errUnaligned      = &Error{ErrRefused, "unaligned", "requested address not page-aligned", CodeInvalidAddress}
	errOverlap        = &Error{ErrRefused, "overlap", "regions overlap", CodeInvalidAddress}
	errWrap           = &Error{ErrRefused, "wrap", "region wraps the address space", CodeInvalidAddress}
	errCountMismatch  = &Error{ErrProtocol, "count", "advert count does not match the request", CodeTooManyRegions}
	errRegionTooSmall = &Error{ErrProtocol, "too-small", "advertised region smaller than requested", CodeNoMemory}
)

// Immediate and state errors.
var (
	errFnCode     = &Error{ErrMalformed, "fn-code", "function code not in 1..127", 0}
	errNoStart    = &Error{ErrMalformed, "no-start", "host immediate without the start-RPC bit", 0}
	errHostAbort  = &Error{ErrAborted, "abort", "host reported an error (immediate 0)", 0}
	errOutOfOrder = &Error{ErrProtocol, "order", "event not allowed in this state", 0}
)
