package naaice

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

// Work request IDs of a host context.
const (
	wrMRSPSend = 1
	wrMRSPRecv = 2
	wrDataRecv = 3
	wrWrite    = 16 // + region index
)

// Options configure a Context. The zero value dials like the C host.
type Options struct {
	// LocalAddr is the source address (naaice_init_communication_context's
	// local_address); the zero value lets the device pick.
	LocalAddr netip.Addr
	// AddrOffset is the first requested NAA address (addr_offset): the
	// requested addresses are sequential from it, each region rounded up
	// to mrsp.PageWidth, internal regions first.
	AddrOffset uint64
	// Manager dials through a CM manager of the caller's; nil uses cm.Dial.
	Manager *cm.Manager
}

// Context is one host connection to an NAA: naaice_communication_context
// and the AP1 functions in Go shape. Its parameter regions are caller
// memory registered in place: the host writes inputs from them and the NAA
// writes outputs into them. A Context is used by one goroutine at a time;
// State may be read from any.
type Context struct {
	dev    *roce.Device
	remote netip.AddrPort
	opts   Options
	fn     uint8
	user   [3]byte

	params   [][]byte
	flags    []mrsp.Flags
	sendLen  []uint32 // bytes to send per parameter (naaice_set_bytes_to_send)
	naaAddrs []uint64 // requested NAA address per parameter
	intAddrs []uint64
	intSizes []uint32

	pd      *roce.PD
	cq      *roce.CQ
	mrs     []*roce.MR
	sendBuf []byte // MRSP messages out
	recvBuf []byte // MRSP messages in (and the data receives' placeholder)
	sendMR  *roce.MR
	recvMR  *roce.MR
	conn    *cm.Conn
	done    <-chan struct{}

	m     *mrsp.Machine
	state atomic.Uint32
	req   []mrsp.Region
	adv   []mrsp.Advert
	plan  []mrsp.Write
	wrs   []roce.SendWR
	sges  []roce.SGE
	rwr   roce.RecvWR
	rsge  [1]roce.SGE
	wc    [16]roce.WorkCompletion

	rpcs          int // data phases started
	imm           uint32
	code          uint32
	bytesReceived uint32
	rpcErr        RPCError
	// A receive that arrived before our own sends completed (possible
	// when an ACK is lost and the peer's answer overtakes the retry).
	early   bool
	earlyWC roce.WorkCompletion

	err    error // sticky: the context failed
	closed bool
}

// NewContext makes a context for an RPC connection to the NAA at remote
// (naaice_init_communication_context): params are the parameter regions
// (at least one), internalSizes the NAA-only regions, fn the function code
// (1..127). The regions are registered at once; no region is an input or
// output until SetInput/SetOutput/SetSingleSend say so. State is INIT.
func NewContext(dev *roce.Device, remote netip.AddrPort, params [][]byte, internalSizes []uint32, fn uint8, opts Options) (*Context, error) {
	if fn == 0 || fn > mrsp.FnCodeMask {
		return nil, fmt.Errorf("%w: function code %d not in 1..127", ErrInvalid, fn)
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("%w: no parameter regions", ErrInvalid)
	}
	if len(params)+len(internalSizes) > mrsp.MaxAAREntries {
		return nil, fmt.Errorf("%w: %d regions, at most %d", ErrInvalid, len(params)+len(internalSizes), mrsp.MaxAAREntries)
	}
	sizes := make([]uint32, 0, len(params)+len(internalSizes))
	for _, s := range internalSizes {
		if s == 0 {
			return nil, fmt.Errorf("%w: internal region of size 0", ErrInvalid)
		}
		sizes = append(sizes, s)
	}
	for i, p := range params {
		if len(p) == 0 || uint64(len(p)) > mrsp.MaxRegionSize {
			return nil, fmt.Errorf("%w: parameter %d has %d bytes", ErrInvalid, i, len(p))
		}
		sizes = append(sizes, uint32(len(p)))
	}
	c := &Context{dev: dev, remote: remote, fn: fn, params: params, m: mrsp.NewMachine(mrsp.Host)}
	c.opts = opts
	addrs := mrsp.SequentialNAAAddrs(c.opts.AddrOffset, sizes, nil)
	if addrs[len(addrs)-1] > mrsp.MaxNAAAddr {
		return nil, fmt.Errorf("%w: requested NAA addresses exceed 56 bits", ErrInvalid)
	}
	c.intAddrs, c.intSizes = addrs[:len(internalSizes)], append([]uint32(nil), internalSizes...)
	c.naaAddrs = addrs[len(internalSizes):]
	c.flags = make([]mrsp.Flags, len(params))
	c.sendLen = make([]uint32, len(params))
	for i, p := range params {
		c.sendLen[i] = uint32(len(p))
	}
	c.req = make([]mrsp.Region, 0, mrsp.MaxAAREntries)
	c.adv = make([]mrsp.Advert, 0, mrsp.MaxAEntries)
	c.plan = make([]mrsp.Write, 0, len(params))
	c.wrs = make([]roce.SendWR, len(params))
	c.sges = make([]roce.SGE, len(params))
	if err := c.register(); err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

// register is naaice_register_mrs: PD, CQ, the parameter regions and the
// MRSP buffers.
func (c *Context) register() error {
	var err error
	if c.pd, err = c.dev.AllocPD(); err != nil {
		return err
	}
	// One CQ for sends and receives, as the C host has: completions come
	// out in the order the state machine expects them.
	if c.cq, err = c.dev.CreateCQ(2*len(c.params) + 8); err != nil {
		return err
	}
	for _, p := range c.params {
		mr, err := c.pd.RegisterMR(p, roce.AccessLocalWrite|roce.AccessRemoteWrite)
		if err != nil {
			return err
		}
		c.mrs = append(c.mrs, mr)
	}
	c.sendBuf = make([]byte, mrsp.RecvBufLen)
	c.recvBuf = make([]byte, mrsp.RecvBufLen)
	if c.sendMR, err = c.pd.RegisterMR(c.sendBuf, roce.AccessLocalWrite); err != nil {
		return err
	}
	c.recvMR, err = c.pd.RegisterMR(c.recvBuf, roce.AccessLocalWrite)
	return err
}

// State returns the state (naaice_communication_state); safe from any
// goroutine.
func (c *Context) State() mrsp.State { return mrsp.State(c.state.Load()) }

func (c *Context) sync() { c.state.Store(uint32(c.m.State())) }

// Err returns why the context failed, or nil.
func (c *Context) Err() error { return c.err }

// RPCs returns the number of RPCs started on the connection (no_rpc_calls).
func (c *Context) RPCs() int { return c.rpcs }

// Result returns the last RPC's return code (naa_returncode, the C host's
// immediate >> 8) and the byte count of its final write (bytes_received).
func (c *Context) Result() (code uint32, bytesReceived uint32) { return c.code, c.bytesReceived }

// Conn returns the connection (nil before Connect).
func (c *Context) Conn() *cm.Conn { return c.conn }

func (c *Context) checkIdx(i int) error {
	if i < 0 || i >= len(c.params) {
		return fmt.Errorf("%w: region %d of %d", ErrInvalid, i, len(c.params))
	}
	if c.m.State() >= mrsp.MRSPSending && c.m.State() != mrsp.Disconnected {
		return fmt.Errorf("%w: regions are fixed once the MRSP started", ErrState)
	}
	return nil
}

// SetInput marks parameter i as an input (naaice_set_input_mr): the host
// writes it to the NAA on every RPC.
func (c *Context) SetInput(i int) error {
	if err := c.checkIdx(i); err != nil {
		return err
	}
	c.flags[i] |= mrsp.FlagInput
	return nil
}

// SetOutput marks parameter i as an output (naaice_set_output_mr): the NAA
// writes it back after every RPC.
func (c *Context) SetOutput(i int) error {
	if err := c.checkIdx(i); err != nil {
		return err
	}
	c.flags[i] |= mrsp.FlagOutput
	return nil
}

// SetSingleSend marks parameter i as a single-send input
// (naaice_set_singlesend_mr): written on the first RPC of the connection
// only.
func (c *Context) SetSingleSend(i int) error {
	if err := c.checkIdx(i); err != nil {
		return err
	}
	c.flags[i] |= mrsp.FlagSingleSend | mrsp.FlagInput
	return nil
}

// SetInternal replaces the internal regions (naaice_set_internal_mrs):
// NAA-only memory at the requested NAA addresses, never transferred.
func (c *Context) SetInternal(addrs []uint64, sizes []uint32) error {
	if len(addrs) != len(sizes) || len(sizes)+len(c.params) > mrsp.MaxAAREntries {
		return fmt.Errorf("%w: %d addresses, %d sizes", ErrInvalid, len(addrs), len(sizes))
	}
	if c.m.State() >= mrsp.MRSPSending {
		return fmt.Errorf("%w: regions are fixed once the MRSP started", ErrState)
	}
	c.intAddrs = append([]uint64(nil), addrs...)
	c.intSizes = append([]uint32(nil), sizes...)
	return nil
}

// SetImmediate sets the three user bytes of the data phase's immediate
// (naaice_set_immediate); the function code takes the low byte.
func (c *Context) SetImmediate(b [3]byte) { c.user = b }

// SetBytesToSend sets how many bytes of parameter i the next RPCs write
// (naaice_set_bytes_to_send). As the library does (and unlike its
// description, which says 0), a negative n restores the whole region; 0
// writes zero bytes.
func (c *Context) SetBytesToSend(i, n int) error {
	if i < 0 || i >= len(c.params) {
		return fmt.Errorf("%w: region %d of %d", ErrInvalid, i, len(c.params))
	}
	if n < 0 {
		c.sendLen[i] = uint32(len(c.params[i]))
		return nil
	}
	if n > len(c.params[i]) {
		return fmt.Errorf("%w: %d bytes to send from a %d-byte region", ErrInvalid, n, len(c.params[i]))
	}
	c.sendLen[i] = uint32(n)
	return nil
}

// Connect resolves the NAA and connects (naaice_setup_connection):
// INIT → READY → CONNECTED. It dials like the C host: RDMA_PS_TCP, no
// private data, retry 7, RNR retry 6, initiator depth and responder
// resources 1.
func (c *Context) Connect(ctx context.Context) error {
	if c.closed {
		return ErrClosed
	}
	if c.m.State() != mrsp.Init {
		return fmt.Errorf("%w: connect in state %v", ErrState, c.m.State())
	}
	_ = c.m.Step(mrsp.EvAddrResolved)
	_ = c.m.Step(mrsp.EvRouteResolved)
	c.sync()
	o := cm.DialOptions{
		QP: cm.QPOptions{PD: c.pd, SendCQ: c.cq, RecvCQ: c.cq, SigAll: true,
			Cap: roce.QPCap{MaxSendWR: len(c.params) + 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}},
		LocalAddr:          c.opts.LocalAddr,
		ResponderResources: mrsp.ResponderResources, InitiatorDepth: mrsp.InitiatorDepth,
		RetryCount: mrsp.RetryCount, RNRRetryCount: mrsp.RNRRetryCount,
	}
	var conn *cm.Conn
	var err error
	if c.opts.Manager != nil {
		conn, err = c.opts.Manager.Dial(ctx, c.remote, o)
	} else {
		conn, err = cm.Dial(ctx, c.dev, c.remote, o)
	}
	if err != nil {
		_ = c.m.Step(mrsp.EvCMError)
		c.sync()
		c.err = err
		return err
	}
	c.conn, c.done = conn, conn.Done()
	_ = c.m.Step(mrsp.EvEstablished)
	c.sync()
	return nil
}

// regions builds the AAR entries: parameters in order, then internal
// regions.
func (c *Context) regions() []mrsp.Region {
	c.req = c.req[:0]
	for i, mr := range c.mrs {
		c.req = append(c.req, mrsp.Region{Flags: c.flags[i], NAAAddr: c.naaAddrs[i], HostAddr: mr.Addr(),
			RKey: mr.RKey(), Size: uint32(mr.Len())})
	}
	for i, s := range c.intSizes {
		c.req = append(c.req, mrsp.Region{Flags: mrsp.FlagInternal, NAAAddr: c.intAddrs[i], Size: s})
	}
	return c.req
}

// StartMRSP posts the receive for the NAA's answer and sends the AAR
// (naaice_init_mrsp). Poll, Wait or PollBusy then drive it to MRSP_DONE.
func (c *Context) StartMRSP() error {
	if err := c.usable(); err != nil {
		return err
	}
	if c.m.State() != mrsp.Connected {
		return fmt.Errorf("%w: MRSP in state %v", ErrState, c.m.State())
	}
	if len(c.params)+len(c.intSizes) > mrsp.MaxAAREntries {
		return fmt.Errorf("%w: too many regions", ErrInvalid)
	}
	msg, err := mrsp.AppendAAR(c.sendBuf[:0], c.regions())
	if err != nil {
		return err
	}
	c.rsge[0] = c.recvMR.SGE(0, len(c.recvBuf))
	c.rwr = roce.RecvWR{ID: wrMRSPRecv, SGL: c.rsge[:]}
	if err := c.conn.QP().PostRecv(&c.rwr); err != nil {
		return c.fail(err)
	}
	c.sges[0] = c.sendMR.SGE(0, len(msg))
	c.wrs[0] = roce.SendWR{ID: wrMRSPSend, Opcode: roce.WRSend, Flags: roce.SendSignaled | roce.SendSolicited, SGL: c.sges[:1]}
	if err := c.conn.QP().PostSend(&c.wrs[0]); err != nil {
		return c.fail(err)
	}
	_ = c.m.Step(mrsp.EvSendAAR)
	c.sync()
	return nil
}

// DoMRSP runs the whole MRSP and returns at MRSP_DONE (naaice_do_mrsp). An
// ERR from the NAA is a *MRSPError.
func (c *Context) DoMRSP(ctx context.Context) error {
	if err := c.StartMRSP(); err != nil {
		return err
	}
	for c.m.State() != mrsp.MRSPDone {
		if err := c.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// StartRPC starts one RPC (naaice_init_data_transfer): it posts the
// receive for the NAA's final write, then the writes of the input regions
// (single-send ones on the first RPC only) with the function code and user
// bytes in the last one's immediate, solicited. Poll, Wait or PollBusy then
// drive it to FINISHED. It allocates nothing.
func (c *Context) StartRPC() error {
	if err := c.usable(); err != nil {
		return err
	}
	if s := c.m.State(); s != mrsp.MRSPDone && s != mrsp.Finished {
		return fmt.Errorf("%w: RPC in state %v", ErrState, s)
	}
	imm, err := mrsp.HostImm(c.fn, c.user)
	if err != nil {
		return err
	}
	c.plan, err = mrsp.HostWrites(c.req, c.adv, c.rpcs, c.sendLen, imm, c.plan[:0])
	if err != nil {
		return fmt.Errorf("naaice: RPC %d: %w", c.rpcs, err)
	}
	// The receive goes first, so the NAA's answer always finds it.
	c.rsge[0] = c.recvMR.SGE(0, 0)
	c.rwr = roce.RecvWR{ID: wrDataRecv, SGL: c.rsge[:]}
	if err := c.conn.QP().PostRecv(&c.rwr); err != nil {
		return c.fail(err)
	}
	n := len(c.plan)
	for i, w := range c.plan {
		c.sges[i] = c.mrs[w.Region].SGE(0, int(w.Len))
		wr := &c.wrs[i]
		*wr = roce.SendWR{ID: wrWrite + uint64(w.Region), Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
			SGL: c.sges[i : i+1], RemoteAddr: w.RemoteAddr, RKey: w.RKey}
		if w.WithImm {
			wr.Opcode, wr.Imm = roce.WRRDMAWriteWithImm, w.Imm
			wr.Flags |= roce.SendSolicited
		}
	}
	if err := c.m.StartData(n); err != nil {
		return err
	}
	c.sync()
	c.early = false
	c.rpcs++
	if _, err := c.conn.QP().PostSendBatch(c.wrs[:n]); err != nil {
		return c.fail(err)
	}
	return nil
}

// Abort sends the host's error signal instead of an RPC
// (naaice_write_data with function code 0): a zero-length WRITE WITH IMM
// with immediate 0 to the NAA's first region. The NAA ends the RPC
// without an answer (goroce's closes the connection; the C one stops
// serving it), so Close is all that is left to do.
func (c *Context) Abort() error {
	if err := c.usable(); err != nil {
		return err
	}
	if s := c.m.State(); s != mrsp.MRSPDone && s != mrsp.Finished {
		return fmt.Errorf("%w: abort in state %v", ErrState, s)
	}
	w, err := mrsp.HostAbort(c.adv)
	if err != nil {
		return err
	}
	if err := c.m.StartData(1); err != nil {
		return err
	}
	c.sync()
	c.wrs[0] = roce.SendWR{ID: wrWrite, Opcode: roce.WRRDMAWriteWithImm, Flags: roce.SendSignaled | roce.SendSolicited,
		RemoteAddr: w.RemoteAddr, RKey: w.RKey, Imm: w.Imm}
	if err := c.conn.QP().PostSend(&c.wrs[0]); err != nil {
		return c.fail(err)
	}
	return nil
}

// DoRPC runs one RPC and waits for its result (naaice_do_data_transfer).
// A non-zero return code from the NAA is a *RPCError. It allocates nothing
// unless it fails.
func (c *Context) DoRPC(ctx context.Context) error {
	if err := c.StartRPC(); err != nil {
		return err
	}
	for c.m.State() != mrsp.Finished {
		if err := c.Wait(ctx); err != nil {
			return err
		}
	}
	return c.rpcResult()
}

func (c *Context) rpcResult() error {
	if c.imm != 0 {
		c.rpcErr = RPCError{Code: c.code, Imm: c.imm}
		return &c.rpcErr
	}
	return nil
}

// Poll handles the completions that are there without blocking
// (naaice_poll_cq_nonblocking) and returns the context's error, if any.
// The state says how far the MRSP or RPC got.
func (c *Context) Poll() error {
	if err := c.usable(); err != nil {
		return err
	}
	for {
		n := c.cq.Poll(c.wc[:])
		for i := 0; i < n; i++ {
			if err := c.handle(&c.wc[i]); err != nil {
				return err
			}
		}
		if n < len(c.wc) {
			return nil
		}
	}
}

// Wait blocks until at least one completion came, then handles every
// completion there is (naaice_poll_cq_blocking). It returns ctx's error when
// ctx ends first and ErrConnectionEnded when the connection does.
func (c *Context) Wait(ctx context.Context) error {
	if err := c.usable(); err != nil {
		return err
	}
	if err := waitCQ(ctx, c.cq, c.done); err != nil {
		if errors.Is(err, ErrConnectionEnded) {
			return c.fail(fmt.Errorf("%w: %v", ErrConnectionEnded, c.conn.Err()))
		}
		return err
	}
	return c.Poll()
}

// PollBusy polls without parking until the current MRSP or RPC is done,
// ctx ends or the connection ends (naaice_poll_cq_busy).
func (c *Context) PollBusy(ctx context.Context) error {
	for {
		if err := c.Poll(); err != nil {
			return err
		}
		switch c.m.State() {
		case mrsp.MRSPDone:
			return nil
		case mrsp.Finished:
			return c.rpcResult()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			if c.cq.Len() == 0 {
				return c.fail(fmt.Errorf("%w: %v", ErrConnectionEnded, c.conn.Err()))
			}
		default:
		}
	}
}

func (c *Context) usable() error {
	if c.closed {
		return ErrClosed
	}
	if c.err != nil {
		return c.err
	}
	if c.conn == nil {
		return fmt.Errorf("%w: not connected", ErrState)
	}
	return nil
}

// fail makes err the context's sticky error and moves to ERROR.
func (c *Context) fail(err error) error {
	if c.err == nil {
		c.err = err
	}
	_ = c.m.Step(mrsp.EvCMError)
	c.sync()
	return c.err
}

// handle is naaice_handle_work_completion.
func (c *Context) handle(wc *roce.WorkCompletion) error {
	if wc.Status != roce.WCSuccess {
		return c.fail(&CompletionError{Status: wc.Status, Opcode: wc.Opcode})
	}
	st := c.m.State()
	var ev mrsp.Event
	switch wc.Opcode {
	case roce.WCSend:
		ev = mrsp.EvSendDone
	case roce.WCRecv:
		if st == mrsp.MRSPSending && !c.early {
			c.early, c.earlyWC = true, *wc
			return nil
		}
		if st != mrsp.MRSPReceiving {
			return c.fail(&mrsp.TransitionError{Role: mrsp.Host, State: st, Event: mrsp.EvRecvA})
		}
		return c.recvMRSP(wc)
	case roce.WCRDMAWrite:
		ev = mrsp.EvWriteDone
	case roce.WCRecvRDMAWithImm:
		if st == mrsp.DataSending && !c.early {
			c.early, c.earlyWC = true, *wc
			return nil
		}
		if st != mrsp.DataReceiving {
			return c.fail(&mrsp.TransitionError{Role: mrsp.Host, State: st, Event: mrsp.EvRecvImm})
		}
		c.finish(wc)
		return nil
	default:
		return c.fail(fmt.Errorf("naaice: unexpected completion %v", wc.Opcode))
	}
	if err := c.m.Step(ev); err != nil {
		return c.fail(err)
	}
	c.sync()
	// An answer that overtook our own completions is handled now.
	if c.early {
		switch {
		case c.m.State() == mrsp.MRSPReceiving && c.earlyWC.Opcode == roce.WCRecv:
			c.early = false
			return c.recvMRSP(&c.earlyWC)
		case c.m.State() == mrsp.DataReceiving && c.earlyWC.Opcode == roce.WCRecvRDMAWithImm:
			c.early = false
			c.finish(&c.earlyWC)
		}
	}
	return nil
}

// recvMRSP handles the NAA's answer to the AAR.
func (c *Context) recvMRSP(wc *roce.WorkCompletion) error {
	msg := c.recvBuf[:min(int(wc.ByteLen), len(c.recvBuf))]
	typ, err := mrsp.Type(msg)
	if err != nil {
		_ = c.m.Step(mrsp.EvRecvErr)
		return c.fail(err)
	}
	if typ == mrsp.MsgErr {
		code, perr := mrsp.ParseErr(msg)
		_ = c.m.Step(mrsp.EvRecvErr)
		c.sync()
		if perr != nil {
			return c.fail(perr)
		}
		return c.fail(&MRSPError{Code: code})
	}
	c.adv, err = mrsp.ParseA(msg, c.adv[:0])
	if err == nil {
		err = mrsp.MatchA(c.req, c.adv)
	}
	if err != nil {
		_ = c.m.Step(mrsp.EvRecvErr)
		return c.fail(err)
	}
	_ = c.m.Step(mrsp.EvRecvA)
	c.sync()
	return nil
}

func (c *Context) finish(wc *roce.WorkCompletion) {
	c.imm = wc.Imm
	c.code, _ = mrsp.ParseNAAImm(wc.Imm)
	c.bytesReceived = wc.ByteLen
	_ = c.m.Step(mrsp.EvRecvImm)
	c.sync()
}

// Disconnect sends a DREQ and waits for the answer (rdma_disconnect). Close
// still has to be called.
func (c *Context) Disconnect(ctx context.Context) error {
	if c.conn == nil {
		return nil
	}
	err := c.conn.Disconnect(ctx)
	_ = c.m.Step(mrsp.EvDisconnect)
	c.sync()
	return err
}

// Close disconnects (DREQ without waiting) and frees everything
// (naaice_disconnect_and_cleanup). The parameter buffers stay the caller's.
func (c *Context) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	if c.conn != nil {
		_ = c.m.Step(mrsp.EvDisconnect)
		c.sync()
	}
	return c.release()
}

func (c *Context) release() error {
	var errs []error
	if c.conn != nil {
		errs = append(errs, c.conn.Close())
	}
	for _, mr := range c.mrs {
		errs = append(errs, mr.Close())
	}
	for _, mr := range []*roce.MR{c.sendMR, c.recvMR} {
		if mr != nil {
			errs = append(errs, mr.Close())
		}
	}
	if c.cq != nil {
		errs = append(errs, c.cq.Close())
	}
	if c.pd != nil {
		errs = append(errs, c.pd.Close())
	}
	return errors.Join(errs...)
}
