// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package udp qualifies the kernel UDP link (link/udplink) against real
// Soft-RoCE: package qual's pingpong and perftest runs, with goroce's device
// on a UDP socket bound to the lab's rxeh0 IPv4 address instead of AF_XDP,
// and a second device on one bound to its IPv6 address (a UDP link serves
// the one address it is bound to, and lists only that one in its GID
// table), at path MTU 1024 and 4096 (lab MTU 9000). It also checks
// the link's GSO rule against rxe: runs of datagrams cut by the kernel reach
// an IPv6 peer (each segment's ICRC still verifies), while IPv4 runs to a
// peer on a wire go one datagram at a time (the kernel would give each
// segment its own IP ID, which the ICRC covers).
//
// The package is its own test binary, so its lab is not shared with
// package qual's, whose AF_XDP socket would take every RoCE frame on rxeh0.
package udp
