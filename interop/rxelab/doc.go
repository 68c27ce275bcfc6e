// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package rxelab gives tests real Soft-RoCE (rdma_rxe) peers: small Linux
// guests under qemu (TCG, so no /dev/kvm is needed), each running rdma_rxe and
// the rdma-core tools, attached to a bridge in a private network namespace.
// A veth joins that bridge to a second namespace, the peer netns, where the
// code under test plays the host side on interface rxeh0 (10.77.0.1).
//
// It drives the lab CLI in interop/lab (rxe-lab); see interop/README.md.
//
// A test binary brings the lab up at most once, on the first [Get], and tears
// it down when [Main] returns, when it is interrupted, and shortly before the
// -test.timeout alarm would kill the process. Names are unique per process
// (netns goroce-PID, guests gPID-a, gPID-b, ...), so a developer's own lab
// and concurrent test binaries do not collide; labs left by processes that
// died are removed the next time a lab starts. Before the lab is handed out,
// every guest has resolved the peer's addresses ([Guest.ResolvePeer]), so no
// test's first exchange waits on ARP or neighbour discovery.
//
// Usage:
//
//	func TestMain(m *testing.M) {
//		os.Exit(rxelab.Main(m, rxelab.Config{Guests: 1}))
//	}
//
//	func TestX(t *testing.T) {
//		lab := rxelab.Get(t) // skips, naming the missing capability
//		out, errOut, code, err := lab.Guests[0].Exec(ctx, "ibv_devinfo")
//		err = lab.InPeerNS(func() error { /* open sockets on rxeh0 */ })
//	}
package rxelab
