// Package errclosed makes the "closed" errors of every layer one error
// under errors.Is: each package keeps its own sentinel, with its own
// message, and all of them match each other and net.ErrClosed. A caller
// holding an error from any layer (a link read, a QP post, a CM accept)
// tests it against whichever ErrClosed it knows, or against net.ErrClosed
// as it would for a socket.
package errclosed

import "net"

// New returns a closed error with the given message.
func New(msg string) error { return &closedError{msg} }

type closedError struct{ msg string }

func (e *closedError) Error() string { return e.msg }

// Is reports whether target is net.ErrClosed or any package's closed error.
func (e *closedError) Is(target error) bool {
	if target == net.ErrClosed {
		return true
	}
	_, ok := target.(*closedError)
	return ok
}
