// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// The retry3 QP's local ACK timeout: 4.096 µs × 2^16 ≈ 268 ms. The tools'
// 14 (67 ms) with only 3 retries gives up on a live TCG guest that is
// merely not scheduled for a quarter of a second.
const retry3Timeout = 16

// retryBound is how long goroce may take, after the peer's process is
// gone, to report RETRY_EXC_ERR with retry count 3: about 4 × 268 ms, the
// rest is slack for a loaded machine.
const retryBound = 15 * time.Second

// TestPeerDisappears kills rxe's process while goroce is sending to it.
// rxe destroys the QP with the process and drops what arrives for it
// without answering, so:
//
//   - retry3: goroce's own RC QP (retry count 3, timeout 16) streaming SENDs to
//     ibv_rc_pingpong must complete the oldest one with RETRY_EXC_ERR
//     within retryBound, counted in retry_exceeded_err, and flush the rest;
//   - retry7: perftest's retry count 7, which rxe (and so goroce) treat as
//     "retry forever" (see the wire notes), keeps ib_write_bw's client
//     retransmitting without an error until the caller gives up;
//   - afterwards the device still serves new QPs: an rc_pingpong succeeds,
//     every message echoed byte-exact.
func TestPeerDisappears(t *testing.T) {
	e := setup(t)
	t.Run("retry3", func(t *testing.T) { peerGoneRetry3(t, e) })
	t.Run("retry7", func(t *testing.T) { peerGoneRetry7(t, e) })
	pp := perfrun.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 20, MTU: ib.MTU1024, GIDIndex: -1}
	t.Run("rc_pingpong-after", func(t *testing.T) { runPingpong(t, e, pp, false) })
}

func peerGoneRetry3(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const size = 4096
	jobCtx, kill := context.WithCancel(ctx)
	defer kill()
	job, wait := e.Start(jobCtx, "ibv_rc_pingpong", "-d", "rxe0", "-g", strconv.Itoa(e.GIDIndex), "-s", strconv.Itoa(size), "-n", "1000000", "-m", "1024", "-e", "-r", "8000")

	pd, err := e.Dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := e.Dev.CreateCQ(256)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	const depth, recvs = 8, 64
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq,
		Cap: roce.QPCap{MaxSendWR: depth, MaxRecvWR: recvs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	buf := make([]byte, size*(1+recvs))
	for i := range size {
		buf[i] = byte(i*7 + 0x3c)
	}
	mr, err := pd.RegisterMR(buf, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	if err := q.Modify(ctx, &roce.QPAttr{State: roce.StateInit, Port: 1, AccessFlags: roce.AccessLocalWrite},
		roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	recvWR := make([]roce.RecvWR, recvs)
	for i := range recvWR {
		recvWR[i] = roce.RecvWR{ID: uint64(1<<32 | i), SGL: []roce.SGE{mr.SGE(size*(1+i), size)}}
		if err := q.PostRecv(&recvWR[i]); err != nil {
			t.Fatal(err)
		}
	}
	var gid ib.GID
	for _, g := range e.Dev.GIDs() {
		if g.GID.IsIPv4() {
			gid = g.GID
			break
		}
	}
	me := perftest.PingpongDest{QPN: q.QPN(), PSN: 0x2a5a5a, GID: gid}
	conn, err := e.Dialer(job.Done()).Dial(ctx)
	if err != nil {
		t.Fatalf("%v\nguest %s", err, wait())
	}
	rem, err := perftest.PingpongClient(ctx, conn, me)
	conn.Close()
	if err != nil {
		t.Fatalf("pingpong exchange: %v", err)
	}
	err = q.Connect(ctx, &roce.ConnectAttr{RemoteQPN: rem.QPN, RemoteGID: rem.GID, RemotePSN: rem.PSN,
		LocalPSN: me.PSN, SGID: gid, PathMTU: ib.MTU1024, Timeout: retry3Timeout, RetryCnt: 3, RNRRetry: 7,
		MinRNRTimer: 12, RdAtomic: 1, HopLimit: 64, NoDefaults: true})
	if err != nil {
		t.Fatal(err)
	}

	// Stream SENDs, depth at a time; the tool consumes them and echoes
	// one per round trip into our receives.
	type result struct {
		wc   roce.WorkCompletion
		rest []roce.WorkCompletion // polled in the same batch, after wc
		err  error
		at   time.Time
	}
	var sent, acked atomic.Int64
	done := make(chan result, 1)
	go func() {
		sendWR := roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{mr.SGE(0, size)}}
		var wc [16]roce.WorkCompletion
		outstanding := 0
		for {
			for outstanding < depth {
				sendWR.ID = uint64(sent.Load())
				if err := q.PostSend(&sendWR); err != nil {
					done <- result{err: fmt.Errorf("post send %d: %w", sent.Load(), err), at: time.Now()}
					return
				}
				sent.Add(1)
				outstanding++
			}
			n := cq.Poll(wc[:])
			if n == 0 {
				if err := cq.Wait(ctx); err != nil {
					done <- result{err: err, at: time.Now()}
					return
				}
				continue
			}
			for i, w := range wc[:n] {
				if w.WRID>>32 == 1 {
					if w.Status == roce.WCSuccess {
						q.PostRecv(&recvWR[w.WRID&0xffffffff])
					}
					continue
				}
				if w.Status != roce.WCSuccess {
					done <- result{wc: w, rest: append([]roce.WorkCompletion(nil), wc[i+1:n]...), at: time.Now()}
					return
				}
				outstanding--
				acked.Add(1)
			}
		}
	}()

	// Kill while data flows: the tool in event mode drains only two
	// completions per event, so once its posted receives (-r) are used up
	// it falls behind and answers with RNR NAKs; kill well before that.
	start := e.ourCounters()
	for acked.Load() < 100 {
		select {
		case r := <-done:
			kill()
			t.Fatalf("streaming ended before the kill, after %d SENDs: %+v %v\ncounters %v\nguest %s", acked.Load(), r.wc, r.err, e.ourCounters(), wait())
		case <-time.After(2 * time.Millisecond):
		}
	}
	before := e.ourCounters()
	if rnr := before["rcvd_rnr_err"] - start["rcvd_rnr_err"]; rnr != 0 {
		t.Logf("note: %d RNR NAKs before the kill", rnr)
	}
	killed := time.Now()
	kill()
	tool := wait()
	gone := time.Now()
	if rnr := e.ourCounters()["rcvd_rnr_err"] - start["rcvd_rnr_err"]; rnr != 0 {
		t.Logf("note: %d RNR NAKs before the tool was gone", rnr)
	}
	t.Logf("killed ibv_rc_pingpong after %d SENDs of %d B were acknowledged; the guest job ended %.2fs later (exit %d)",
		acked.Load(), size, gone.Sub(killed).Seconds(), tool.Code)

	var r result
	select {
	case r = <-done:
	case <-time.After(retryBound + gone.Sub(killed)):
		t.Fatalf("goroce reported nothing within %v of the peer's end; counters %v", retryBound, e.ourCounters().sub(before))
	}
	if r.err != nil || r.wc.Status != roce.WCRetryExcErr {
		t.Fatalf("goroce ended with %+v %v, want a RETRY_EXC_ERR completion", r.wc, r.err)
	}
	// The remaining sends are flushed.
	var wc [16]roce.WorkCompletion
	flushed := 0
	count := func(ws []roce.WorkCompletion) {
		for _, w := range ws {
			if w.WRID>>32 == 0 {
				if w.Status != roce.WCWRFlushErr {
					t.Errorf("send %d after the failure: status %v, want WR_FLUSH_ERR", w.WRID, w.Status)
				}
				flushed++
			}
		}
	}
	count(r.rest)
	deadline := time.Now().Add(5 * time.Second)
	for int64(flushed) < sent.Load()-acked.Load()-1 && time.Now().Before(deadline) {
		n := cq.Poll(wc[:])
		count(wc[:n])
		if n == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if want := sent.Load() - acked.Load() - 1; int64(flushed) != want {
		t.Errorf("%d sends flushed, want %d", flushed, want)
	}
	if q.State() != roce.StateErr {
		t.Errorf("QP state %v, want ERR", q.State())
	}
	delta := e.ourCounters().sub(before)
	if delta["retry_exceeded_err"] != 1 {
		t.Errorf("retry_exceeded_err grew by %d, want 1 (%v)", delta["retry_exceeded_err"], delta)
	}
	t.Logf("RETRY_EXC_ERR for send %d %.2fs after the kill was asked, %.2fs after the guest job ended; %d sends flushed; goroce counters: %v",
		r.wc.WRID, r.at.Sub(killed).Seconds(), r.at.Sub(gone).Seconds(), flushed, delta)
}

func peerGoneRetry7(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const iters = 1000000 // far more than can finish before the kill
	c := perfrun.PerfConfig{Verb: perftest.Write, Size: 4096, Iters: iters, MTU: ib.MTU1024, GIDIndex: -1}
	jobCtx, kill := context.WithCancel(ctx)
	defer kill()
	job, wait := e.Start(jobCtx, "ib_write_bw", "-d", "rxe0", "-x", strconv.Itoa(e.GIDIndex), "-F",
		"-n", strconv.Itoa(iters), "-m", "1024", "-s", "4096")
	before := e.ourCounters()
	perfCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		_, err := perfrun.Perf(perfCtx, e.Dev, e.Dialer(job.Done()), c, &out, false)
		done <- err
	}()
	for e.ourCounters()["rdma_sends"]-before["rdma_sends"] < 2000 {
		select {
		case err := <-done:
			t.Fatalf("goroce ended before the kill: %v\n%s\nguest %s", err, out.String(), wait())
		case <-time.After(50 * time.Millisecond):
		}
	}
	kill()
	tool := wait()
	gone := e.ourCounters()
	const watch = 3 * time.Second
	select {
	case err := <-done:
		t.Fatalf("ib_write_bw client ended %v after the peer (exit %d) although retry count 7 retries forever: %v", watch, tool.Code, err)
	case <-time.After(watch):
	}
	retried := e.ourCounters().sub(gone)
	if retried["timeouts"] < 3 || retried["rdma_sends"] == 0 {
		t.Errorf("no retransmissions in the %v after the peer went away: %v", watch, retried)
	}
	stopped := time.Now()
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("after the caller gave up: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Perf did not return within 10 s of its context's end")
	}
	t.Logf("retry count 7: still retransmitting %v after the peer ended (%v); returned %.2fs after the caller gave up",
		watch, retried, time.Since(stopped).Seconds())
}
