// Package pcaptest gives the tests that replay the shared rxe lab captures
// one way to find them and one classic-pcap reader.
//
// It depends on the standard library only, so tests of the stdlib-only
// packages (ib) can use it as well.
package pcaptest
