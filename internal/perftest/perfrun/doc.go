// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package perfrun runs the RDMA benchmark tools' tests on a goroce device:
// rocectl's "pingpong" (ibv_rc_pingpong / ibv_ud_pingpong) and "perf"
// (perftest's ib_{send,write,read,atomic}_{bw,lat}) commands. Either end
// interoperates with the real tool at the other end, or with itself. The
// tools' out-of-band protocols and report formats are package perftest's.
//
// The runners take an open device and a way to reach the peer (an OOB):
// its TCP endpoint, or, for perftest's -R mode, its rdma_cm address, in
// which case both the exchange and the test QP are connected with package
// cm. Tests can open the device and sockets inside another network
// namespace and run the rest anywhere; Run* functions are the command-line
// front ends, shared by rocectl and the benchmarks so that both run exactly
// the same code.
//
// It is a library rather than part of rocectl because the interop suite and
// the benchmarks drive the same runners; it is internal because its API
// follows the command's flags and may change with them.
package perfrun
