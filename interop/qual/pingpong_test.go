// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"testing"

	"github.com/goroce/goroce/roce"
)

// TestRCPingpong runs ibv_rc_pingpong in the guest against rocectl's
// pingpong on goroce, each as server and as client: the whole RC stack
// (connection, SEND segmentation at the path MTU, ACKs, PSNs) against rxe.
// The tools echo what they receive, so every message after the first must
// come back as the bytes we sent.
func TestRCPingpong(t *testing.T) {
	e := Setup(t)
	var cases []PingpongCase
	for _, mtu := range []int{1024, 2048} {
		for _, size := range []int{1, 1024, 4096, 10000} {
			cases = append(cases, PingpongCase{Type: roce.RC, Size: size, MTU: mtu, Iters: 50})
		}
		cases = append(cases, PingpongCase{Type: roce.RC, Size: 4096, MTU: mtu, Events: true, Iters: 50})
	}
	PingpongBothRoles(t, e, cases)
}

// TestUDPingpong is TestRCPingpong for ibv_ud_pingpong (UD SENDs with GRH,
// Q_Key, address handles).
func TestUDPingpong(t *testing.T) {
	e := Setup(t)
	var cases []PingpongCase
	for _, size := range []int{1, 512, 1024, 2048} {
		cases = append(cases, PingpongCase{Type: roce.UD, Size: size, Iters: 50})
	}
	cases = append(cases, PingpongCase{Type: roce.UD, Size: 1024, Events: true, Iters: 50})
	PingpongBothRoles(t, e, cases)
}
