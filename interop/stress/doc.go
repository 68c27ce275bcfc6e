// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

// Package stress runs goroce against real rdma_rxe guests (see package
// rxelab) under conditions the qualification tests avoid: packet loss on
// the lab bridge, a peer that disappears mid-transfer, mismatched path
// MTUs, and captures of the exchange checked by tshark and by ICRC. It holds only tests and their
// helpers.
//
// The host kernel the lab runs on may lack sch_netem (and act_gact), so
// loss is injected by a small cls_bpf program on the clsact egress hook of
// the bridge ports, which drops RoCEv2 frames (UDP port 4791) with a given
// probability and counts what it passed and dropped.
package stress
