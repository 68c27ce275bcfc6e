package cuobj

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/goroce/goroce/internal/errclosed"
	"github.com/goroce/goroce/internal/errtimeout"
	"github.com/goroce/goroce/roce"
)

// Reasons behind the errno values. Every *Error wraps one of these (or a
// *TokenError, or an error of a lower layer) beside its errno, so a caller
// can match either the errno the seed documents or the precise reason.
var (
	// ErrInvalid is an invalid argument detected before any I/O (the
	// CU_OBJ_FAIL of the C API).
	ErrInvalid = errors.New("cuobj: invalid argument")
	// ErrNoDevice: the RDMA device is closed or the endpoint never started.
	ErrNoDevice = errors.New("cuobj: RDMA device not available")
	// ErrChannel: the channel is out of range, not allocated, or in use by
	// another goroutine.
	ErrChannel = errors.New("cuobj: invalid, unallocated or busy channel")
	// ErrNoChannel: every channel is allocated.
	ErrNoChannel = errors.New("cuobj: no free channel")
	// ErrRange: the request does not fit the local buffer or the remote
	// region of the token, or exceeds MaxOpSize.
	ErrRange = errors.New("cuobj: request outside the registered range")
	// ErrCompletion: the RDMA operation completed with an error status.
	ErrCompletion = errors.New("cuobj: RDMA operation failed")
	// ErrSubmit: the work request could not be posted or the client could
	// not be reached.
	ErrSubmit = errors.New("cuobj: RDMA submission failed")
	// ErrUnsupported: a memory type or protocol this build cannot serve
	// (CUDA memory on a host without GPUs; DC until it exists in goroce).
	ErrUnsupported = errors.New("cuobj: not supported")
	// ErrNotRegistered: the memory was not registered with this client or
	// server (or is no longer).
	ErrNotRegistered = errors.New("cuobj: memory not registered")
	// ErrNoCallback: the Ops lack the callback the operation needs.
	ErrNoCallback = errors.New("cuobj: no callback for the operation")
	// ErrOverloaded is matched by every *OverloadError: an admission
	// limit of the server refused the request; it may succeed later.
	ErrOverloaded = errors.New("cuobj: server overloaded")
	// ErrConnectTimeout: the client named by a token did not answer
	// within Tunables.ConnectTimeout.
	ErrConnectTimeout = errtimeout.New("cuobj: client did not answer in time")
	// ErrClosed: the client or server is closed.
	ErrClosed = errclosed.New("cuobj: closed")
)

// OverloadError says which admission limit refused a request and when to
// try again (the HTTP front end's Retry-After).
type OverloadError struct {
	Limit      string // "channels per client", "channels", "held bytes"
	RetryAfter time.Duration
}

func (e *OverloadError) Error() string {
	return fmt.Sprintf("cuobj: server overloaded: %s (retry after %v)", e.Limit, e.RetryAfter)
}

// Is makes errors.Is(err, ErrOverloaded) true.
func (e *OverloadError) Is(target error) bool { return target == ErrOverloaded }

// Error is the error of a server or client operation: the errno value the
// seed documents (errors.Is(err, syscall.EIO)), the reason (errors.Is(err,
// ErrRange), ...), and for a failed completion its status.
type Error struct {
	Op     string // "HandleGetObject", "Poll", "Register", ...
	Errno  syscall.Errno
	Status roce.WCStatus // completion status; meaningful when HasStatus
	// HasStatus says Status was reported by a completion (the seed's
	// status output is "not populated for pre-submission validation
	// errors").
	HasStatus bool
	Err       error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cuobj: %s: %v", e.Op, e.Errno)
	if e.HasStatus {
		s += fmt.Sprintf(" (%v)", e.Status)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the errno and the reason.
func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Errno}
	}
	return []error{e.Errno, e.Err}
}

func newErr(op string, errno syscall.Errno, reason error, format string, args ...any) *Error {
	if format != "" {
		reason = fmt.Errorf("%w: "+format, append([]any{reason}, args...)...)
	}
	return &Error{Op: op, Errno: errno, Err: reason}
}

// CompletionStatus returns the completion status an error carries
// (IBV_WC_* names through roce.WCStatus.String), and whether it has one.
func CompletionStatus(err error) (roce.WCStatus, bool) {
	var e *Error
	if errors.As(err, &e) && e.HasStatus {
		return e.Status, true
	}
	return roce.WCSuccess, false
}

// Errno returns the errno value of err (0 if it carries none): what the C
// API would return negated.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// ibvStatusNames are the enum ibv_wc_status identifiers.
var ibvStatusNames = [...]string{
	"IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_EEC_OP_ERR",
	"IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR", "IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR",
	"IBV_WC_LOC_ACCESS_ERR", "IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
	"IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_LOC_RDD_VIOL_ERR",
	"IBV_WC_REM_INV_RD_REQ_ERR", "IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR",
	"IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR", "IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR",
	"IBV_WC_TM_ERR", "IBV_WC_TM_RNDV_INCOMPLETE",
}

// StatusName returns the ibv_wc_status identifier of s ("IBV_WC_REM_ACCESS_ERR");
// s.String() is the ibv_wc_status_str text.
func StatusName(s roce.WCStatus) string {
	if int(s) < len(ibvStatusNames) {
		return ibvStatusNames[s]
	}
	return fmt.Sprintf("IBV_WC_STATUS_%d", int(s))
}
