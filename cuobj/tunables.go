package cuobj

import (
	"fmt"
	"syscall"
	"time"

	"github.com/goroce/goroce/roce"
)

// Proto is the RDMA descriptor protocol (cuObjProto_t).
type Proto uint16

// Protocols.
const (
	// ProtoDC is CUOBJ_PROTO_RDMA_DC_V1: the dynamically connected
	// transport (see the package documentation).
	ProtoDC Proto = 1001
	// ProtoRC is CUOBJ_PROTO_RDMA_EXT_RC_V1: reliable connections set up
	// with rdma_cm (see the package documentation).
	ProtoRC Proto = 1002
)

func (p Proto) String() string {
	switch p {
	case ProtoDC:
		return "CUOBJ_PROTO_RDMA_DC_V1"
	case ProtoRC:
		return "CUOBJ_PROTO_RDMA_EXT_RC_V1"
	}
	return fmt.Sprintf("cuobj protocol %d", uint16(p))
}

// OpType is the operation a token is for (cuObjOpType_t).
type OpType int

// Operation types.
const (
	OpGet     OpType = 0
	OpPut     OpType = 1
	OpInvalid OpType = 9999
)

func (o OpType) String() string {
	switch o {
	case OpGet:
		return "GET"
	case OpPut:
		return "PUT"
	}
	return fmt.Sprintf("op %d", int(o))
}

// DelayMode is the polling behaviour of synchronous requests
// (cuObjDelayMode_t).
type DelayMode int

// Delay modes.
const (
	DelayNone     DelayMode = 0
	DelayBatch    DelayMode = 1
	DelayEntry    DelayMode = 2
	DelayAdaptive DelayMode = 3
	DelayInvalid  DelayMode = 4
)

// Limits of the server.
const (
	// MaxOpSize is the largest HandleGetObject/HandlePutObject (1 GiB).
	MaxOpSize = 1 << 30
	// MaxSGEntries bounds a scatter-gather registration.
	MaxSGEntries = 10
	// MaxPollEvents caps one Poll.
	MaxPollEvents = 16
	// InvalidChannelID is what AllocateChannel returns when none is free.
	InvalidChannelID = 0xFFFF
	// maxChannels: channel IDs are uint16 and 0xFFFF is INVALID_CHANNEL_ID.
	maxChannels = InvalidChannelID
)

// Tunables are the server's RDMA parameters (cuObjRDMATunableParam). Start
// from DefaultTunables; NewServer applies the caps documented per field.
type Tunables struct {
	// NumDCIs is the number of channels (default 128, 1 … 65535): with
	// DC each channel is one DCI; with RC each channel has its own
	// connection to each client it serves.
	NumDCIs int
	// CQDepth is each channel's completion queue depth and the most
	// requests outstanding on a channel (default 640, 1 … 32767).
	CQDepth uint
	// DCKey is the DC access key the DCIs send (default 0xffeeddcc); it
	// must equal the clients' rdma_dc_key. Used by DC only.
	DCKey uint64
	// IbvPollMaxCompEvent is not used (as in the C library).
	IbvPollMaxCompEvent int
	// ServiceLevel (default 0): RoCE frames carry no service level (the
	// traffic class is their priority); kept for the C API's shape.
	ServiceLevel int
	// Timeout is the local ACK timeout exponent (4.096 µs × 2^Timeout,
	// default 16, at most 31).
	Timeout uint8
	// HopLimit (default 4) is the hop limit of DC address handles; RC
	// connections use rdma_cm's path.
	HopLimit uint
	// PKeyIndex (default 0).
	PKeyIndex int
	// MaxWR is not used (as in the C library).
	MaxWR int
	// MaxSGE is the most scatter-gather entries per request (default 10,
	// capped at the device's 32); a request on a buffer with more entries
	// fails with EIO.
	MaxSGE int
	// DelayInterval is the polling delay of synchronous requests
	// (default 5000 ns). Kept for the C API's shape: goroce's completion
	// queues wake the waiting goroutine when a completion arrives, so
	// neither it nor DelayMode changes when a request returns.
	DelayInterval uint32
	// DelayMode (default DelayBatch; out-of-range values fall back to it).
	DelayMode DelayMode
	// QPResetOnFailure (default true): after a failed completion the
	// channel's connection to that client (RC: closed and dialled again
	// by the next request) or the channel's DCI (DC: reset by the next
	// request) is reset. Without it the QP stays in the error state and
	// every later request on it (RC: to that client on the channel; DC:
	// on the channel) fails with EIO.
	QPResetOnFailure bool
	// RetryCount is the transport retry count (3 bits; default 7, larger
	// values are capped to 7). rdma_cm reads 0 as "default": RC uses 7.
	RetryCount uint8
	// TrafficClass (default 96); values of 256 and more are refused (and
	// logged) and the default stays.
	TrafficClass uint
	// MaxRdAtomic is the number of RDMA READs in flight per connection:
	// 0 means the device's maximum (128); larger values are capped to it.
	MaxRdAtomic int

	// The admission limits below are goroce's own (the C API has none):
	// they keep a client that names nonexistent peers, or many of them
	// from one address, from holding what legitimate clients need.

	// ConnectTimeout bounds reaching a client: the rdma_cm connection of
	// RC, the address resolution of DC (default 5 s). A token naming a
	// client that does not answer fails with ETIMEDOUT after it, and a
	// channel is held no longer than that.
	ConnectTimeout time.Duration
	// MaxChannelsPerClient caps the channels AllocateChannelFor gives one
	// client address at once (default a quarter of NumDCIs, at least 1);
	// past it the caller gets ErrOverloaded.
	MaxChannelsPerClient int
	// MaxHeldBytes bounds the memory the server's callers hold for RDMA
	// through Reserve (default 1 GiB); past it Reserve fails with
	// ErrOverloaded.
	MaxHeldBytes int64
}

// DefaultTunables returns the defaults of cuObjRDMATunable.
func DefaultTunables() Tunables {
	return Tunables{NumDCIs: 128, CQDepth: 640, DCKey: 0xffeeddcc, Timeout: 16, HopLimit: 4,
		MaxSGE: 10, DelayInterval: 5000, DelayMode: DelayBatch, QPResetOnFailure: true,
		RetryCount: 7, TrafficClass: 96, ConnectTimeout: DefaultConnectTimeout,
		MaxChannelsPerClient: 32, MaxHeldBytes: DefaultMaxHeldBytes}
}

// Defaults of the admission limits.
const (
	DefaultConnectTimeout = 5 * time.Second
	DefaultMaxHeldBytes   = 1 << 30
)

// normalize applies the caps and returns what it changed (for the log) or
// an error for values no server can start with.
func (t Tunables) normalize() (Tunables, []string, error) {
	var notes []string
	bad := func(f string, args ...any) (Tunables, []string, error) {
		return t, notes, newErr("NewServer", syscall.EINVAL, ErrInvalid, f, args...)
	}
	if t.NumDCIs <= 0 || t.NumDCIs > maxChannels {
		return bad("num_dcis %d outside 1 … %d", t.NumDCIs, maxChannels)
	}
	if t.CQDepth == 0 || t.CQDepth > roce.MaxCQE {
		return bad("cq_depth %d outside 1 … %d", t.CQDepth, roce.MaxCQE)
	}
	if t.Timeout > 31 {
		return bad("timeout %d is not a 5-bit value", t.Timeout)
	}
	if t.RetryCount > 7 {
		notes = append(notes, fmt.Sprintf("retry_cnt %d capped to 7", t.RetryCount))
		t.RetryCount = 7
	}
	if t.TrafficClass >= 256 {
		notes = append(notes, fmt.Sprintf("traffic_class %d invalid, using 96", t.TrafficClass))
		t.TrafficClass = 96
	}
	if t.HopLimit > 255 {
		notes = append(notes, fmt.Sprintf("hop_limit %d capped to 255", t.HopLimit))
		t.HopLimit = 255
	}
	if t.MaxSGE <= 0 {
		notes = append(notes, fmt.Sprintf("max_sge %d invalid, using 10", t.MaxSGE))
		t.MaxSGE = 10
	}
	if t.MaxSGE > roce.MaxSGE {
		notes = append(notes, fmt.Sprintf("max_sge %d capped to %d", t.MaxSGE, roce.MaxSGE))
		t.MaxSGE = roce.MaxSGE
	}
	if t.MaxRdAtomic <= 0 {
		t.MaxRdAtomic = roce.MaxRdAtomic
	} else if t.MaxRdAtomic > roce.MaxRdAtomic {
		notes = append(notes, fmt.Sprintf("max_rd_atomic %d capped to %d", t.MaxRdAtomic, roce.MaxRdAtomic))
		t.MaxRdAtomic = roce.MaxRdAtomic
	}
	if t.ConnectTimeout <= 0 {
		t.ConnectTimeout = DefaultConnectTimeout
	}
	if t.MaxChannelsPerClient <= 0 || t.MaxChannelsPerClient > t.NumDCIs {
		// A zero value (a Tunables built by hand) takes the default share.
		t.MaxChannelsPerClient = max(1, t.NumDCIs/4)
	}
	if t.MaxHeldBytes <= 0 {
		t.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if t.DelayMode < DelayNone || t.DelayMode >= DelayInvalid {
		notes = append(notes, fmt.Sprintf("delay_mode %d invalid, using DelayBatch", t.DelayMode))
		t.DelayMode = DelayBatch
	}
	return t, notes, nil
}
