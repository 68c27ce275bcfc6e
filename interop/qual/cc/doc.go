// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package cc runs part of package qual's rxe qualification with goroce's
// congestion control (DCQCN) on: ibv_rc_pingpong and perftest's write, read
// and send tests in both roles over AF_XDP. rxe never marks CE and ignores
// ECN, so a peer without congestion control must be unaffected: every run
// passes as it does with it off, goroce's packets leave with ECT(0) (the
// ICRC masks the traffic class, so rxe still verifies them), and no CNP is
// sent or handled.
//
// The package is its own test binary with its own lab, so its device is
// opened with congestion control on from the start.
package cc
