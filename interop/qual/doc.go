// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package qual qualifies goroce against real Soft-RoCE: rocectl's pingpong
// and perf runners, on a goroce device over AF_XDP on the lab's rxeh0, face
// the real ibv_rc_pingpong, ibv_ud_pingpong and perftest tools in rxe
// guests (package rxelab), in both roles, at path MTU 1024 and 2048.
//
// The package holds the runners (Setup, PingpongGoroceServer, ...) that its
// tests and those of qual/jumbo (a lab with MTU 9000: path MTU 4096 over
// AF_XDP multi-buffer) share. One guest and one goroce device serve every
// test of a binary: the guests boot under TCG, which is slow.
package qual
