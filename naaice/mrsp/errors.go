package mrsp

// ErrCode is an MRSP error code (byte 1 of an ERR message).
type ErrCode uint8

const (
	CodeNoMemory       ErrCode = 0x01 // not enough memory (address + size exceeds the memory boundary)
	CodeInvalidAddress ErrCode = 0x02 // invalid address (out of bounds)
	CodeTooManyRegions ErrCode = 0x03 // too many regions requested
)

// Error is the type of every error this package returns; the values are
// fixed sentinels (compare with == or errors.Is). Code is the MRSP error
// code an NAA answers with when an AAR fails this check.
type Error struct {
	s    string
	Code ErrCode
}

func (e *Error) Error() string { return "naaice: " + e.s }

// Message errors. The C software NAA answers every failure with code 1;
// malformed messages map to it as well.
var (
	ErrShort          = &Error{"short message", CodeNoMemory}
	ErrLength         = &Error{"message length does not match its count", CodeNoMemory}
	ErrBadType        = &Error{"unexpected message type", CodeNoMemory}
	ErrPadding        = &Error{"padding not zero", CodeNoMemory}
	ErrNoRegions      = &Error{"no regions", CodeNoMemory}
	ErrZeroCode       = &Error{"error message with code 0", CodeNoMemory}
	ErrFlags          = &Error{"invalid region flags", CodeNoMemory}
	ErrTooManyRegions = &Error{"too many regions", CodeTooManyRegions}
	ErrZeroSize       = &Error{"region of size 0", CodeInvalidAddress}
	ErrRegionTooLarge = &Error{"region too large", CodeNoMemory}
	ErrTotalTooLarge  = &Error{"regions exceed the NAA's memory", CodeNoMemory}
	ErrOutOfMemory    = &Error{"region ends past the NAA's memory", CodeNoMemory}
	ErrInvalidAddress = &Error{"requested address out of bounds", CodeInvalidAddress}
	ErrUnaligned      = &Error{"requested address not page-aligned", CodeInvalidAddress}
	ErrOverlap        = &Error{"regions overlap", CodeInvalidAddress}
	ErrAddrOverflow   = &Error{"region wraps the address space", CodeInvalidAddress}
	ErrCountMismatch  = &Error{"advert count does not match the request", CodeTooManyRegions}
	ErrRegionTooSmall = &Error{"advertised region smaller than requested", CodeNoMemory}
)

// Immediate errors.
var (
	ErrFnCode    = &Error{"function code not in 1..127", 0}
	ErrNoStart   = &Error{"host immediate without the start-RPC bit", 0}
	ErrHostAbort = &Error{"host reported an error (immediate 0)", 0}
)
