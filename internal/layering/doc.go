// Package layering holds the tests that keep goroce's packages in layers:
// imports run only downward, ib ← qp ← roce ← cm ← protocols (rsocket,
// naaice, fpga, cuobj, cm/rping) ← cmd, with the links beside the device
// core rather than under it (roce runs over the link.Link it is given;
// package netdev opens AF_XDP or UDP links by interface name), the core
// builds on systems other than Linux, and so does every package but the
// Linux-only ones listed in linuxOnly (AF_XDP, eBPF, the qemu lab):
// GOOS=darwin and GOOS=windows go build, GOOS=darwin go vet.
//
// The layer table is in layering_test.go. A new package takes the layer of
// the longest path prefix listed there; a new top-level directory, and a
// new package under internal/, must be added to it.
package layering
