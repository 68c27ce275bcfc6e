package wire

import "errors"

// Error categories: every error this package returns matches exactly one of
// them with errors.Is, except ErrClosed, which is returned as is.
var (
	// ErrMalformed: a message or structure that breaks the format (short,
	// wrong version, reserved bits or bytes set, zero or wrapping buffers,
	// overlapping adverts, reserved ops, bad lengths or headers).
	ErrMalformed = errors.New("rsocket: malformed message")
	// ErrProtocol: a well-formed message that breaks the flow rules (beyond
	// the granted credits, past or across the advertised buffers, out of
	// order, into a busy or missing slot, or consuming more than arrived).
	ErrProtocol = errors.New("rsocket: protocol violation")
	// ErrBlocked: local flow control does not allow the next write or
	// control message yet; retry after a completion or a credit.
	ErrBlocked = errors.New("rsocket: blocked")
	// ErrInvalid: the caller passed a configuration or argument outside
	// what librdmacm allows.
	ErrInvalid = errors.New("rsocket: invalid argument")
	// ErrClosed: data or a CTRL arriving after the peer disconnected.
	ErrClosed = errors.New("rsocket: message after disconnect")
)

// Error is the type of every error this package returns apart from
// ErrClosed: a category (Kind) and the detail. The values are fixed, so
// returning one allocates nothing.
type Error struct {
	Kind   error  // ErrMalformed, ErrProtocol, ErrBlocked or ErrInvalid
	Reason string // a short stable token naming the rule broken; see the package doc
	Detail string // human-readable text
}

func (e *Error) Error() string { return "rsocket: " + e.Detail }

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

func malformed(reason, detail string) *Error { return &Error{ErrMalformed, reason, detail} }
func protocol(reason, detail string) *Error  { return &Error{ErrProtocol, reason, detail} }
func blocked(reason, detail string) *Error   { return &Error{ErrBlocked, reason, detail} }
func invalid(reason, detail string) *Error   { return &Error{ErrInvalid, reason, detail} }

// Malformed input.
var (
	errShort         = malformed("short", "short buffer")
	errVersion       = malformed("version", "conn data version not 1")
	errReservedFlags = malformed("reserved-flags", "reserved conn data flags set")
	errReservedBytes = malformed("reserved-bytes", "reserved conn data bytes not zero")
	errSGLLength     = malformed("sgl-length", "target SGL length is not 2")
	errZeroLength    = malformed("zero-length", "zero-length buffer")
	errWrap          = malformed("wrap", "buffer wraps the address space")
	errOverlap       = malformed("overlap", "advertised buffers overlap")
	errReservedOp    = malformed("reserved-op", "reserved immediate op")
	errBadCtrl       = malformed("ctrl", "unknown control value")
	errZeroData      = malformed("zero-data", "data message of 0 bytes")
	errIOMapReserved = malformed("iomap-reserved", "iomap immediate reserved bits set")
	errLength        = malformed("length", "payload length does not match the message")
	errHeader        = malformed("header", "bad datagram header")
)

// Flow-rule violations by the peer (or by the caller of Consume).
var (
	errNoCredit    = protocol("credit", "message beyond granted credits")
	errPastBuffer  = protocol("past-buffer", "write past advertised buffer")
	errOutOfOrder  = protocol("order", "write not at the ring's fill position")
	errCrossesSGE  = protocol("crosses-sge", "write crosses an advertised buffer boundary")
	errSlotBusy    = protocol("slot-busy", "target SGL slot still in use")
	errBadSlot     = protocol("slot", "index out of range")
	errOverConsume = protocol("over-consume", "consume beyond received data")
)

// Reasons the sender cannot post the next write; the first four mirror the
// terms of rs_can_send.
var (
	errNoSendQueue  = blocked("send-queue", "blocked: no send queue slot")
	errNoSendBuffer = blocked("send-buffer", "blocked: send buffer below RS_SNDLOWAT")
	errNoCredits    = blocked("credits", "blocked: no send credits")
	errNoTarget     = blocked("target", "blocked: no target buffer advertised")
	errNoCtrlSlot   = blocked("ctrl-slot", "blocked: no control slot")
)

// Caller errors.
var (
	errBadConfig  = invalid("config", "bad configuration")
	errZeroWrite  = invalid("zero-data", "data message of 0 bytes")
	errIOMapIndex = invalid("slot", "index out of range")
	errCtrlValue  = invalid("ctrl", "unknown control value")
)
