// Package linkerr holds the frame errors of package link, so that link and
// the link implementations return the same fixed values while link's API
// shows only the three categories, the Error type and ReasonOf.
package linkerr

import "errors"

// Categories, re-exported by package link.
var (
	ErrMalformed = errors.New("link: malformed frame")
	ErrRefused   = errors.New("link: frame not allowed on this link")
	ErrTooLarge  = errors.New("link: frame exceeds the link MTU")
)

// Error is link.Error: a category (Kind), a stable Reason token and the
// text. The values below are fixed, so returning one allocates nothing.
type Error struct {
	Kind   error  // ErrMalformed or ErrRefused
	Reason string // truncated, not-ip, not-udp, header; family, source-addr, source-port
	Detail string
}

func (e *Error) Error() string { return "link: " + e.Detail }

// Is makes errors.Is(err, e.Kind) true.
func (e *Error) Is(target error) bool { return target == e.Kind }

var (
	Truncated  = &Error{ErrMalformed, "truncated", "frame truncated"}
	NotIP      = &Error{ErrMalformed, "not-ip", "not an IPv4 or IPv6 frame"}
	NotUDP     = &Error{ErrMalformed, "not-udp", "not a UDP datagram"}
	Header     = &Error{ErrMalformed, "header", "malformed IP or UDP header"}
	Family     = &Error{ErrRefused, "family", "IP version does not match the link's address family"}
	SourceAddr = &Error{ErrRefused, "source-addr", "frame source address is not the link's"}
	SourcePort = &Error{ErrRefused, "source-port", "frame UDP source port is not the link's fixed source port"}
)
