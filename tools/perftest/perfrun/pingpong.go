// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// pingpongQKey is the Q_Key ibv_ud_pingpong uses on both ends.
const pingpongQKey = 0x11111111

// Work request IDs of the pingpong tools.
const (
	ppRecvWRID = 1
	ppSendWRID = 2
)

// PingpongConfig configures one ibv_*_pingpong run.
type PingpongConfig struct {
	Type     roce.QPType // RC or UD
	Size     int         // message size (default 4096 RC, 2048 UD)
	Iters    int         // round trips (default 1000)
	RxDepth  int         // receives kept posted (default 500)
	MTU      ib.MTU      // RC path MTU (default 1024, as the tools)
	Events   bool        // sleep on the CQ instead of polling
	GIDIndex int         // -1: the first IPv4 GID
}

// PingpongResult is what a run measured and saw.
type PingpongResult struct {
	Local, Remote perftest.PingpongDest
	Elapsed       time.Duration
	// Received counts the messages received; Echoed those whose bytes were
	// the pattern we send (the tools send back what they last received, so
	// after their first message everything should be ours).
	Received, Echoed int
	// FirstFromPeer is true when the peer sent first (we are the server).
	FirstFromPeer bool
}

func (c *PingpongConfig) defaults() {
	if c.Size == 0 {
		c.Size = 4096
		if c.Type == roce.UD {
			c.Size = 2048
		}
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
	if c.RxDepth == 0 {
		c.RxDepth = 500
	}
	if c.MTU == 0 {
		c.MTU = ib.MTU1024
	}
}

// pattern fills the message we send; the peer echoes it.
func pattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + 0x3c)
	}
}

// Pingpong runs ibv_rc_pingpong or ibv_ud_pingpong's protocol on dev: the
// 52-byte address exchange over oob, then iters round trips of one SEND
// each way, the client sending first. It writes the tools' lines to out.
func Pingpong(ctx context.Context, dev *roce.Device, oob OOB, cfg PingpongConfig, out io.Writer) (*PingpongResult, error) {
	cfg.defaults()
	if cfg.Type != roce.RC && cfg.Type != roce.UD {
		return nil, fmt.Errorf("pingpong: QP type %v (RC or UD)", cfg.Type)
	}
	ud := cfg.Type == roce.UD
	if ud {
		if mtu := dev.QueryPort().ActiveMTU.Bytes(); cfg.Size > mtu {
			return nil, fmt.Errorf("Requested size larger than port MTU (%d)", mtu)
		}
	}
	res := &PingpongResult{FirstFromPeer: oob.IsServer()}

	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	defer pd.Close()
	cq, err := dev.CreateCQ(cfg.RxDepth + 1)
	if err != nil {
		return nil, err
	}
	defer cq.Close()
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: cfg.Type, SendCQ: cq, RecvCQ: cq,
		Cap: roce.QPCap{MaxSendWR: 2, MaxRecvWR: cfg.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	defer q.Close()

	// Separate send and receive buffers (the tools share one, which is what
	// makes them echo).
	grh := 0
	if ud {
		grh = roce.GRHSize
	}
	sendBuf := make([]byte, cfg.Size)
	pattern(sendBuf)
	recvBuf := make([]byte, cfg.Size+grh)
	smr, err := pd.RegisterMR(sendBuf, roce.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	defer smr.Close()
	rmr, err := pd.RegisterMR(recvBuf, roce.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	defer rmr.Close()
	// Receives are posted in INIT, before the exchange, as the tools do.
	if err := toInit(ctx, q, pingpongQKey); err != nil {
		return nil, fmt.Errorf("Failed to modify QP to INIT: %w", err)
	}
	recvWR := roce.RecvWR{ID: ppRecvWRID, SGL: []roce.SGE{rmr.SGE(0, len(recvBuf))}}
	postRecvs := func(n int) int {
		i := 0
		for ; i < n; i++ {
			if q.PostRecv(&recvWR) != nil {
				break
			}
		}
		return i
	}
	routs := postRecvs(cfg.RxDepth)
	if routs < cfg.RxDepth {
		return nil, fmt.Errorf("Couldn't post receive (%d)", routs)
	}

	gid, _, err := localGID(dev, cfg.GIDIndex)
	if err != nil {
		return nil, fmt.Errorf("can't read sgid of index %d: %w", cfg.GIDIndex, err)
	}
	me := perftest.PingpongDest{QPN: q.QPN(), PSN: randPSN(), GID: gid}
	res.Local = me
	fmt.Fprint(out, perftest.PingpongAddrLine(false, ud, me))

	var ah *roce.AH
	connect := func(rem perftest.PingpongDest) error {
		if ud {
			if err := q.Connect(ctx, &roce.ConnectAttr{QKey: pingpongQKey, LocalPSN: me.PSN}); err != nil {
				return fmt.Errorf("Failed to modify QP to RTS: %w", err)
			}
			var err error
			ah, err = pd.CreateAH(ctx, roce.AddressVector{DGID: rem.GID, SGID: gid, HopLimit: 64})
			if err != nil {
				return fmt.Errorf("Failed to create AH: %w", err)
			}
			return nil
		}
		err := q.Connect(ctx, &roce.ConnectAttr{
			RemoteQPN: rem.QPN, RemoteGID: rem.GID, RemotePSN: rem.PSN, LocalPSN: me.PSN,
			SGID: gid, PathMTU: cfg.MTU, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
			RdAtomic: 1, HopLimit: 1, NoDefaults: true,
		})
		if err != nil {
			return fmt.Errorf("Couldn't connect to remote QP: %w", err)
		}
		return nil
	}

	conn, err := oob.connect(ctx)
	if err != nil {
		return nil, err
	}
	var rem perftest.PingpongDest
	if oob.IsServer() {
		rem, err = perftest.PingpongServer(ctx, conn, me, connect)
	} else {
		rem, err = perftest.PingpongClient(ctx, conn, me)
	}
	conn.Close()
	if err != nil {
		return nil, err
	}
	res.Remote = rem
	fmt.Fprint(out, perftest.PingpongAddrLine(true, false, rem))
	if !oob.IsServer() {
		if err := connect(rem); err != nil {
			return nil, err
		}
	}
	if ah != nil {
		defer ah.Close()
	}

	sendWR := roce.SendWR{ID: ppSendWRID, Opcode: roce.WRSend, Flags: roce.SendSignaled,
		SGL: []roce.SGE{smr.SGE(0, cfg.Size)}}
	if ud {
		sendWR.AH, sendWR.RemoteQPN, sendWR.RemoteQKey = ah, rem.QPN, pingpongQKey
	}
	pending := ppRecvWRID
	start := time.Now()
	if !oob.IsServer() {
		if err := q.PostSend(&sendWR); err != nil {
			return nil, fmt.Errorf("Couldn't post send: %w", err)
		}
		pending |= ppSendWRID
	}
	var wc [2]roce.WorkCompletion
	scnt, rcnt := 0, 0
	lastWasRecv := false
	for rcnt < cfg.Iters || scnt < cfg.Iters {
		n, err := pollWait(ctx, cq, wc[:], cfg.Events, nil)
		if err != nil {
			return res, fmt.Errorf("after %d sends and %d receives: %w", scnt, rcnt, err)
		}
		for i := 0; i < n; i++ {
			w := &wc[i]
			if w.Status != roce.WCSuccess {
				return res, &WCError{*w}
			}
			switch w.WRID {
			case ppSendWRID:
				scnt++
			case ppRecvWRID:
				routs--
				if routs <= 1 {
					routs += postRecvs(cfg.RxDepth - routs)
					if routs < cfg.RxDepth {
						return res, fmt.Errorf("Couldn't post receive (%d)", routs)
					}
				}
				rcnt++
				res.Received++
				if int(w.ByteLen) == cfg.Size+grh && bytes.Equal(recvBuf[grh:], sendBuf) {
					res.Echoed++
				}
				// Catch a stale match: the next message must overwrite.
				clear(recvBuf[grh:])
			default:
				return res, fmt.Errorf("Completion for unknown wr_id %d", w.WRID)
			}
			lastWasRecv = w.WRID == ppRecvWRID
			pending &^= int(w.WRID)
			if scnt < cfg.Iters && pending == 0 {
				if err := q.PostSend(&sendWR); err != nil {
					return res, fmt.Errorf("Couldn't post send: %w", err)
				}
				pending = ppRecvWRID | ppSendWRID
			}
		}
	}
	res.Elapsed = time.Since(start)
	fmt.Fprint(out, perftest.PingpongResult(cfg.Size, cfg.Iters, res.Elapsed))
	if !ud && lastWasRecv {
		// Our ACK of the peer's last SEND may be lost; its retransmission
		// (after its ACK timeout, 67 ms at the tools' timeout 14) needs a
		// QP to answer it, or the peer's last send fails with
		// RETRY_EXC_ERR. Keep the QP a little longer.
		linger(ctx, pingpongLinger)
	}
	return res, nil
}

// pingpongLinger is how long an RC pingpong keeps its QP after the last
// message arrived: a few of the peer's retransmission timeouts.
const pingpongLinger = 250 * time.Millisecond

func linger(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
