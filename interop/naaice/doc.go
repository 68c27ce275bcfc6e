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
// The C software NAA loses wake-ups (naaice_swnaa_poll_cq_nonblocking):
// it polls until the CQ is empty or its state changes, leaving the rest
// queued, then re-arms with ibv_req_notify_cq without polling again. A
// completion that lands between its last empty poll and the re-arm (its
// MRSP SEND's or write-back's, when the host's ACK comes just then) raises
// no event; the NAA wakes only for the host's next WRITE_WITH_IMM, takes
// the missed completion, sees its state change, and leaves the RPC's own
// completion queued for ever. Goroce's resends play no part: a duplicate
// request makes rxe repeat its ACK and no completion, and a new QP sends no
// probe before its first round-trip sample, so none before the MRSP is
// done. goroce hosts pause about a second before each RPC against it
// (which covers a host write that comes while the NAA still waits for its
// previous completion), a case stalled as above is rerun on a fresh
// server, and a fresh server runs per case (it leaks a connection slot
// when a host leaves between RPCs). The lab
// runs at MTU 1500 (path MTU 1024) so that every frame fits an AF_XDP
// chunk.
package naaice
