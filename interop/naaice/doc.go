// Package naaice tests package naaice against the public NAAICE C library
// on real Soft-RoCE: the library's software NAA (naaice_server) with
// goroce hosts, and the library's hosts (a verifying client written with
// its own AP1 calls in cclient/, its example client and its AP2 example
// client) with goroce's software NAA, over AF_XDP on the lab's host side.
//
// The C library is built by its build script from the snapshot found in
// GOROCE_NAAICE_DIR (default: shared/naaice in a folder above the repository;
// the tests skip, naming it, when it is absent), cached under
// RXE_LAB_CACHE/naaice, and copied into the guest's share. The build
// script installs cmake, make, gcc, libc6-dev, libibverbs-dev,
// librdmacm-dev and binutils when they are missing.
//
// The C software NAA re-arms its completion channel with completions
// still queued, so a host write that arrives while it handles its own
// previous completion is never noticed; goroce hosts therefore pause about
// a second before each RPC against it, and a fresh server runs per case
// (it leaks a connection slot when a host leaves between RPCs). The lab
// runs at MTU 1500 (path MTU 1024) so that every frame fits an AF_XDP
// chunk.
package naaice
