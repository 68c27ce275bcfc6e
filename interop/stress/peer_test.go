// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/perftest"
	"github.com/goroce/goroce/roce"
)

// retryBound is how long goroce may take, after the peer's process is
// gone, to report RETRY_EXC_ERR: perfcmd connects with timeout 14
// (4.096 µs × 2^14 ≈ 67 ms) and retry count 7, so the budget is about
// 8 × 67 ms ≈ 0.5 s; the rest is slack for a loaded machine.
const retryBound = 20 * time.Second

// TestPeerDisappears kills rxe's ib_write_bw server while goroce, the
// client, is writing to it. rxe destroys the QP with the process and drops
// what arrives for it without answering, so goroce's unacknowledged WRITEs
// must end in RETRY_EXC_ERR within retryBound, counted in
// retry_exceeded_err; and the device must go on serving other QPs: an
// rc_pingpong afterwards succeeds byte-exact.
func TestPeerDisappears(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const iters = 1000000 // far more than can finish before the kill
	c := perfcmd.PerfConfig{Verb: perftest.Write, Size: 4096, Iters: iters, MTU: ib.MTU1024, GIDIndex: -1}
	jobCtx, kill := context.WithCancel(ctx)
	defer kill()
	job, wait := e.start(jobCtx, "ib_write_bw", "-d", "rxe0", "-x", itoa(e.gidIndex), "-F",
		"-n", itoa(iters), "-m", "1024", "-s", "4096")
	before := e.ourCounters()

	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	var out bytes.Buffer
	go func() {
		_, err := perfcmd.Perf(ctx, e.dev, e.dialer(job.Done()), c, &out, false)
		done <- result{err, time.Now()}
	}()

	// Kill once goroce is well into the transfer.
	const sends = 3000
	for e.ourCounters()["rdma_sends"]-before["rdma_sends"] < sends {
		select {
		case r := <-done:
			t.Fatalf("goroce ended before the kill: %v\n%s\nguest %s", r.err, out.String(), wait())
		case <-time.After(50 * time.Millisecond):
		}
	}
	written := e.ourCounters()["rdma_sends"] - before["rdma_sends"]
	killed := time.Now()
	kill()
	tool := wait()
	gone := time.Now()
	t.Logf("killed ib_write_bw after %d request packets; the guest job ended %.2fs later (exit %d)",
		written, gone.Sub(killed).Seconds(), tool.code)

	var r result
	select {
	case r = <-done:
	case <-time.After(retryBound + gone.Sub(killed)):
		t.Fatalf("goroce reported nothing within %v of the peer's end\n%s", retryBound, out.String())
	}
	var wcErr *perfcmd.WCError
	if !errors.As(r.err, &wcErr) || wcErr.WC.Status != roce.WCRetryExcErr {
		t.Fatalf("goroce ended with %v, want a RETRY_EXC_ERR completion\n%s", r.err, out.String())
	}
	delta := e.ourCounters().sub(before)
	if delta["retry_exceeded_err"] == 0 {
		t.Errorf("retry_exceeded_err did not count the failure: %v", delta)
	}
	t.Logf("RETRY_EXC_ERR (%v) %.2fs after the kill was asked, %.2fs after the guest job ended; goroce counters: %v",
		r.err, r.at.Sub(killed).Seconds(), r.at.Sub(gone).Seconds(), delta)

	// The device keeps serving: a fresh QP against a fresh rxe process.
	pp := perfcmd.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 20, MTU: ib.MTU1024, GIDIndex: -1}
	t.Run("rc_pingpong-after", func(t *testing.T) { lossPingpong(t, e, pp, false) })
}
