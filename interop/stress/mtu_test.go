// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// TestMTUMismatch connects goroce and ibv_rc_pingpong with different path
// MTUs (the out-of-band exchange carries none, so nothing stops it), with
// 4096-byte messages. rxe (guest kernel 6.1) accepts FIRST and MIDDLE
// packets of any length, so the first message arrives; goroce requires
// them to be exactly its path MTU (as the IBTA does) and answers rxe's
// echo with NAK invalid request. Both ends must then fail fast with
// REMOTE_INVALID_REQUEST (goroce on its receive, the tool on its send),
// and the device must serve a correctly configured pingpong afterwards.
func TestMTUMismatch(t *testing.T) {
	e := setup(t)
	for _, c := range []struct{ ours, theirs int }{{2048, 1024}, {1024, 2048}} {
		t.Run("goroce"+itoa(c.ours)+"-rxe"+itoa(c.theirs), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			m, _ := ib.MTUFromBytes(c.ours)
			cfg := perfcmd.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 5, MTU: m, GIDIndex: -1}
			job, wait := e.start(ctx, "ibv_rc_pingpong", "-d", "rxe0", "-g", itoa(e.gidIndex), "-s", "4096", "-n", "5", "-m", itoa(c.theirs))
			before, guestBefore := e.ourCounters(), e.guestCounters(t)
			t0 := time.Now()
			var out bytes.Buffer
			res, err := perfcmd.Pingpong(ctx, e.dev, e.dialer(job.Done()), cfg, &out)
			ours := time.Since(t0)
			if errors.Is(err, context.DeadlineExceeded) {
				cancel()
			}
			tool := wait()
			theirs := time.Since(t0)
			var wcErr *perfcmd.WCError
			status := "success"
			if errors.As(err, &wcErr) {
				status = wcErr.WC.Status.String()
			} else if err != nil {
				status = err.Error()
			}
			t.Logf("goroce: %s after %.2fs (result %+v)\ntool: exit %d after %.2fs\n%s%s\ngoroce counters %v\nrxe counters %v",
				status, ours.Seconds(), res, tool.code, theirs.Seconds(), tool.stdout, tool.stderr,
				e.ourCounters().sub(before), e.guestCounters(t).sub(guestBefore))
			if tool.err != nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("no end within a minute: goroce %v, tool %v", err, tool.err)
			}
			if wcErr == nil || wcErr.WC.Status != roce.WCRemInvReqErr {
				t.Errorf("goroce ended with %v, want a REMOTE_INVALID_REQUEST completion", err)
			}
			if tool.code == 0 || !strings.Contains(tool.stderr, "remote invalid request error") {
				t.Errorf("the tool did not fail with a remote invalid request error:\n%s", tool)
			}
		})
	}
	pp := perfcmd.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 20, MTU: ib.MTU1024, GIDIndex: -1}
	t.Run("rc_pingpong-after", func(t *testing.T) { runPingpong(t, e, pp, false) })
}
