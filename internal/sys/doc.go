// Package sys holds the few system-call wrappers that golang.org/x/sys/unix
// lacks: the batched datagram calls sendmmsg(2) and recvmmsg(2), and an
// allocation-free walk over received control messages.
package sys
