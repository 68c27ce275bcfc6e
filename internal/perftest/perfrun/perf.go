// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/perftest"
	"github.com/goroce/goroce/roce"
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
}

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
	userCQMod := c.CQMod != 0
	if c.TxDepth == 0 {
		c.TxDepth = defTxBW
		if c.Latency {
			c.TxDepth = 1
		}
	}
	if c.TxDepth > c.Iters {
		c.TxDepth = c.Iters
	}
	if c.RxDepth == 0 {
		c.RxDepth = defRxSend
		if c.Verb != perftest.Send {
			c.RxDepth = 1
		}
	}
	if c.Verb == perftest.Send && c.RxDepth > c.Iters {
		c.RxDepth = c.Iters
	}
	if c.CQMod == 0 {
		c.CQMod = defCQMod
	}
	if c.Size > cqModMaxSize && !c.RunAll && !c.Events && !userCQMod {
		c.CQMod = 1
	}
	if c.CQMod > c.TxDepth {
		c.CQMod = c.TxDepth
	}
	if c.RunAll && c.Verb == perftest.Send {
		return fmt.Errorf("-a with send tests is not supported")
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
}

// Perf runs one perftest test on dev against the peer behind oob, writing
// perftest's output (or, with asJSON, one JSON object per size) to out.
func Perf(ctx context.Context, dev *roce.Device, oob OOB, cfg PerfConfig, out io.Writer, asJSON bool) ([]PerfResult, error) {
	return perfRun(ctx, dev, oob, cfg, out, asJSON, false)
}

func perfRun(ctx context.Context, dev *roce.Device, oob OOB, cfg PerfConfig, out io.Writer, asJSON, checkData bool) ([]PerfResult, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	p := &perf{cfg: cfg, dev: dev, out: out, checkData: checkData}
	if asJSON {
		p.out = io.Discard
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
		Device: cfg.Device, NumQPs: 1, Conn: connName(cfg.DC), Transport: "IB", PCIeRelax: "OFF",
		UseEvent: cfg.Events, TxDepth: cfg.TxDepth, RxDepth: cfg.RxDepth, CQMod: cfg.CQMod,
		LinkType: "Ethernet", GIDIndex: cfg.GIDIndex, OutReads: outReads, ReportGbits: cfg.Gbits,
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
	qpCap := roce.QPCap{MaxSendWR: cfg.TxDepth + 1, MaxRecvWR: max(cfg.RxDepth, 1), MaxSendSGE: 1, MaxRecvSGE: 1}

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
	fmt.Fprint(p.out, perftest.Header(p.params))

	var results []PerfResult
	hooks := perftest.Hooks{
		Connect: p.connect,
		CMConnect: func(ctx context.Context) (perftest.Dest, error) {
			conn, err := sess.connectTest(ctx, testQP, uint8(outReads), p.mtu)
			if err != nil {
				return p.me, err
			}
			p.q = conn.QP()
			p.me.QPN, p.me.PSN = p.q.QPN(), p.q.Attr().SQPSN
			return p.me, nil
		},
		Addresses: func(local, remote perftest.Dest) {
			p.rem = remote
			fmt.Fprint(p.out, perftest.AddrLines(p.params, false, local))
			fmt.Fprint(p.out, perftest.AddrLines(p.params, true, remote))
			if !(cfg.Latency && p.role == perftest.Server && cfg.Verb != perftest.Send && cfg.Verb != perftest.Write) {
				fmt.Fprint(p.out, perftest.ResultColumns(p.params))
			}
		},
		PrepareRecv: func(ctx context.Context) error { return p.postRecvs(cfg.RxDepth) },
	}
	if perftest.HasRun(cfg.Verb, cfg.Latency, p.role) {
		hooks.Run = func(ctx context.Context) (perftest.BWReport, error) {
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
					fmt.Fprint(p.out, perftest.FormatBW(p.params, *r.BW))
				}
				if r.Lat != nil {
					fmt.Fprint(p.out, r.Lat.Format())
				}
			}
			return last, nil
		}
	}
	o, err := perftest.RunScript(ctx, c, cfg.Verb, cfg.Latency, p.me, hooks)
	if err != nil {
		return results, err
	}
	if o.RemoteReport != nil {
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
		SGID: p.me.GID, PathMTU: p.mtu, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12,
		RdAtomic: ourOutReads, HopLimit: 0xFF, NoDefaults: true,
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
	case p.cfg.Verb == perftest.Send && p.role == perftest.Server:
		err = p.bwServer(ctx, &r)
	default:
		err = p.bwClient(ctx, &r)
	}
	r.DataErrors = p.dataErrors
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
	p.sge[0] = p.mr.SGE(0, p.size)
	p.wr = roce.SendWR{ID: uint64(i), SGL: p.sge[:]}
	wr := &p.wr
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
	return wr
}

// bwClient is run_iter_bw: keep up to TX depth messages outstanding, a
// completion requested every CQ moderation messages and for the last.
func (p *perf) bwClient(ctx context.Context, r *PerfResult) error {
	n := p.cfg.Iters
	cqMod := p.cfg.CQMod
	t := perftest.BWTimes{Posted: make([]time.Duration, n), Completed: make([]time.Duration, n)}
	var wc [16]roce.WorkCompletion
	start := time.Now()
	scnt, ccnt := 0, 0
	for scnt < n || ccnt < n {
		for scnt < n && scnt-ccnt+1 <= p.cfg.TxDepth {
			signaled := scnt%cqMod == cqMod-1 || scnt == n-1
			wr := p.sendWR(scnt, signaled)
			t.Posted[scnt] = time.Since(start)
			if err := p.q.PostSend(wr); err != nil {
				return fmt.Errorf("Couldn't post send: scnt=%d: %w", scnt, err)
			}
			scnt++
		}
		if ccnt < n {
			k, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events)
			if err != nil {
				return fmt.Errorf("after %d posted, %d completed: %w", scnt, ccnt, err)
			}
			now := time.Since(start)
			for i := 0; i < k; i++ {
				if wc[i].Status != roce.WCSuccess {
					return &WCError{wc[i]}
				}
				end := min(int(wc[i].WRID)+1, n)
				for j := ccnt; j < end; j++ {
					t.Completed[j] = now
				}
				ccnt = max(ccnt, end)
			}
		}
	}
	r.Elapsed = time.Since(start)
	rep := perftest.BWReportFrom(uint64(p.size), cqMod, t, p.cfg.Gbits)
	r.BW = &rep
	if p.checkData && p.cfg.Verb == perftest.Read {
		p.checkPattern(p.buf[:p.size], 2, int(p.remoteAddr(n-1)-p.rem.VAddr))
	}
	return nil
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
// receives posted, and time from the first to the last.
func (p *perf) bwServer(ctx context.Context, r *PerfResult) error {
	n := p.cfg.Iters
	var wc [16]roce.WorkCompletion
	var first, last time.Time
	rcnt := 0
	posted := p.cfg.RxDepth
	for rcnt < n {
		k, err := pollWait(ctx, p.rcq, wc[:], p.cfg.Events)
		if err != nil {
			return fmt.Errorf("after %d received: %w", rcnt, err)
		}
		now := time.Now()
		if rcnt == 0 {
			first = now
		}
		for i := 0; i < k; i++ {
			if wc[i].Status != roce.WCSuccess {
				return &WCError{wc[i]}
			}
			if p.checkData && rcnt == n-1 {
				p.checkPattern(p.buf[p.half:p.half+p.size], 1, 0)
			}
			rcnt++
			if posted < n {
				if err := p.postRecv(wc[i].WRID); err != nil {
					return fmt.Errorf("rcnt=%d: %w", rcnt, err)
				}
				posted++
			}
		}
		last = now
	}
	r.Elapsed = last.Sub(first)
	sec := max(r.Elapsed.Seconds(), 1e-9)
	format := float64(1 << 20)
	if p.cfg.Gbits {
		format = 125e6
	}
	r.BW = &perftest.BWReport{Size: uint64(p.size), Iters: uint64(n),
		BWAvg: float64(p.size) * float64(n) / sec / format, MsgRate: float64(n) / sec / 1e6}
	return nil
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
			if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events); err != nil {
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
			if _, err := pollWait(ctx, p.rcq, wc[:], p.cfg.Events); err != nil {
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
			if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events); err != nil {
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
		if _, err := pollWait(ctx, p.scq, wc[:], p.cfg.Events); err != nil {
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
