// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/goroce/goroce/internal/netnstest"
	"strconv"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
	"golang.org/x/sys/unix"
)

// TestLoss drops 1 % and then 5 % of the RoCEv2 frames in both directions
// between goroce and rxe (on the bridge's egress towards rxeh0 and towards
// the guest's tap) and runs RC traffic through it, goroce as server and as
// client:
//
//   - ibv_rc_pingpong: the tool sends back the bytes it received (one
//     buffer for both), so every message after the first must come back
//     as exactly the pattern goroce sent: goroce → rxe → goroce, byte for
//     byte, through the loss both ways;
//   - ib_send_bw, ib_write_bw, ib_read_bw: perftest does not check data,
//     so these prove that every operation completes successfully on both
//     ends (retransmission, NAK and duplicate handling) under loss.
//
// The dropper's own counters and both sides' retransmission counters show
// that the loss was real and was recovered from.
func TestLoss(t *testing.T) {
	e := setup(t)
	for _, pct := range []int{1, 5} {
		t.Run(fmt.Sprintf("loss%d%%", pct), func(t *testing.T) { lossLevel(t, e, pct) })
	}
}

func lossLevel(t *testing.T, e *env, pct int) {
	l, err := netnstest.NewLoss(e.Lab.NS, []string{e.tap(), e.Lab.PeerIf + "-br"}, float64(pct)/100)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
		// The kernel does not know the clsact qdisc or the bpf classifier.
		t.Skipf("cannot inject loss: clsact/cls_bpf missing (CONFIG_NET_SCH_INGRESS, CONFIG_NET_CLS_BPF): %v", err)
	}
	if err != nil {
		t.Fatalf("attaching the loss program: %v", err)
	}
	detached := false
	detach := func() {
		if !detached {
			detached = true
			if err := l.Close(); err != nil {
				t.Errorf("removing the loss program: %v", err)
			}
		}
	}
	defer detach()
	ours0, guest0 := e.ourCounters(), e.guestCounters(t)
	t0 := time.Now()

	pp := perfrun.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 100, MTU: ib.MTU1024, GIDIndex: -1}
	t.Run("rc_pingpong/goroce-server", func(t *testing.T) { runPingpong(t, e, pp, true) })
	t.Run("rc_pingpong/goroce-client", func(t *testing.T) { runPingpong(t, e, pp, false) })
	for _, v := range []perftest.Verb{perftest.Send, perftest.Write, perftest.Read} {
		// Go-back-N over perftest's 128 outstanding 16-packet WRITEs makes
		// 5 % loss slow on TCG guests: fewer iterations keep the test short.
		iters := 100
		if pct >= 5 {
			iters = 60
		}
		c := perfrun.PerfConfig{Verb: v, Size: 16384, Iters: iters, MTU: ib.MTU1024, GIDIndex: -1}
		name := "ib_" + [...]string{"send", "write", "read", "atomic"}[v] + "_bw"
		t.Run(name+"/goroce-server", func(t *testing.T) { runPerf(t, e, name, c, true) })
		t.Run(name+"/goroce-client", func(t *testing.T) { runPerf(t, e, name, c, false) })
	}

	passed, dropped, err := l.Counts()
	if err != nil {
		t.Fatalf("reading the loss counters: %v", err)
	}
	detach()
	elapsed := time.Since(t0)
	ours, guest := e.ourCounters().sub(ours0), e.guestCounters(t).sub(guest0)
	t.Logf("loss %d%%: %d of %d RoCEv2 frames dropped (%.2f%%) in %.1fs\ngoroce: %v\nguest rxe0: %v",
		pct, dropped, passed+dropped, 100*float64(dropped)/float64(max(passed+dropped, 1)), elapsed.Seconds(), ours, guest)
	if dropped == 0 {
		t.Errorf("no frame was dropped: the loss was not applied")
	}
	// Drops were recovered from by both stacks: goroce retransmitted (NAKs
	// received or timeouts) and rxe saw retransmitted or out-of-order
	// requests, or retransmitted itself.
	ourRecovery := ours["rcvd_seq_err"] + ours["completer_retry_err"] + ours["timeouts"] +
		ours["duplicate_request"] + ours["out_of_seq_request"]
	guestRecovery := guest["rcvd_seq_err"] + guest["completer_retry_err"] + guest["duplicate_request"] +
		guest["out_of_seq_request"]
	if ourRecovery == 0 || guestRecovery == 0 {
		t.Errorf("no retransmission seen (goroce %d, rxe %d) although %d frames were dropped", ourRecovery, guestRecovery, dropped)
	}
	for _, k := range []string{"retry_exceeded_err", "retry_rnr_exceeded_err", "icrc_err", "bad_frame"} {
		if ours[k] != 0 {
			t.Errorf("goroce %s = %d", k, ours[k])
		}
	}
	if guest["retry_exceeded_err"] != 0 {
		t.Errorf("rxe retry_exceeded_err = %d", guest["retry_exceeded_err"])
	}
}

func runPerf(t *testing.T, e *env, tool string, c perfrun.PerfConfig, goroceServer bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args := []string{tool, "-d", "rxe0", "-x", strconv.Itoa(e.GIDIndex), "-F", "-n", strconv.Itoa(c.Iters), "-m", strconv.Itoa(c.MTU.Bytes()), "-s", strconv.Itoa(c.Size)}
	var oob perfrun.OOB
	var wait func() qual.ToolResult
	t0 := time.Now()
	if goroceServer {
		oob = e.Listen(t)
		var job *rxelab.Job
		job, wait = e.Start(ctx, append(args, e.Lab.PeerAddr.String())...)
		closeWhenDone(ctx, oob, job)
	} else {
		var job interface{ Done() <-chan struct{} }
		job, wait = e.Start(ctx, args...)
		oob = e.Dialer(job.Done())
	}
	var out bytes.Buffer
	res, err := perfrun.Perf(ctx, e.Dev, oob, c, &out, false)
	if err != nil {
		cancel()
	}
	tr := wait()
	if err != nil || !tr.OK() {
		t.Fatalf("%s: %v\nour output:\n%s\nguest %s\n%s", tool, err, out.String(), tr, e.counters(t))
	}
	if len(res) == 0 || res[0].Iters != uint64(c.Iters) {
		t.Errorf("result %+v, want %d iterations", res, c.Iters)
	}
	t.Logf("%d × %d B, %.1fs\n%s%s", c.Iters, c.Size, time.Since(t0).Seconds(), out.String(), tr.Stdout)
}
