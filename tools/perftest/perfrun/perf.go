// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// Defaults of perftest 6.06.
const (
	defSizeBW     = 65536
	defSizeLat    = 2
	defIters      = 1000
	defTxBW       = 128
	defRxSend     = 512
	defCQMod      = 100
	cqModMaxSize  = 8192 // above this, perftest signals every message
	atomicSize    = 8
	ourOutReads   = 16 // the QP's RdAtomic: what we accept and issue
	maxRunAllSize = 1 << 23
	defQPTimeout  = 14              // perftest's DEF_QP_TIME
	defDuration   = 5 * time.Second // perftest's DEF_DURATION
	// MaxInline is the most -I takes: the largest inline payload a goroce
	// QP holds (perftest allows 1024, what mlx5 does).
	MaxInline = cliflag.MaxInline
	// drainTimeout bounds waiting for the last completions of a timed
	// run and the exchanges after an interrupted one.
	drainTimeout = 10 * time.Second
)

// PerfConfig configures one perftest-compatible test.
type PerfConfig struct {
	Verb     perftest.Verb
	Latency  bool
	AtomicOp perftest.AtomicOp // default FetchAndAdd (perftest's default)
	Size     int               // default 65536 (BW), 2 (latency), 8 (atomic)
	Iters    int               // default 1000
	TxDepth  int               // default 128 (BW), 1 (latency)
	RxDepth  int               // default 512 (send)
	CQMod    int               // default 100
	MTU      ib.MTU            // 0: the port's active MTU
	GIDIndex int               // -1: first IPv4 GID, and no "GID index" line
	Events   bool
	Gbits    bool // --report_gbits
	RunAll   bool // -a: every size from 2 to 8 MiB
	// Device is the name the header shows.
	Device string
	// RDMACM (-R) asks Loopback to connect with rdma_cm; Perf takes the
	// mode from its OOB.
	RDMACM bool
	// DC (--connection DC) runs the test from a DCI to the peer's DCT
	// (goroce peers only).
	DC bool
	// NumQPs (-q) runs a bandwidth test on this many QPs at once, each
	// posted and polled by its own goroutine on its own CQs and buffer;
	// the report is the sum, as perftest prints it (default 1).
	NumQPs int
	// Duration (-D) runs a bandwidth test for this long instead of Iters
	// messages; the report covers the middle, without a quarter of it at
	// each end (perftest's margin), and has no peak.
	Duration time.Duration
	// RunInfinitely (--run_infinitely) reports every Duration (default 5s)
	// until ctx ends; the test then closes as usual (write, read, atomic).
	RunInfinitely bool
	// Duplex (-b) runs a write, read or atomic bandwidth test both ways at
	// once; each side prints the sum of both reports.
	Duplex bool
	NoPeak bool // -N: no peak bandwidth (reported as 0)
	// Inline (-I) posts messages of up to this many bytes inline: the
	// payload is copied into the work request when it is posted, instead of
	// read from the memory region when the packet is built. Send and write.
	Inline int
	// PostList (-l) posts this many work requests with one call, under one
	// lock and one transmit pass (default 1).
	PostList int
	// QPTimeout (-u) is the local ACK timeout exponent, 4.096 µs × 2^n per
	// retry; 0 is perftest's 14 and a negative value asks for 0 (none).
	QPTimeout int
	// TOS (-T) is the IP TOS byte (traffic class) of the test traffic;
	// HasTOS says it was given.
	TOS    int
	HasTOS bool
	// CC (--cc) is the congestion control of Loopback's two devices
	// (Perf's device is the caller's, opened with its own).
	CC roce.CCConfig
	// peer is the other end's device when both ends run in this process
	// (Loopback): a waiter that spins drives it too, for with every P
	// spinning nothing else would (read-lat at GOMAXPROCS 1 waited for
	// the peer's receive goroutine: 640 µs typical).
	peer progresser
	// Shards (--shards) is roce.Options.Shards of the device(s) the
	// command opens: Loopback's two, or Perf's when run from the command
	// line (0: the default).
	Shards int
	// Queues (--queues) is the number of receive queues of the kernel
	// UDP link(s) the command opens (udplink.Options.Queues; 0: one).
	Queues int
}

// timed reports whether a bandwidth run is bounded by time, not Iters.
func (c *PerfConfig) timed() bool { return c.Duration > 0 }

// PerfResult is one size's outcome.
type PerfResult struct {
	Test    string                 `json:"test"`
	Role    string                 `json:"role"`
	Size    uint64                 `json:"size"`
	Iters   uint64                 `json:"iterations"`
	MTU     int                    `json:"mtu"`
	BW      *perftest.BWReport     `json:"bw,omitempty"`
	Lat     *perftest.LatencyStats `json:"latency,omitempty"`
	Remote  perftest.Dest          `json:"-"`
	Local   perftest.Dest          `json:"-"`
	Elapsed time.Duration          `json:"elapsed_ns"`
	// DataErrors counts messages whose received bytes were not the
	// pattern the peer is known to send (goroce peers only).
	DataErrors int `json:"data_errors"`
}

func (c *PerfConfig) defaults() error {
	if c.Verb == perftest.Atomic {
		if c.Size != 0 && c.Size != atomicSize {
			return fmt.Errorf("Message size cannot be changed for Atomic tests")
		}
		c.Size = atomicSize
		if c.AtomicOp != perftest.CmpAndSwap {
			c.AtomicOp = perftest.FetchAndAdd
		}
	}
	if c.Size == 0 {
		c.Size = defSizeBW
		if c.Latency {
			c.Size = defSizeLat
		}
	}
	if c.Iters == 0 {
		c.Iters = defIters
	}
	if c.Latency && c.Iters < 5 {
		return fmt.Errorf("latency tests need at least 5 iterations")
	}
	if err := c.bwOptions(); err != nil {
		return err
	}
	userCQMod := c.CQMod != 0
	if c.TxDepth == 0 {
		c.TxDepth = defTxBW
		if c.Latency {
			c.TxDepth = 1
		}
	}
	if c.TxDepth > c.Iters && !c.timed() {
		c.TxDepth = c.Iters
	}
	if c.RxDepth == 0 {
		c.RxDepth = defRxSend
		if c.Verb != perftest.Send {
			c.RxDepth = 1
		}
	}
	if c.Verb == perftest.Send && c.RxDepth > c.Iters && !c.timed() {
		c.RxDepth = c.Iters
	}
	if c.CQMod == 0 {
		c.CQMod = defCQMod
	}
	if c.Size > cqModMaxSize && !c.RunAll && !c.Events && !userCQMod {
		c.CQMod = 1
	}
	if c.PostList > 1 {
		if c.PostList > c.TxDepth {
			return fmt.Errorf("post list %d is larger than the TX depth %d", c.PostList, c.TxDepth)
		}
		if !c.timed() && c.Iters%c.PostList != 0 {
			return fmt.Errorf("Number of iterations must be a multiple of post list size")
		}
		if !userCQMod {
			c.CQMod = c.PostList // "CQ moderation will be the size of the post list"
		} else if c.PostList%c.CQMod != 0 {
			return fmt.Errorf("Post list size must be a multiple of CQ moderation")
		}
	}
	if c.CQMod > c.TxDepth {
		c.CQMod = c.TxDepth
	}
	if c.RunAll && c.Verb == perftest.Send {
		return fmt.Errorf("-a with send tests is not supported")
	}
	return nil
}

// bwOptions checks and completes the options of bandwidth tests (-q, -D,
// --run_infinitely, -b, -N, -l) and -I, -u, with perftest's messages where
// it refuses the same.
func (c *PerfConfig) bwOptions() error {
	if c.NumQPs == 0 {
		c.NumQPs = 1
	}
	if c.PostList == 0 {
		c.PostList = 1
	}
	if c.NumQPs < 0 || c.PostList < 0 || c.Inline < 0 || c.Duration < 0 {
		return fmt.Errorf("negative -q, -l, -I or -D")
	}
	switch {
	case c.Latency && c.NumQPs > 1:
		return fmt.Errorf("Multiple QPs only available on bw tests")
	case c.Latency && c.Duplex:
		return fmt.Errorf("Bidirectional is only available in BW test")
	case c.Latency && c.NoPeak:
		return fmt.Errorf("NoPeak only valid for BW tests")
	case c.Latency && c.PostList > 1:
		return fmt.Errorf("Post list is supported in BW tests only")
	case c.Latency && c.RunInfinitely:
		return fmt.Errorf("run_infinitely exists only in BW tests for now.")
	case c.Latency && c.Duration > 0:
		return fmt.Errorf("-D: duration runs are bandwidth tests here")
	case c.Inline > MaxInline:
		return fmt.Errorf("-I %d: at most %d (the largest inline payload of a goroce QP)", c.Inline, MaxInline)
	case c.Inline > 0 && (c.Verb == perftest.Read || c.Verb == perftest.Atomic):
		return fmt.Errorf("Inline feature not available on READ/Atomic verbs")
	case c.NumQPs > 1 && (c.DC || c.RDMACM):
		return fmt.Errorf("-q: several QPs run over RC with the Ethernet exchange only (no -R, no DC)")
	case c.Duplex && c.Verb == perftest.Send:
		return fmt.Errorf("-b: bidirectional send is not implemented here (write, read and atomic are)")
	case c.Duplex && (c.DC || c.RunAll || c.RunInfinitely):
		return fmt.Errorf("-b: not with DC, -a or --run_infinitely")
	case c.RunInfinitely && c.Verb == perftest.Send:
		return fmt.Errorf("--run_infinitely: write, read and atomic tests only here")
	case (c.RunInfinitely || c.Duration > 0) && c.Events:
		return fmt.Errorf("Duration mode doesn't work with events.")
	case (c.RunInfinitely || c.Duration > 0) && c.RunAll:
		return fmt.Errorf("-a runs a fixed number of iterations: not with -D or --run_infinitely")
	}
	if c.NumQPs > 1 {
		// Each QP has a buffer of two halves, each the largest message or
		// the page it cycles in.
		half := max(c.Size, perftest.DefaultCycleBuffer)
		if c.RunAll {
			half = maxRunAllSize
		}
		if err := cliflag.CheckMemory(uint64(c.NumQPs) * 2 * uint64(half)); err != nil {
			return fmt.Errorf("-q %d QPs with buffers of 2 × %d bytes: %w", c.NumQPs, half, err)
		}
	}
	if c.RunInfinitely && c.Duration == 0 {
		c.Duration = defDuration
	}
	if c.timed() {
		c.NoPeak = true // perftest: "BW peak won't be measured in this run"
	}
	switch {
	case c.QPTimeout == 0:
		c.QPTimeout = defQPTimeout
	case c.QPTimeout < 0:
		c.QPTimeout = 0
	case c.QPTimeout > 31:
		return fmt.Errorf("-u %d: the ACK timeout is a 5-bit exponent (0 to 31)", c.QPTimeout)
	}
	if c.HasTOS && (c.TOS < 0 || c.TOS > 255) {
		return fmt.Errorf("-T %d: a TOS byte is 0 to 255", c.TOS)
	}
	return nil
}

// testName is perftest's program name for the test.
func testName(v perftest.Verb, lat bool) string {
	n := [...]string{"send", "write", "read", "atomic"}[v]
	if lat {
		return "ib_" + n + "_lat"
	}
	return "ib_" + n + "_bw"
}

// inc rounds size up to the cache line (perftest's INC).
func inc(size, line int) int {
	if size > line {
		return (size + line - 1) / line * line
	}
	return line
}

// perf is one side of a test in progress.
type perf struct {
	cfg     PerfConfig
	dev     *roce.Device
	pd      *roce.PD
	scq     *roce.CQ
	rcq     *roce.CQ
	q       *roce.QP
	mr      *roce.MR
	buf     []byte
	half    int // bytes per half: the local half, then the remote-visible one
	cycle   int
	line    int
	mtu     ib.MTU
	role    perftest.Role
	me, rem perftest.Dest
	size    int
	out     io.Writer
	params  *perftest.Params
	// goroce peers fill their send half with a known pattern; set when the
	// peer is known to be one (loopback), so received data can be checked.
	checkData  bool
	dataErrors int
	// Work requests reused for every post: the device copies them, and the
	// measured loops should not allocate.
	wr   roce.SendWR
	sge  [1]roce.SGE
	rwr  roce.RecvWR
	rsge [1]roce.SGE
	// --connection DC: the DCI is q; receives go to the DCT's SRQ.
	dct *roce.QP
	srq *roce.SRQ
	ah  *roce.AH
	// -q: the further QPs, each a perf of its own (CQs, buffer, QP,
	// records) sharing the PD and the layout; nil in the lanes themselves.
	lanes []*perf
	// wrs are the work requests of one post list (-l).
	wrs []roce.SendWR
	// park makes the bandwidth loops wait for completions on the CQ at
	// once, as with -e, instead of busy polling first (see runBW).
	park bool
	// afterRun, if set, ends what the run left going (a timed send
	// server's receiving), before the QPs close.
	afterRun func()
}

// allLanes returns the QPs of the test, p first.
func (p *perf) allLanes() []*perf {
	return append([]*perf{p}, p.lanes...)
}

// addLane creates QP i > 1 of a multi-QP test with its own CQs, buffer and
// QP, laid out as the first; closers collects what to close, in order.
func (p *perf) addLane(qpCap roce.QPCap, depth int, closers *[]func()) (*perf, error) {
	l := &perf{cfg: p.cfg, dev: p.dev, pd: p.pd, half: p.half, cycle: p.cycle, line: p.line, mtu: p.mtu,
		role: p.role, size: p.size, out: p.out, params: p.params, checkData: p.checkData}
	var err error
	if l.scq, err = p.dev.CreateCQ(depth); err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { l.scq.Close() })
	if l.rcq, err = p.dev.CreateCQ(depth); err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { l.rcq.Close() })
	l.buf = make([]byte, 2*l.half)
	access := roce.AccessLocalWrite | roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic
	if l.mr, err = p.pd.RegisterMR(l.buf, access); err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { l.mr.Close() })
	if l.q, err = p.pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: l.scq, RecvCQ: l.rcq, Cap: qpCap}); err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { l.q.Close() })
	fillPattern(l.buf[:l.half], 1)
	fillPattern(l.buf[l.half:], 2)
	l.me = perftest.Dest{OutReads: p.me.OutReads, PSN: randPSN(), QPN: l.q.QPN(), RKey: l.mr.RKey(),
		VAddr: l.mr.Addr() + uint64(l.half), GID: p.me.GID, GIDIndex: p.me.GIDIndex}
	return l, nil
}

// Perf runs one perftest test on dev against the peer behind oob, writing
// perftest's output (or, with asJSON, one JSON object per size) to out.
func Perf(ctx context.Context, dev *roce.Device, oob OOB, cfg PerfConfig, out io.Writer, asJSON bool) ([]PerfResult, error) {
	return perfRun(ctx, dev, oob, cfg, out, asJSON, false)
}

func perfRun(ctx context.Context, dev *roce.Device, oob OOB, cfg PerfConfig, out io.Writer, asJSON, checkData bool) ([]PerfResult, error) {
	noPeakWarning := (cfg.Duration > 0 || cfg.RunInfinitely) && !cfg.NoPeak
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &perf{cfg: cfg, dev: dev, out: out, checkData: checkData}
	if asJSON {
		p.out = io.Discard
	}
	if noPeakWarning {
		fmt.Fprint(p.out, " WARNING: BW peak won't be measured in this run.\n")
	}
	p.role = perftest.Client
	if oob.IsServer() {
		p.role = perftest.Server
	}
	mtu := cfg.MTU
	port := dev.QueryPort()
	if mtu == 0 {
		mtu = port.ActiveMTU
	}
	if mtu > port.ActiveMTU {
		return nil, fmt.Errorf("MTU %d is larger than the port's active MTU %d", mtu.Bytes(), port.ActiveMTU.Bytes())
	}
	gid, _, err := localGID(dev, cfg.GIDIndex)
	if err != nil {
		return nil, fmt.Errorf("GID index %d: %w", cfg.GIDIndex, err)
	}
	outReads := 1
	if cfg.Verb == perftest.Read || cfg.Verb == perftest.Atomic {
		outReads = ourOutReads
	}
	p.params = &perftest.Params{RDMACM: oob.RDMACM != nil,
		Verb: cfg.Verb, AtomicOp: cfg.AtomicOp, Latency: cfg.Latency, Role: p.role,
		Device: cfg.Device, NumQPs: cfg.NumQPs, Conn: connName(cfg.DC), Transport: "IB", PCIeRelax: "OFF",
		UseEvent: cfg.Events, TxDepth: cfg.TxDepth, RxDepth: cfg.RxDepth, CQMod: cfg.CQMod,
		LinkType: "Ethernet", GIDIndex: cfg.GIDIndex, OutReads: outReads, ReportGbits: cfg.Gbits,
		InlineSize: cfg.Inline, Duplex: cfg.Duplex, PostList: cfg.PostList, TOS: cfg.TOS, HasTOS: cfg.HasTOS,
	}
	if p.params.Device == "" {
		p.params.Device = dev.Info().Name
	}
	fmt.Fprint(p.out, perftest.Preamble(p.params))

	if p.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	defer p.pd.Close()
	depth := max(cfg.TxDepth, cfg.RxDepth) + 16
	if p.scq, err = dev.CreateCQ(depth); err != nil {
		return nil, err
	}
	defer p.scq.Close()
	if p.rcq, err = dev.CreateCQ(depth); err != nil {
		return nil, err
	}
	defer p.rcq.Close()
	qpCap := roce.QPCap{MaxSendWR: cfg.TxDepth + 1, MaxRecvWR: max(cfg.RxDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1,
		MaxInlineData: cfg.Inline}

	var c *perftest.Conn
	var sess *cmSession
	testQP := cm.QPOptions{PD: p.pd, SendCQ: p.scq, RecvCQ: p.rcq, Cap: qpCap}
	if oob.RDMACM != nil {
		// The QP's connection is closed before the PD and CQs it uses.
		sess = &cmSession{cfg: *oob.RDMACM, dev: dev}
		defer sess.close()
		if c, err = sess.connectControl(ctx, testQP, uint8(outReads)); err != nil {
			return nil, err
		}
	} else {
		nc, err := oob.connect(ctx)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		c = perftest.NewConn(nc, p.role)
	}
	if p.cycle, p.line, p.mtu, err = c.Setup(ctx, mtu); err != nil {
		return nil, err
	}
	p.params.MTU = p.mtu.Bytes()

	// Buffers as perftest lays them out: two halves, each the larger of the
	// message and the cycle buffer, rounded to the cache line; the peer
	// targets the second.
	p.size = cfg.Size
	maxSize := cfg.Size
	if cfg.RunAll {
		maxSize = maxRunAllSize
	}
	p.half = inc(max(maxSize, p.cycle), p.line)
	p.buf = make([]byte, 2*p.half)
	access := roce.AccessLocalWrite | roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic
	if p.mr, err = p.pd.RegisterMR(p.buf, access); err != nil {
		return nil, err
	}
	defer p.mr.Close()
	if cfg.DC {
		if sess != nil {
			return nil, fmt.Errorf("DC does not run over rdma_cm")
		}
		defer p.closeDC()
		if err := p.dcQPs(qpCap); err != nil {
			return nil, err
		}
		defer p.q.Close()
	} else if sess == nil {
		if p.q, err = p.pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: p.scq, RecvCQ: p.rcq, Cap: qpCap}); err != nil {
			return nil, err
		}
		defer p.q.Close()
	}
	fillPattern(p.buf[:p.half], 1)
	fillPattern(p.buf[p.half:], 2)

	p.me = perftest.Dest{
		OutReads: uint16(outReads), PSN: randPSN(),
		RKey: p.mr.RKey(), VAddr: p.mr.Addr() + uint64(p.half), GID: gid, GIDIndex: int32(cfg.GIDIndex),
	}
	if p.q != nil {
		p.me.QPN = p.q.QPN()
	}
	if p.dct != nil {
		p.me.QPN = p.dct.QPN() // the peer's DCI targets our DCT
	}
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	var more []perftest.Dest
	for i := 1; i < cfg.NumQPs; i++ {
		l, err := p.addLane(qpCap, depth, &closers)
		if err != nil {
			return nil, fmt.Errorf("QP %d: %w", i+1, err)
		}
		p.lanes = append(p.lanes, l)
		more = append(more, l.me)
	}
	fmt.Fprint(p.out, perftest.Header(p.params))

	// --run_infinitely ends its run when ctx does; the exchanges after it
	// then still need a context, bounded by drainTimeout.
	runCtx, scriptCtx := ctx, ctx
	var running atomic.Bool
	if cfg.RunInfinitely {
		sc, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		stop := context.AfterFunc(ctx, func() {
			if !running.Load() {
				cancel()
				return
			}
			time.AfterFunc(drainTimeout, cancel)
		})
		defer stop()
		scriptCtx = sc
	}

	var results []PerfResult
	hooks := perftest.Hooks{
		Connect: p.connect,
		CMConnect: func(ctx context.Context) (perftest.Dest, error) {
			conn, err := sess.connectTest(ctx, testQP, uint8(outReads), p.mtu, uint8(cfg.TOS))
			if err != nil {
				return p.me, err
			}
			p.q = conn.QP()
			p.me.QPN, p.me.PSN = p.q.QPN(), p.q.Attr().SQPSN
			return p.me, nil
		},
		More: more,
		ConnectMore: func(ctx context.Context, rems []perftest.Dest) error {
			if len(rems) != len(p.lanes) {
				return fmt.Errorf("%d further records for %d further QPs", len(rems), len(p.lanes))
			}
			for i, l := range p.lanes {
				l.rem = rems[i]
				if err := l.connect(ctx, rems[i]); err != nil {
					return fmt.Errorf("QP %d: %w", i+2, err)
				}
			}
			return nil
		},
		Duplex: cfg.Duplex,
		Addresses: func(local, remote perftest.Dest) {
			p.rem = remote
			fmt.Fprint(p.out, perftest.AddrLines(p.params, false, local))
			for _, l := range p.lanes {
				fmt.Fprint(p.out, perftest.AddrLines(p.params, false, l.me))
			}
			fmt.Fprint(p.out, perftest.AddrLines(p.params, true, remote))
			for _, l := range p.lanes {
				fmt.Fprint(p.out, perftest.AddrLines(p.params, true, l.rem))
			}
			if !(cfg.Latency && p.role == perftest.Server && cfg.Verb != perftest.Send && cfg.Verb != perftest.Write) {
				fmt.Fprint(p.out, perftest.ResultColumns(p.params))
			}
		},
		PrepareRecv: func(ctx context.Context) error {
			for _, l := range p.allLanes() {
				if err := l.postRecvs(cfg.RxDepth); err != nil {
					return err
				}
			}
			return nil
		},
	}
	if perftest.HasRun(cfg.Verb, cfg.Latency, p.role) || cfg.Duplex {
		hooks.Run = func(ctx context.Context) (perftest.BWReport, error) {
			if cfg.RunInfinitely {
				running.Store(true)
				ctx = runCtx
			}
			sizes := []int{cfg.Size}
			if cfg.RunAll {
				sizes = sizes[:0]
				for i := 1; i < 24; i++ {
					sizes = append(sizes, 1<<i)
				}
			}
			var last perftest.BWReport
			for _, s := range sizes {
				p.size = s
				r, err := p.run(ctx)
				if err != nil {
					return last, err
				}
				results = append(results, r)
				if r.BW != nil {
					last = *r.BW
					// Duplex rows are the sum, printed after the exchange;
					// run_infinitely printed its rows as it went.
					if !cfg.Duplex && !cfg.RunInfinitely {
						fmt.Fprint(p.out, perftest.FormatBW(p.params, *r.BW))
					}
				}
				if r.Lat != nil {
					fmt.Fprint(p.out, r.Lat.Format())
				}
			}
			return last, nil
		}
	}
	defer func() {
		if p.afterRun != nil {
			p.afterRun()
		}
	}()
	o, err := perftest.RunScript(scriptCtx, c, cfg.Verb, cfg.Latency, p.me, hooks)
	if err != nil {
		return results, err
	}
	switch {
	case o.RemoteReport != nil && cfg.Duplex:
		// print_full_bw_report(my, rem): the two directions' sum.
		rep := o.Report
		rem := *o.RemoteReport
		rep.BWPeak += rem.BWPeak
		rep.BWAvg += rem.BWAvg
		rep.MsgRate += rem.MsgRate
		fmt.Fprint(p.out, perftest.FormatBW(p.params, rep))
		results = append(results, PerfResult{Size: rep.Size, Iters: rep.Iters, BW: &rep})
	case o.RemoteReport != nil && cfg.RunInfinitely:
		fmt.Fprint(p.out, " Client closed connection\n")
	case o.RemoteReport != nil:
		fmt.Fprint(p.out, perftest.FormatBW(p.params, *o.RemoteReport))
		rep := *o.RemoteReport
		results = append(results, PerfResult{Size: rep.Size, Iters: rep.Iters, BW: &rep})
	}
	fmt.Fprint(p.out, perftest.Line)
	for i := range results {
		results[i].Test = testName(cfg.Verb, cfg.Latency)
		results[i].Role = p.role.String()
		results[i].MTU = p.mtu.Bytes()
		results[i].Local, results[i].Remote = p.me, o.Remote
	}
	if asJSON {
		enc := json.NewEncoder(out)
		for _, r := range results {
			if err := enc.Encode(r); err != nil {
				return results, err
			}
		}
	}
	return results, nil
}

// fillPattern writes the bytes goroce puts in its buffers: position- and
// seed-dependent, so a misplaced, truncated or missing transfer shows. The
// local half has seed 1, the half the peer targets seed 2.
func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i>>8) ^ byte(i*13) ^ seed*0x5b
	}
}

func (p *perf) connect(ctx context.Context, rem perftest.Dest) error {
	if p.dct != nil {
		p.rem = rem
		return p.connectDC(ctx)
	}
	err := p.q.Connect(ctx, &roce.ConnectAttr{
		RemoteQPN: rem.QPN, RemoteGID: rem.GID, RemotePSN: rem.PSN, LocalPSN: p.me.PSN,
		SGID: p.me.GID, PathMTU: p.mtu, Timeout: uint8(p.cfg.QPTimeout), RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		RdAtomic: ourOutReads, HopLimit: 0xFF, TrafficClass: uint8(p.cfg.TOS), NoDefaults: true,
	})
	if err != nil {
		return fmt.Errorf("Unable to Connect the HCA's through the link: %w", err)
	}
	return nil
}

// postRecvs posts n receives into the remote-visible half.
func (p *perf) postRecvs(n int) error {
	for i := 0; i < n; i++ {
		if err := p.postRecv(uint64(i)); err != nil {
			return err
		}
	}
	return nil
}

// postRecv posts one receive into the remote-visible half.
func (p *perf) postRecv(id uint64) error {
	p.rsge[0] = p.mr.SGE(p.half, p.size)
	p.rwr = roce.RecvWR{ID: id, SGL: p.rsge[:]}
	post := p.q.PostRecv
	if p.srq != nil {
		post = p.srq.PostRecv
	}
	if err := post(&p.rwr); err != nil {
		return fmt.Errorf("Couldn't post recv: %w", err)
	}
	return nil
}

func (p *perf) run(ctx context.Context) (PerfResult, error) {
	r := PerfResult{Size: uint64(p.size), Iters: uint64(p.cfg.Iters)}
	var err error
	switch {
	case p.cfg.Latency && p.cfg.Verb == perftest.Write:
		err = p.latWrite(ctx, &r)
	case p.cfg.Latency && p.cfg.Verb == perftest.Send:
		err = p.latSend(ctx, &r)
	case p.cfg.Latency:
		err = p.latRead(ctx, &r)
	default:
		err = p.runBW(ctx, &r)
	}
	r.DataErrors = 0
	for _, l := range p.allLanes() {
		r.DataErrors += l.dataErrors
	}
	return r, err
}

// remoteAddr returns the peer address of message i of a bandwidth run:
// perftest cycles through the cycle buffer in cache-line steps when the
// message fits in half of it.
func (p *perf) remoteAddr(i int) uint64 {
	step := inc(p.size, p.line)
	if p.cfg.Verb != perftest.Atomic && p.size > p.cycle/2 {
		return p.rem.VAddr
	}
	per := p.cycle / step
	if per == 0 {
		return p.rem.VAddr
	}
	return p.rem.VAddr + uint64((i%per)*step)
}

func (p *perf) sendWR(i int, signaled bool) *roce.SendWR {
	p.fillWR(&p.wr, i, signaled)
	return &p.wr
}

// fillWR sets wr to message i; the work requests share p.sge.
func (p *perf) fillWR(wr *roce.SendWR, i int, signaled bool) {
	p.sge[0] = p.mr.SGE(0, p.size)
	*wr = roce.SendWR{ID: uint64(i), SGL: p.sge[:]}
	if signaled {
		wr.Flags = roce.SendSignaled
	}
	switch p.cfg.Verb {
	case perftest.Send:
		wr.Opcode = roce.WRSend
	case perftest.Write:
		wr.Opcode = roce.WRRDMAWrite
	case perftest.Read:
		wr.Opcode = roce.WRRDMARead
	case perftest.Atomic:
		if p.cfg.AtomicOp == perftest.CmpAndSwap {
			wr.Opcode = roce.WRAtomicCmpAndSwp
			wr.Swap = 0
		} else {
			wr.Opcode = roce.WRAtomicFetchAndAdd
			wr.CompareAdd = 1
		}
	}
	if p.size <= p.cfg.Inline && (p.cfg.Verb == perftest.Send || p.cfg.Verb == perftest.Write) {
		// Copied into the send queue now, not read from the MR later.
		wr.Flags |= roce.SendInline
		wr.Inline, wr.SGL = p.buf[:p.size], nil
	}
	if p.ah != nil {
		wr.AH, wr.RemoteQPN, wr.DCKey = p.ah, p.rem.QPN, PerfDCKey
	}
	if p.cfg.Verb != perftest.Send {
		wr.RKey = p.rem.RKey
		if p.cfg.Latency {
			wr.RemoteAddr = p.rem.VAddr
		} else {
			wr.RemoteAddr = p.remoteAddr(i)
		}
	}
}

// bwCtl coordinates the QPs of one bandwidth run.
type bwCtl struct {
	start time.Time // the origin of every lane's timestamps
	timed bool      // -D or --run_infinitely: run until stop
	stop  atomic.Bool
	count atomic.Uint64 // messages completed (sender) or received, all QPs
}

// laneRun is one QP's part of a bandwidth run.
type laneRun struct {
	t           perftest.BWTimes // sender, counted run
	first, last time.Duration    // receiver: first and last receive
	n           int
	err         error
}

// parkLanes says whether the waiters of a bandwidth run of lanes QPs, a
// goroutine each, park rather than spin with procs Ps (runBW).
func parkLanes(lanes, procs int) bool { return lanes > 1 && lanes >= procs }

// runBW runs a bandwidth test's data phase on every QP at once, one
// goroutine each, and sums the result as perftest does: one report over
// all QPs' messages, from the first post to the last completion.
func (p *perf) runBW(ctx context.Context, r *PerfResult) error {
	lanes := p.allLanes()
	// perftest polls all its QPs from one thread; here each QP has a
	// goroutine, and as many of them spinning as there are Ps starve those
	// with work to do (the device's among them: the peer's receive
	// goroutine, which no waiter polls for): they park instead, as the
	// device's own further waiters do. A lone QP spins: its waiter polls
	// the link and does the device's work itself. (Two QPs spinning on two
	// Ps halved write-bw -q 2 on loopback against -q 1 and -q 3.)
	park := parkLanes(len(lanes), runtime.GOMAXPROCS(0))
	for _, l := range lanes {
		l.size, l.park = p.size, park
	}
	recv := p.cfg.Verb == perftest.Send && p.role == perftest.Server
	ctl := &bwCtl{timed: p.cfg.timed()}
	res := make([]laneRun, len(lanes))
	lctx := ctx
	var stopLanes context.CancelFunc = func() {}
	if ctl.timed {
		// The lanes end on ctl.stop; an interrupt (ctx) ends the run
		// through the timer, and the senders then drain.
		lctx, stopLanes = context.WithCancel(context.WithoutCancel(ctx))
	}
	defer stopLanes()
	ctl.start = time.Now()
	run := func(i int) {
		if recv {
			res[i] = lanes[i].bwServer(lctx, ctl)
		} else {
			res[i] = lanes[i].bwClient(lctx, ctl)
		}
	}
	var timedRep perftest.BWReport
	var timerErr error
	if len(lanes) == 1 && !ctl.timed {
		run(0)
	} else {
		var wg sync.WaitGroup
		for i := range lanes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				run(i)
			}()
		}
		if ctl.timed {
			timedRep, timerErr = p.timer(ctx, ctl)
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			end := func() {
				ctl.stop.Store(true)
				select {
				case <-done:
				case <-time.After(drainTimeout):
				}
				stopLanes()
				<-done
			}
			if recv && timerErr == nil {
				// The sender's clock is not ours: keep receiving (and
				// reposting) until the test closes, so that what it
				// still sends finds receives.
				stop := stopLanes
				stopLanes = func() {}
				// A receive error shows as a short count (and at the
				// sender); the lanes' results are not read while they run.
				p.afterRun = func() { ctl.stop.Store(true); stop(); <-done }
				r.Iters, r.BW = timedRep.Iters, &timedRep
				r.Elapsed = time.Since(ctl.start)
				return nil
			}
			end()
		} else {
			wg.Wait()
		}
	}
	r.Elapsed = time.Since(ctl.start)
	for _, l := range res {
		if l.err != nil {
			return l.err
		}
	}
	if timerErr != nil {
		return timerErr
	}
	format := float64(1 << 20)
	if p.cfg.Gbits {
		format = 125e6
	}
	switch {
	case ctl.timed:
		r.Iters = timedRep.Iters
		r.BW = &timedRep
	case recv:
		first, last, n := res[0].first, res[0].last, 0
		for _, l := range res {
			first, last, n = min(first, l.first), max(last, l.last), n+l.n
		}
		sec := max((last - first).Seconds(), 1e-9)
		r.Iters = uint64(n)
		r.BW = &perftest.BWReport{Size: uint64(p.size), Iters: uint64(n),
			BWAvg: float64(p.size) * float64(n) / sec / format, MsgRate: float64(n) / sec / 1e6}
	default:
		t := res[0].t
		if len(res) > 1 {
			t = mergeTimes(res)
		}
		rep := perftest.BWReportFrom(uint64(p.size), p.cfg.CQMod, t, p.cfg.Gbits)
		if p.cfg.NoPeak {
			rep.BWPeak = 0
		}
		r.Iters = rep.Iters
		r.BW = &rep
	}
	return nil
}

// mergeTimes puts every QP's timestamps on one time line, in order, as
// perftest's single thread records them across its QPs.
func mergeTimes(res []laneRun) perftest.BWTimes {
	var t perftest.BWTimes
	for _, l := range res {
		t.Posted = append(t.Posted, l.t.Posted...)
		t.Completed = append(t.Completed, l.t.Completed...)
	}
	slices.Sort(t.Posted)
	slices.Sort(t.Completed)
	return t
}

// timer measures a timed run: with -D the messages of its middle (a
// quarter of the duration, perftest's margin, left out at each end); with
// --run_infinitely one report per period, printed, until ctx ends.
func (p *perf) timer(ctx context.Context, ctl *bwCtl) (perftest.BWReport, error) {
	format := float64(1 << 20)
	if p.cfg.Gbits {
		format = 125e6
	}
	report := func(n uint64, d time.Duration) perftest.BWReport {
		sec := max(d.Seconds(), 1e-9)
		return perftest.BWReport{Size: uint64(p.size), Iters: n,
			BWAvg: float64(p.size) * float64(n) / sec / format, MsgRate: float64(n) / sec / 1e6}
	}
	d := p.cfg.Duration
	if p.cfg.RunInfinitely {
		var last perftest.BWReport
		prev, at := ctl.count.Load(), time.Now()
		for sleepCtx(ctx, d) {
			c, now := ctl.count.Load(), time.Now()
			last = report(c-prev, now.Sub(at))
			fmt.Fprint(p.out, perftest.FormatBW(p.params, last))
			prev, at = c, now
		}
		return last, nil // an interrupt is how this run ends
	}
	margin := d / 4
	if !sleepCtx(ctx, margin) {
		return perftest.BWReport{}, ctx.Err()
	}
	c0, t0 := ctl.count.Load(), time.Now()
	if !sleepCtx(ctx, d-2*margin) {
		return perftest.BWReport{}, ctx.Err()
	}
	c1, t1 := ctl.count.Load(), time.Now()
	if !sleepCtx(ctx, margin) {
		return perftest.BWReport{}, ctx.Err()
	}
	return report(c1-c0, t1.Sub(t0)), nil
}

// sleepCtx sleeps for d unless ctx ends first; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// bwClient is run_iter_bw: keep up to TX depth messages outstanding, posted
// a post list (-l) at a time, a completion requested every CQ moderation
// messages and for the last. A timed run posts until ctl.stop, then waits
// for what it posted.
func (p *perf) bwClient(ctx context.Context, ctl *bwCtl) laneRun {
	var lr laneRun
	n := p.cfg.Iters
	if ctl.timed {
		n = math.MaxInt
	} else {
		lr.t = perftest.BWTimes{Posted: make([]time.Duration, n), Completed: make([]time.Duration, n)}
	}
	cqMod, list := p.cfg.CQMod, max(p.cfg.PostList, 1)
	if len(p.wrs) != list {
		p.wrs = make([]roce.SendWR, list)
	}
	var wc [16]roce.WorkCompletion
	scnt, ccnt := 0, 0
	signaledTo := -1 // the last signaled message posted
	for scnt < n || ccnt < n {
		if ctl.timed && ctl.stop.Load() {
			break
		}
		for scnt < n && scnt-ccnt+list <= p.cfg.TxDepth {
			now := time.Since(ctl.start)
			for k := range p.wrs {
				i := scnt + k
				signaled := i%cqMod == cqMod-1 || i == n-1
				if signaled {
					signaledTo = i
				}
				p.fillWR(&p.wrs[k], i, signaled)
				if !ctl.timed {
					lr.t.Posted[i] = now
				}
			}
			if _, err := p.q.PostSendBatch(p.wrs); err != nil {
				lr.err = fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
				return lr
			}
			scnt += list
		}
		if ccnt < n {
			k, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events || p.park, p.cfg.peer)
			if err != nil {
				if ctl.timed && ctl.stop.Load() {
					return lr // given up on after the measured window
				}
				lr.err = fmt.Errorf("after %d posted, %d completed: %w", scnt, ccnt, err)
				return lr
			}
			if c, err := p.completed(wc[:k], ccnt, n, lr.t.Completed, ctl); err != nil {
				lr.err = err
				return lr
			} else {
				ccnt = c
			}
		}
	}
	if ctl.timed {
		// Ask for a completion covering the tail, then wait for it.
		if scnt > ccnt && signaledTo < scnt-1 {
			if err := p.q.PostSend(p.sendWR(scnt, true)); err != nil {
				lr.err = fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
				return lr
			}
			scnt++
		}
		for ccnt < scnt {
			k, err := pollWait(ctx, p.scq, wc[:], false, p.cfg.peer)
			if err != nil {
				return lr // given up on: the QP's close flushes the rest
			}
			if ccnt, err = p.completed(wc[:k], ccnt, scnt, nil, ctl); err != nil {
				lr.err = err
				return lr
			}
		}
		return lr
	}
	if p.checkData && p.cfg.Verb == perftest.Read {
		p.checkPattern(p.buf[:p.size], 2, int(p.remoteAddr(n-1)-p.rem.VAddr))
	}
	return lr
}

// completed takes a batch of send completions: each covers every message
// up to its own. It returns the new count of completed messages and
// records their time in times, if set.
func (p *perf) completed(wc []roce.WorkCompletion, ccnt, n int, times []time.Duration, ctl *bwCtl) (int, error) {
	now := time.Since(ctl.start)
	for i := range wc {
		if wc[i].Status != roce.WCSuccess {
			return ccnt, &WCError{wc[i]}
		}
		end := min(int(wc[i].WRID)+1, n)
		for j := ccnt; j < end && times != nil; j++ {
			times[j] = now
		}
		if end > ccnt {
			ctl.count.Add(uint64(end - ccnt))
			ccnt = end
		}
	}
	return ccnt, nil
}

// checkPattern compares b with the pattern a goroce peer's buffer holds
// at offset off of the half with seed.
func (p *perf) checkPattern(b []byte, seed byte, off int) {
	want := make([]byte, off+len(b))
	fillPattern(want, seed)
	for i := range b {
		if b[i] != want[off+i] {
			p.dataErrors++
			return
		}
	}
}

// bwServer is run_iter_bw_server: receive the client's messages, keeping
// receives posted, and time from the first to the last. A timed run
// receives until ctl.stop.
func (p *perf) bwServer(ctx context.Context, ctl *bwCtl) laneRun {
	var lr laneRun
	n := p.cfg.Iters
	var wc [16]roce.WorkCompletion
	rcnt := 0
	posted := p.cfg.RxDepth
	for ctl.timed || rcnt < n {
		k, err := pollWait(ctx, p.rcq, wc[:], p.cfg.Events || p.park, p.cfg.peer)
		if err != nil {
			if ctl.timed && ctl.stop.Load() {
				return lr
			}
			lr.err = fmt.Errorf("after %d received: %w", rcnt, err)
			return lr
		}
		now := time.Since(ctl.start)
		if rcnt == 0 {
			lr.first = now
		}
		for i := 0; i < k; i++ {
			if wc[i].Status != roce.WCSuccess {
				lr.err = &WCError{wc[i]}
				return lr
			}
			if p.checkData && rcnt == n-1 {
				p.checkPattern(p.buf[p.half:p.half+p.size], 1, 0)
			}
			rcnt++
			if posted < n || ctl.timed {
				if err := p.postRecv(wc[i].WRID); err != nil {
					lr.err = fmt.Errorf("rcnt=%d: %w", rcnt, err)
					return lr
				}
				posted++
			}
		}
		ctl.count.Add(uint64(k))
		lr.last = now
	}
	lr.n = rcnt
	return lr
}

// byteAt loads the byte at b[i] atomically (the device writes it from
// another goroutine), through the aligned 32-bit word holding it.
func byteAt(b []byte, i int) byte {
	mis := int(uintptr(unsafe.Pointer(&b[i])) & 3)
	if i-mis < 0 || i-mis+4 > len(b) {
		return b[i]
	}
	word := (*uint32)(unsafe.Pointer(&b[i-mis]))
	var w [4]byte
	binary.NativeEndian.PutUint32(w[:], atomic.LoadUint32(word))
	return w[mis]
}

// latWrite is run_iter_lat_write: each side RDMA-writes a message whose
// last byte is the iteration number into the other's buffer and spins on
// its own buffer's last byte for the reply; the server writes first.
func (p *perf) latWrite(ctx context.Context, r *PerfResult) error {
	n := p.cfg.Iters
	posted := make([]time.Duration, 0, n)
	pollAt := p.half + p.size - 1
	var wc [1]roce.WorkCompletion
	start := time.Now()
	scnt, rcnt, ccnt := 0, 0, 0
	for scnt < n || ccnt < n || rcnt < n {
		if rcnt < n && !(scnt < 1 && p.role == perftest.Server) {
			rcnt++
			want := byte(rcnt)
			for spins := 0; byteAt(p.buf, pollAt) != want; spins++ {
				// Take the peer's WRITE in if nobody else does: the
				// device's receive goroutine may wait for a P this
				// loop and the peer's hold (Device.Progress).
				if spins&7 == 7 {
					p.dev.Progress()
				}
				if spins&1023 == 1023 {
					if err := ctx.Err(); err != nil {
						return fmt.Errorf("waiting for write %d: %w", rcnt, err)
					}
					runtime.Gosched()
				}
			}
		}
		if scnt < n {
			posted = append(posted, time.Since(start))
			scnt++
			p.buf[p.size-1] = byte(scnt)
			wr := p.sendWR(scnt, true)
			if err := p.q.PostSend(wr); err != nil {
				return fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
			}
		}
		if ccnt < n {
			if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events, p.cfg.peer); err != nil {
				return err
			}
			if wc[0].Status != roce.WCSuccess {
				return &WCError{wc[0]}
			}
			ccnt++
		}
	}
	r.Elapsed = time.Since(start)
	st, err := perftest.LatencyFrom(uint64(p.size), posted, 2)
	if err != nil {
		return err
	}
	r.Lat = &st
	if p.checkData && p.size > 1 {
		p.checkPattern(p.buf[p.half:p.half+p.size-1], 1, 0)
	}
	return nil
}

// latSend is run_iter_lat_send: SEND ping-pong, the client first.
func (p *perf) latSend(ctx context.Context, r *PerfResult) error {
	n := p.cfg.Iters
	posted := make([]time.Duration, 0, n)
	var wc [1]roce.WorkCompletion
	start := time.Now()
	scnt, rcnt := 0, 0
	for scnt < n || rcnt < n {
		if rcnt < n && !(scnt < 1 && p.role == perftest.Client) {
			if _, err := pollWait(ctx, p.rcq, wc[:], p.cfg.Events, p.cfg.peer); err != nil {
				return fmt.Errorf("after %d received: %w", rcnt, err)
			}
			if wc[0].Status != roce.WCSuccess {
				return &WCError{wc[0]}
			}
			rcnt++
			if p.checkData {
				p.checkPattern(p.buf[p.half:p.half+p.size], 1, 0)
			}
			if rcnt+p.cfg.RxDepth <= n {
				if err := p.postRecv(wc[0].WRID); err != nil {
					return fmt.Errorf("rcnt=%d: %w", rcnt, err)
				}
			}
		}
		if scnt < n {
			posted = append(posted, time.Since(start))
			scnt++
			wr := p.sendWR(scnt, true)
			if err := p.q.PostSend(wr); err != nil {
				return fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
			}
			if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events, p.cfg.peer); err != nil {
				return err
			}
			if wc[0].Status != roce.WCSuccess {
				return &WCError{wc[0]}
			}
		}
	}
	r.Elapsed = time.Since(start)
	st, err := perftest.LatencyFrom(uint64(p.size), posted, 2)
	if err != nil {
		return err
	}
	r.Lat = &st
	return nil
}

// latRead is run_iter_lat for READ and atomics: one operation at a time,
// the client only.
func (p *perf) latRead(ctx context.Context, r *PerfResult) error {
	n := p.cfg.Iters
	posted := make([]time.Duration, 0, n)
	var wc [1]roce.WorkCompletion
	start := time.Now()
	for scnt := 0; scnt < n; scnt++ {
		posted = append(posted, time.Since(start))
		wr := p.sendWR(scnt, true)
		if err := p.q.PostSend(wr); err != nil {
			return fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
		}
		if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events, p.cfg.peer); err != nil {
			return err
		}
		if wc[0].Status != roce.WCSuccess {
			return &WCError{wc[0]}
		}
	}
	r.Elapsed = time.Since(start)
	st, err := perftest.LatencyFrom(uint64(p.size), posted, 1)
	if err != nil {
		return err
	}
	r.Lat = &st
	if p.checkData && p.cfg.Verb == perftest.Read {
		p.checkPattern(p.buf[:p.size], 2, 0)
	}
	return nil
}
