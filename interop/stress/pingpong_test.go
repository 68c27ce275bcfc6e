// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// toolFill is the byte ibv_rc_pingpong fills its buffer with before the
// first message (rdma-core libibverbs/examples/rc_pingpong.c).
const toolFill = 0x7b

// ppPattern is what goroce sends as message i: different for every
// message, so an echo of the wrong message or a stale buffer shows.
func ppPattern(b []byte, i int) {
	for k := range b {
		b[k] = byte(k*7 + 0x3c + i*31)
	}
}

// runPingpong plays ibv_rc_pingpong's protocol against the tool in the
// guest, like rocectl pingpong, and checks every byte received: the tool
// has one buffer for receiving and sending, so it sends back the message
// it last received, and its first message (when it is the client) is its
// initial fill. Unlike rocectl pingpong, it keeps its QP until the tool
// has exited: with loss, the ACK of the tool's last message can be lost,
// and the tool (retry count 7: forever, as rxe) retransmits it until a QP
// answers.
func runPingpong(t *testing.T, e *env, c perfrun.PingpongConfig, goroceServer bool) {
	t.Helper()
	playPingpong(t, e, c, goroceServer, false, 0)
}

// playPingpong is runPingpong; with wantFail, the first failed completion
// ends the run instead of the test, and its status is returned with the
// tool's result once the tool has exited (the QP stays open until then, so
// whatever goroce still has to send, such as a NAK, goes out). toolMTU,
// if not 0, is the tool's path MTU instead of c.MTU.
func playPingpong(t *testing.T, e *env, c perfrun.PingpongConfig, goroceServer, wantFail bool, toolMTU int) (roce.WCStatus, qual.ToolResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if c.MTU == 0 {
		c.MTU = ib.MTU1024
	}
	size, iters := c.Size, c.Iters
	if toolMTU == 0 {
		toolMTU = c.MTU.Bytes()
	}
	args := []string{"ibv_rc_pingpong", "-d", "rxe0", "-g", strconv.Itoa(e.GIDIndex), "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-m", strconv.Itoa(toolMTU)}
	if goroceServer {
		args = append(args, e.Lab.PeerAddr.String())
	}
	var oob perfrun.OOB
	if goroceServer {
		oob = e.Listen(t)
	}
	t0 := time.Now()
	job, wait := e.Start(ctx, args...)
	if !goroceServer {
		oob = e.Dialer(job.Done())
	} else {
		closeWhenDone(ctx, oob, job)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		cancel()
		tool := wait()
		t.Fatalf("%s\nguest %s\n%s", fmt.Sprintf(format, args...), tool, e.counters(t))
	}

	pd, err := e.Dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	const recvs = 16
	cq, err := e.Dev.CreateCQ(recvs + 2)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq,
		Cap: roce.QPCap{MaxSendWR: 2, MaxRecvWR: recvs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	buf := make([]byte, size*(1+recvs))
	mr, err := pd.RegisterMR(buf, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	if err := q.Modify(ctx, &roce.QPAttr{State: roce.StateInit, Port: 1, AccessFlags: roce.AccessLocalWrite},
		roce.AttrState|roce.AttrPKeyIndex|roce.AttrPort|roce.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	const recvTag = 1 << 32
	recvWR := make([]roce.RecvWR, recvs)
	for i := range recvWR {
		recvWR[i] = roce.RecvWR{ID: recvTag | uint64(i), SGL: []roce.SGE{mr.SGE(size*(1+i), size)}}
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
	me := perftest.PingpongDest{QPN: q.QPN(), PSN: 0x1b2c3d, GID: gid}
	connect := func(rem perftest.PingpongDest) error {
		return q.Connect(ctx, &roce.ConnectAttr{RemoteQPN: rem.QPN, RemoteGID: rem.GID, RemotePSN: rem.PSN,
			LocalPSN: me.PSN, SGID: gid, PathMTU: c.MTU, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
			MinRNRTimer: 12, RdAtomic: 1, HopLimit: 64, NoDefaults: true})
	}
	var rem perftest.PingpongDest
	if goroceServer {
		conn, err := oob.Listener.Accept()
		if err != nil {
			fail("accepting the tool: %v", err)
		}
		rem, err = perftest.PingpongServer(ctx, conn, me, connect)
		conn.Close()
		if err != nil {
			fail("pingpong exchange: %v", err)
		}
	} else {
		conn, err := oob.Dial(ctx)
		if err != nil {
			fail("%v", err)
		}
		rem, err = perftest.PingpongClient(ctx, conn, me)
		conn.Close()
		if err == nil {
			err = connect(rem)
		}
		if err != nil {
			fail("pingpong exchange: %v", err)
		}
	}

	sendWR := roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{mr.SGE(0, size)}}
	sent := 0
	send := func() {
		ppPattern(buf[:size], sent)
		sendWR.ID = uint64(sent)
		if err := q.PostSend(&sendWR); err != nil {
			fail("post send %d: %v", sent, err)
		}
		sent++
	}
	want := make([]byte, size)
	pending := 0 // 1: a receive is awaited, 2: a send
	if !goroceServer {
		send()
		pending = 3
	} else {
		pending = 1
	}
	var wc [recvs + 2]roce.WorkCompletion
	scnt, rcnt, exact := 0, 0, 0
	failed := roce.WCSuccess
	// The tool exits as soon as it has what it waits for. If the ACK of
	// goroce's last SEND is lost then, nobody answers the retransmissions
	// (the tool's QP is gone), so that one completion may never come; the
	// tool's exit status, checked below, says whether it got the message.
	waitCtx, waitCancel := context.WithCancel(ctx)
	defer waitCancel()
	go func() {
		select {
		case <-job.Done():
			waitCancel()
		case <-waitCtx.Done():
		}
	}()
loop:
	for rcnt < iters || scnt < iters {
		n := cq.Poll(wc[:])
		if n == 0 {
			err := cq.Wait(waitCtx)
			if err != nil && ctx.Err() == nil {
				// The tool has exited.
				if rcnt == iters && scnt == iters-1 {
					t.Logf("the tool exited with goroce's last SEND unacknowledged (its ACK was lost); the tool's exit status decides")
					break loop
				}
				err = cq.Wait(ctx)
			}
			if err != nil {
				fail("after %d sends and %d receives: %v", scnt, rcnt, err)
			}
			continue
		}
		for _, w := range wc[:n] {
			if w.Status != roce.WCSuccess {
				if wantFail {
					failed = w.Status
					break loop
				}
				fail("completion %+v after %d sends and %d receives", w, scnt, rcnt)
			}
			if w.WRID&recvTag == 0 {
				scnt++
				pending &^= 2
			} else {
				i := int(w.WRID &^ recvTag)
				got := buf[size*(1+i) : size*(2+i)]
				// Client: receive k echoes our message k. Server: receive
				// 0 is the tool's fill, receive k echoes our message k−1.
				switch {
				case goroceServer && rcnt == 0:
					for k := range want {
						want[k] = toolFill
					}
				case goroceServer:
					ppPattern(want, rcnt-1)
				default:
					ppPattern(want, rcnt)
				}
				if int(w.ByteLen) == size && string(got) == string(want) {
					exact++
				} else if rcnt-exact < 3 {
					t.Errorf("receive %d: %d bytes, not the expected content", rcnt, w.ByteLen)
				}
				clear(got)
				if err := q.PostRecv(&recvWR[i]); err != nil {
					fail("repost receive: %v", err)
				}
				rcnt++
				pending &^= 1
			}
			if pending == 0 && sent < iters {
				send()
				pending = 3
			}
		}
	}
	elapsed := time.Since(t0)
	// Keep the QP until the tool is done (see above).
	tool := wait()
	if wantFail {
		return failed, tool
	}
	if !tool.OK() {
		t.Fatalf("the tool failed after goroce finished in %.1fs:\n%s\n%s", elapsed.Seconds(), tool, e.counters(t))
	}
	if w := fmt.Sprintf("%d iters in", iters); !strings.Contains(tool.Stdout, w) {
		t.Errorf("the tool did not report %q:\n%s", w, tool.Stdout)
	}
	if exact != iters {
		t.Errorf("%d of %d messages received byte-exact", exact, iters)
	}
	t.Logf("%d × %d B round trips, all %d received messages byte-exact; goroce done in %.1fs, the tool %.1fs",
		iters, size, exact, elapsed.Seconds(), time.Since(t0).Seconds())
	return roce.WCSuccess, tool
}
