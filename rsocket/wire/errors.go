package wire

// Error is the type of every error this package returns. The values are
// fixed sentinels, so returning one allocates nothing; compare with == or
// errors.Is.
type Error struct{ s string }

func (e *Error) Error() string { return "rsocket: " + e.s }

// Parse errors.
var (
	// ErrShort: fewer bytes than the structure needs.
	ErrShort = &Error{"short buffer"}
	// ErrBadVersion: rs_conn_data.version is not 1 (librdmacm rejects the
	// request or fails the connect with ENOTSUP).
	ErrBadVersion = &Error{"conn data version not 1"}
	// ErrReservedFlags: flag bits other than NET and IOMAP are set.
	ErrReservedFlags = &Error{"reserved conn data flags set"}
	// ErrReservedNonZero: rs_conn_data.reserved[3] is not zero.
	ErrReservedNonZero = &Error{"reserved conn data bytes not zero"}
	// ErrSGLLength: the peer's target SGL does not have RS_SGL_SIZE entries.
	ErrSGLLength = &Error{"target SGL length is not 2"}
	// ErrZeroLength: an SGE or iomap entry of length 0 where data must go.
	ErrZeroLength = &Error{"zero-length buffer"}
	// ErrAddrOverflow: addr+length wraps past 2^64.
	ErrAddrOverflow = &Error{"buffer wraps the address space"}
	// ErrOverlap: two advertised buffers overlap.
	ErrOverlap = &Error{"advertised buffers overlap"}
	// ErrReservedOp: an immediate carries a reserved op (1, 3, 5) or
	// RS_OP_WRITE (2), which librdmacm never puts on the wire.
	ErrReservedOp = &Error{"reserved immediate op"}
	// ErrBadCtrl: RS_OP_CTRL with a value other than DISCONNECT, KEEPALIVE,
	// SHUTDOWN.
	ErrBadCtrl = &Error{"unknown control value"}
	// ErrZeroData: RS_OP_DATA announcing 0 bytes (rsend never sends one).
	ErrZeroData = &Error{"data message of 0 bytes"}
	// ErrIOMapReserved: RS_OP_IOMAP_SGL with bits 28:16 set.
	ErrIOMapReserved = &Error{"iomap immediate reserved bits set"}
)

// State-machine errors (a peer broke the protocol, or a caller misused the
// state machine).
var (
	// ErrNoCredit: a credit-consuming message arrived although every credit
	// granted to the peer was used.
	ErrNoCredit = &Error{"message beyond granted credits"}
	// ErrPastBuffer: a data write does not fit in the receive buffer space
	// advertised to the peer.
	ErrPastBuffer = &Error{"write past advertised buffer"}
	// ErrOutOfOrder: a data write does not start where the previous one
	// ended (the receive ring is filled strictly in order).
	ErrOutOfOrder = &Error{"write not at the ring's fill position"}
	// ErrCrossesSGE: a data write spans two advertised buffers.
	ErrCrossesSGE = &Error{"write crosses an advertised buffer boundary"}
	// ErrSlotBusy: the peer advertised a buffer into a target SGL slot whose
	// previous buffer is not used up.
	ErrSlotBusy = &Error{"target SGL slot still in use"}
	// ErrBadSlot: a target SGL or iomap index out of range.
	ErrBadSlot = &Error{"index out of range"}
	// ErrOverConsume: Consume was asked for more bytes than were received.
	ErrOverConsume = &Error{"consume beyond received data"}
	// ErrBadConfig: a Config value outside what librdmacm allows.
	ErrBadConfig = &Error{"bad configuration"}
)

// Reasons the sender cannot post the next write; they mirror the four terms
// of rs_can_send.
var (
	ErrNoSendQueue  = &Error{"blocked: no send queue slot"}
	ErrNoSendBuffer = &Error{"blocked: send buffer below RS_SNDLOWAT"}
	ErrNoCredits    = &Error{"blocked: no send credits"}
	ErrNoTarget     = &Error{"blocked: no target buffer advertised"}
	ErrNoCtrlSlot   = &Error{"blocked: no control slot"}
)
