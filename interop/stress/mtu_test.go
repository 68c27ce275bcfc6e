// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// TestMTUMismatch connects goroce and ibv_rc_pingpong with different path
// MTUs (the out-of-band exchange carries none, so nothing stops it), with
// 4096-byte messages. rxe (guest kernel 6.1) accepts FIRST and MIDDLE
// packets of any length, so the first message arrives; goroce requires
// them to be exactly its path MTU (as the IBTA does) and answers rxe's
// echo with NAK invalid request. Both ends must then fail fast with
// REMOTE_INVALID_REQUEST (goroce on its receive, the tool on its send),
// and the device must serve a correctly configured pingpong afterwards.
//
// goroce keeps its QP until the tool has exited: its error completion is
// visible before the NAK is on the wire, and a QP closed at once can take
// the NAK with it, leaving rxe (retry count 7) retransmitting forever.
func TestMTUMismatch(t *testing.T) {
	e := setup(t)
	for _, c := range []struct{ ours, theirs int }{{2048, 1024}, {1024, 2048}} {
		t.Run("goroce"+strconv.Itoa(c.ours)+"-rxe"+strconv.Itoa(c.theirs), func(t *testing.T) {
			m, _ := ib.MTUFromBytes(c.ours)
			cfg := perfrun.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 5, MTU: m}
			guestBefore, before := e.guestCounters(t), e.ourCounters()
			t0 := time.Now()
			// The tool runs with its own MTU; goroce with c.ours.
			status, tool := playPingpong(t, e, cfg, false, true, c.theirs)
			took := time.Since(t0)
			t.Logf("goroce: %v; tool: exit %d, %.2fs in all\n%s%s\ngoroce counters %v\nrxe counters %v",
				status, tool.Code, took.Seconds(), tool.Stdout, tool.Stderr,
				e.ourCounters().sub(before), e.guestCounters(t).sub(guestBefore))
			if tool.Err != nil {
				t.Fatalf("the tool did not end within two minutes: %v", tool.Err)
			}
			if status != roce.WCRemInvReqErr {
				t.Errorf("goroce ended with %v, want a REMOTE_INVALID_REQUEST completion", status)
			}
			if tool.Code == 0 || !strings.Contains(tool.Stderr, "remote invalid request error") {
				t.Errorf("the tool did not fail with a remote invalid request error:\n%s", tool)
			}
		})
	}
	pp := perfrun.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 20, MTU: ib.MTU1024, GIDIndex: -1}
	t.Run("rc_pingpong-after", func(t *testing.T) { runPingpong(t, e, pp, false) })
}
