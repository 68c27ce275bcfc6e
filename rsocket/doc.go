// Package rsocket will implement librdmacm's rsockets over goroce: the
// byte-stream (SOCK_STREAM) and datagram (SOCK_DGRAM) socket protocol both
// of whose ends must speak it, so that Go programs can talk to rstream,
// riostream, rcopy and udpong and to programs that use rsocket(7) directly.
// On the wire that is an rdma_cm connection in the RDMA_PS_TCP port space
// whose REQ and REP carry each side's 40-byte connection data (receive
// buffer, target SGL, credits), then RDMA WRITE WITH IMMEDIATE into the
// peer's advertised buffers with the operation and length in the immediate.
//
// It is not implemented yet: this package holds no API. It sits above
// package cm, which gives it the connection, and below cmd; it imports
// nothing above cm.
package rsocket
