package wire

import "errors"

// Error categories, matched with errors.Is.
var (
	// ErrInvalid: a connection or slab setting outside what the FPGA
	// accepts.
	ErrInvalid = errors.New("fpga: invalid setting")
	// ErrFrame: a receive completion that is not a good frame; the Action
	// Checker.Check returns with it says what to do with the slot.
	ErrFrame = errors.New("fpga: bad receive completion")
)

// Error is the type of this package's errors: a category (Kind), a stable
// Reason token and the text. The values are fixed, so returning one
// allocates nothing.
type Error struct {
	Kind   error  // ErrInvalid or ErrFrame
	Reason string // see the package doc
	Detail string
}

func (e *Error) Error() string { return "fpga: " + e.Detail }

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

var (
	errQPN          = &Error{ErrInvalid, "qpn", "QPN not a non-zero 24-bit value"}
	errPSN          = &Error{ErrInvalid, "psn", "PSN wider than 24 bits"}
	errPMTU         = &Error{ErrInvalid, "pmtu", "path MTU code not 1..5"}
	errRNRTimer     = &Error{ErrInvalid, "rnr-timer", "RNR timer code not 0..31"}
	errRetry        = &Error{ErrInvalid, "retry", "retry count wider than 3 bits"}
	errConfig       = &Error{ErrInvalid, "config", "max payload and queue depth must be non-zero"}
	errSlabTooLarge = &Error{ErrInvalid, "slab-size", "slab of 4 GiB or more"}

	// Frame checks, in the order Server::processCompletion applies them.
	errSlotRange  = &Error{ErrFrame, "slot", "work request id outside the receive slots"}
	errFlushed    = &Error{ErrFrame, "flushed", "receive flushed: QP in error"}
	errStatus     = &Error{ErrFrame, "status", "completion with error status"}
	errOpcode     = &Error{ErrFrame, "opcode", "unexpected completion opcode"}
	errZeroLength = &Error{ErrFrame, "zero-length", "frame of 0 bytes"}
	errTooLong    = &Error{ErrFrame, "too-long", "frame longer than max payload"}
)

// Kind is what a receive completion was.
type Kind uint8

const (
	KindSendImm  Kind = iota + 1 // SEND WITH IMM (gen 2: IBV_WC_RECV + IBV_WC_WITH_IMM)
	KindWriteImm                 // RDMA WRITE WITH IMM (gen 1: IBV_WC_RECV_RDMA_WITH_IMM)
	KindSend                     // SEND without immediate
	KindOther
)

// Status is a receive completion's status, reduced to what Rogue tells apart.
type Status uint8

const (
	StatusOK Status = iota
	StatusFlush
	StatusError
)

// Completion is one receive completion as the checks need it.
type Completion struct {
	Slot    uint64 // wr_id: the receive slot
	Status  Status
	Kind    Kind
	ByteLen uint32
	Imm     Imm // host order
}

// Action is what the host does with a completion.
type Action uint8

const (
	Deliver Action = iota // hand the slot's bytes downstream; re-post when released
	Repost                // give the slot back to the receive queue at once
	Drop                  // ignore (slot id unusable)
	Stop                  // QP in error: stop polling, re-post nothing
)

// Frame is a delivered frame.
type Frame struct {
	Slot    uint32
	Offset  uint64 // slab offset of the payload
	Len     uint32
	Channel uint8
	Counter uint32
}

// Checker applies Rogue's frame checks for a server with numSlots receive
// slots of maxPayload bytes. AcceptWrite also takes the gen-1 RDMA WRITE WITH
// IMM form (Rogue's current host refuses it; a host serving both FPGA
// generations accepts it, payload at slot·maxPayload as gen 1 assumed).
type Checker struct {
	NumSlots    uint32
	MaxPayload  uint32
	AcceptWrite bool
}

// Check classifies one completion: out-of-range slot → Drop; flush → Stop;
// other error status → Repost; opcode other than SEND WITH IMM (and, with
// AcceptWrite, WRITE WITH IMM) → Repost; length 0 or above MaxPayload →
// Repost; otherwise Deliver with channel = imm & 0xFF.
func (c *Checker) Check(wc Completion) (Frame, Action, error) {
	if wc.Slot >= uint64(c.NumSlots) {
		return Frame{}, Drop, errSlotRange
	}
	switch wc.Status {
	case StatusOK:
	case StatusFlush:
		return Frame{}, Stop, errFlushed
	default:
		return Frame{}, Repost, errStatus
	}
	if wc.Kind != KindSendImm && !(c.AcceptWrite && wc.Kind == KindWriteImm) {
		return Frame{}, Repost, errOpcode
	}
	if wc.ByteLen == 0 {
		return Frame{}, Repost, errZeroLength
	}
	if wc.ByteLen > c.MaxPayload {
		return Frame{}, Repost, errTooLong
	}
	s := uint32(wc.Slot)
	return Frame{Slot: s, Offset: SlotOffset(s, c.MaxPayload), Len: wc.ByteLen,
		Channel: wc.Imm.Channel(), Counter: wc.Imm.Counter()}, Deliver, nil
}

// Sequence watches the FPGA's counter for gaps (diagnostic: the counter
// advances once per frame and wraps at the FPGA's AddrWrapCount, at most
// 2^24).
type Sequence struct {
	Wrap    uint32 // AddrWrapCount; 0 means 1<<24
	next    uint32
	started bool
	Gaps    uint64 // frames the counter says were skipped
}

// Observe records counter c and returns how many values were skipped
// before it (0 when in order).
func (q *Sequence) Observe(c uint32) uint32 {
	w := q.Wrap
	if w == 0 || w > 1<<24 {
		w = 1 << 24
	}
	c %= w
	var gap uint32
	if q.started && c != q.next {
		gap = (c + w - q.next) % w
		q.Gaps += uint64(gap)
	}
	q.started = true
	q.next = (c + 1) % w
	return gap
}
