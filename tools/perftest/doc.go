// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package perftest speaks the out-of-band TCP protocols of the RDMA
// benchmark tools, so goroce can stand in for either end of them, and prints
// their reports the way they do.
//
// Two families are covered:
//
//   - ibv_rc_pingpong and ibv_ud_pingpong (rdma-core's libibverbs examples):
//     one 52-byte text record "LID:QPN:PSN:GID" each way, then "done" from the
//     client (PingpongDest, PingpongClient, PingpongServer).
//   - perftest (ib_send_bw, ib_write_lat, ...; protocol of perftest 6.06):
//     a 16-byte version string, page and cache-line sizes, the IB MTU code as
//     a two-byte string, then 108-byte text records
//     "LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID:SRQN:" exchanged a fixed number of
//     times per test, bandwidth reports as big-endian 64-bit values, and
//     "done" (Conn, Dest, Script).
//
// In both the client writes first and the server reads first, and every
// message is sent with one write: the C tools read each with a single read(2)
// and fail on a short one.
//
// Header, address and result lines are formatted as perftest and the
// pingpong tools print them (Header, FormatBW, LatencyStats.Format, ...).
package perftest
