// Package errtimeout makes the timeout sentinels of every layer net.Error
// timeouts: each package keeps its own sentinel, with its own message, and a
// caller that handles timeouts generically (errors.As to net.Error, then
// Timeout()) recognises all of them, as it does os.ErrDeadlineExceeded and
// context.DeadlineExceeded. Unlike the closed errors of package errclosed,
// two sentinels do not match each other: a CM timeout is not a cuObject one.
package errtimeout

// New returns a timeout error with the given message.
func New(msg string) error { return &timeoutError{msg} }

type timeoutError struct{ msg string }

func (e *timeoutError) Error() string { return e.msg }

// Timeout reports true: the error is a timeout (net.Error).
func (e *timeoutError) Timeout() bool { return true }

// Temporary reports true, as os.ErrDeadlineExceeded does: the operation may
// succeed if tried again.
func (e *timeoutError) Temporary() bool { return true }
