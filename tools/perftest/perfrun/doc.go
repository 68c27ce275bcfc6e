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
// Bandwidth tests follow perftest's options. With several QPs (-q) each QP
// has its own CQs, buffer and goroutine that posts and polls it, every QP's
// record is swapped in perftest's order, and one report covers all the
// messages: their post and completion times merged on one time line, as
// perftest's single thread records them. With more QPs than Ps the
// goroutines wait for completions parked on their CQ instead of busy
// polling first: spinning ones starve those with work. Timed runs (-D, --run_infinitely)
// count completions in a shared counter that a timer samples; a timed send
// server keeps receiving until the test closes, since the sender stops on
// its own clock. -b (write, read, atomic) runs both sides as senders and
// prints the sum of their reports. -l posts lists with PostSendBatch (one
// lock and one transmit pass per list), -I posts inline (the payload is
// copied into the send queue at post time rather than read from the MR
// when the packet is built), -u and -T set the QP's ACK timeout and
// traffic class (perftest takes -T with -R only; here any RC QP, and the
// kernel UDP link carries it as the datagram's TOS). BenchmarkLoopbackQPs
// measures -q.
//
// It is a library rather than part of rocectl because the interop suite and
// the benchmarks drive the same runners; it is internal because its API
// follows the command's flags and may change with them.
package perfrun
