package cuobj

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// dcRdAtomic is the RDMA READs in flight between one DCI and one DCT: a
// DCT keeps this many saved READ results per initiator, and with no
// connection setup to negotiate it both ends use the same figure.
const dcRdAtomic = 16

// maxAHs bounds the address handles a DC server caches (one per client
// address); past it an arbitrary one is dropped and made again when
// needed, so a server that met many clients holds bounded memory.
const maxAHs = 1 << 16

// parseDCKey reads the client configuration's rdma_dc_key: 32 bits in hex,
// zero-extended to DC's 64-bit access key (docs/dc.md).
func parseDCKey(s string) (uint64, error) {
	v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 32)
	if err != nil {
		return 0, fmt.Errorf("rdma_dc_key %q is not a 32-bit hex value", s)
	}
	return v, nil
}

// dcTarget is a DC client's target: a DCT with the SRQ DC requires and a
// CQ. cuObject's traffic is RDMA WRITE and READ only, so the SRQ never
// gets a receive posted and the CQ never a completion.
type dcTarget struct {
	cq  *roce.CQ
	srq *roce.SRQ
	qp  *roce.QP
}

func newDCTarget(pd *roce.PD, key uint64) (*dcTarget, error) {
	d := pd.Device()
	x := &dcTarget{}
	var err error
	if x.cq, err = d.CreateCQ(1); err != nil {
		return nil, err
	}
	if x.srq, err = pd.CreateSRQ(roce.SRQAttr{MaxWR: 1, MaxSGE: 1}); err != nil {
		_ = x.cq.Close()
		return nil, err
	}
	x.qp, err = pd.CreateQP(&roce.QPInitAttr{Type: roce.DCT, SendCQ: x.cq, RecvCQ: x.cq, SRQ: x.srq,
		DC: roce.DCInitAttr{Key: key}})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = x.qp.ActivateDC(ctx, &roce.DCAttr{RdAtomic: dcRdAtomic,
			Access: roce.AccessLocalWrite | roce.AccessRemoteWrite | roce.AccessRemoteRead})
		cancel()
		if err != nil {
			_ = x.qp.Close()
		}
	}
	if err != nil {
		_ = x.srq.Close()
		_ = x.cq.Close()
		return nil, err
	}
	return x, nil
}

func (x *dcTarget) close() error {
	return errors.Join(x.qp.Close(), x.srq.Close(), x.cq.Close())
}

// dcTransport reaches clients' DCTs from one DCI per channel. Its address
// handles are shared by every channel: per client the server keeps one
// AH, however many channels serve it.
type dcTransport struct {
	pd    *roce.PD
	local netip.Addr
	t     *Tunables
	mtu   ib.MTU

	mu     sync.Mutex
	ahs    map[ib.GID]*roce.AH
	closed bool
}

func newDCTransport(pd *roce.PD, local netip.Addr, t *Tunables, mtu ib.MTU) *dcTransport {
	return &dcTransport{pd: pd, local: local, t: t, mtu: mtu, ahs: map[ib.GID]*roce.AH{}}
}

// route names no channel: a DC token reaches the client's DCT from any.
func (tr *dcTransport) route(*Token) (uint16, bool) { return 0, false }

func (tr *dcTransport) openPath(_ uint16, cq *roce.CQ) (path, error) {
	p := &dcPath{tr: tr, cq: cq, byQPN: map[uint32]*dci{}}
	q, err := p.newDCI()
	if err != nil {
		return nil, err
	}
	p.cur = q
	p.byQPN[q.qp.QPN()] = q
	return p, nil
}

// ah returns the address handle for a client's GID, made on first use.
func (tr *dcTransport) ah(ctx context.Context, gid ib.GID) (*roce.AH, error) {
	tr.mu.Lock()
	if tr.closed {
		tr.mu.Unlock()
		return nil, ErrClosed
	}
	if ah := tr.ahs[gid]; ah != nil {
		tr.mu.Unlock()
		return ah, nil
	}
	tr.mu.Unlock()
	av := roce.AddressVector{DGID: gid, TrafficClass: uint8(tr.t.TrafficClass), HopLimit: uint8(tr.t.HopLimit)}
	if tr.local.IsValid() {
		av.SGID = ib.GIDFromAddr(tr.local)
	}
	// Resolving the neighbour may block; it happens without the lock.
	ah, err := tr.pd.CreateAH(ctx, av)
	if err != nil {
		return nil, err
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.closed {
		_ = ah.Close()
		return nil, ErrClosed
	}
	if old := tr.ahs[gid]; old != nil {
		_ = ah.Close() // another channel made it meanwhile
		return old, nil
	}
	if len(tr.ahs) >= maxAHs {
		// A work request already posted with the dropped handle keeps
		// its address: the DCI copied it.
		for g, old := range tr.ahs {
			delete(tr.ahs, g)
			_ = old.Close()
			break
		}
	}
	tr.ahs[gid] = ah
	return ah, nil
}

func (tr *dcTransport) close() error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.closed = true
	var errs []error
	for _, ah := range tr.ahs {
		errs = append(errs, ah.Close())
	}
	clear(tr.ahs)
	return errors.Join(errs...)
}

// dci is one initiator with the count of its work requests still to
// complete.
type dci struct {
	qp          *roce.QP
	outstanding int
	retired     bool // replaced: closed once nothing is outstanding
}

// dcPath is a channel's DCI. It names the client in every work request
// (AH, DCT number, key), so it needs no per-client state of its own.
type dcPath struct {
	tr *dcTransport
	cq *roce.CQ
	mu sync.Mutex // guards the fields against abort
	// cur is the DCI new requests go to; byQPN holds every DCI with
	// completions still to come (cur included).
	cur   *dci
	byQPN map[uint32]*dci
	// reset: a failure asked for cur to be reset before its next request.
	reset bool
	dead  bool
}

func (p *dcPath) newDCI() (*dci, error) {
	t := p.tr.t
	q, err := p.tr.pd.CreateQP(&roce.QPInitAttr{Type: roce.DCI, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: roce.QPCap{MaxSendWR: int(t.CQDepth), MaxSendSGE: t.MaxSGE}})
	if err != nil {
		return nil, err
	}
	if err := p.activate(q); err != nil {
		_ = q.Close()
		return nil, err
	}
	return &dci{qp: q}, nil
}

func (p *dcPath) activate(q *roce.QP) error {
	t := p.tr.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return q.ActivateDC(ctx, &roce.DCAttr{PathMTU: p.tr.mtu, Timeout: t.Timeout, RetryCnt: t.RetryCount,
		RNRRetry: 7, RdAtomic: uint8(min(t.MaxRdAtomic, dcRdAtomic))})
}

// resetLocked makes cur usable again after a failure (qp_reset_on_failure):
// with nothing outstanding the DCI itself goes back through RESET; with
// flushed completions still to come (they must still reach their
// channel's accounting) a fresh DCI takes its place and the old one is
// closed after its last completion.
func (p *dcPath) resetLocked() error {
	c := p.cur
	if c.outstanding == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.qp.Modify(ctx, &roce.QPAttr{State: roce.StateReset}, roce.AttrState)
		cancel()
		if err == nil {
			err = p.activate(c.qp)
		}
		if err == nil {
			p.reset = false
			return nil
		}
	}
	q, err := p.newDCI()
	if err != nil {
		return err
	}
	c.retired = true
	if c.outstanding == 0 {
		delete(p.byQPN, c.qp.QPN())
		_ = c.qp.Close()
	}
	p.cur = q
	p.byQPN[q.qp.QPN()] = q
	p.reset = false
	return nil
}

func (p *dcPath) prepare(ctx context.Context, tok *Token) error {
	_, err := p.resolve(ctx, tok)
	return err
}

// resolve returns the address handle of the client tok names, within
// ConnectTimeout (a client that does not answer ARP or ND holds the
// channel no longer).
func (p *dcPath) resolve(ctx context.Context, tok *Token) (*roce.AH, error) {
	p.tr.mu.Lock()
	ah := p.tr.ahs[tok.GID]
	p.tr.mu.Unlock()
	if ah != nil {
		return ah, nil // the common case, without the timer's allocations
	}
	rctx, cancel := context.WithTimeout(ctx, p.tr.t.ConnectTimeout)
	defer cancel()
	ah, err := p.tr.ah(rctx, tok.GID)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return nil, ErrClosed
		}
		if ctx.Err() == nil && rctx.Err() != nil {
			return nil, newErr("post", syscall.ETIMEDOUT, ErrConnectTimeout, "address of %v, %v: %v", tok.GID.Addr(), p.tr.t.ConnectTimeout, err)
		}
		return nil, newErr("post", syscall.EIO, ErrSubmit, "address of %v: %w", tok.GID.Addr(), err)
	}
	return ah, nil
}

func (p *dcPath) post(ctx context.Context, tok *Token, wr *roce.SendWR) (uint32, error) {
	ah, err := p.resolve(ctx, tok)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return 0, ErrClosed
	}
	if p.reset || p.cur.qp.State() == roce.StateErr {
		if !p.tr.t.QPResetOnFailure {
			// Without qp_reset_on_failure a failed DCI stays failed.
			return 0, newErr("post", syscall.EIO, ErrSubmit, "DCI %#x failed: %v", p.cur.qp.QPN(), p.cur.qp.Err())
		}
		if err := p.resetLocked(); err != nil {
			return 0, newErr("post", syscall.EIO, ErrSubmit, "reset DCI: %v", err)
		}
	}
	wr.AH, wr.RemoteQPN, wr.DCKey = ah, tok.QPN, p.tr.t.DCKey
	err = p.cur.qp.PostSend(wr)
	wr.AH = nil
	if err != nil {
		return 0, newErr("post", syscall.EIO, ErrSubmit, "%v", err)
	}
	p.cur.outstanding++
	return p.cur.qp.QPN(), nil
}

// gone: a DCI has no connection a peer could end.
func (p *dcPath) gone(uint32) bool { return false }

func (p *dcPath) completed(qpn uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.byQPN[qpn]
	if c == nil {
		return
	}
	if c.outstanding > 0 {
		c.outstanding--
	}
	if c.retired && c.outstanding == 0 {
		delete(p.byQPN, qpn)
		_ = c.qp.Close()
	}
}

func (p *dcPath) failed(qpn uint32, reset bool) {
	if !reset {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.byQPN[qpn]
	if c == nil || c != p.cur {
		return
	}
	// The error state flushes the DCI's other work requests (they
	// complete with WR_FLUSH_ERR); the next request resets it.
	_ = c.qp.Modify(context.Background(), &roce.QPAttr{State: roce.StateErr}, roce.AttrState)
	p.reset = true
}

func (p *dcPath) abort() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	for _, c := range p.byQPN {
		_ = c.qp.Modify(context.Background(), &roce.QPAttr{State: roce.StateErr}, roce.AttrState)
	}
}

func (p *dcPath) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead = true
	var errs []error
	for _, c := range p.byQPN {
		errs = append(errs, c.qp.Close())
	}
	clear(p.byQPN)
	return errors.Join(errs...)
}
