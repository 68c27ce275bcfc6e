package rsocket

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// Work request kinds, in the top bits of a send's wr_id; the low 32 bits
// carry the bytes a data write took from the send buffer.
const (
	kindData uint64 = iota + 1
	kindCredit
	kindCtrl // DISCONNECT or SHUTDOWN
	kindKeepalive
	kindIOMap
	kindIOWrite
)

const kindShift = 56

// retryTimeout is how long the QP retransmits before it gives up: the
// local ACK timeout (4.096 µs << Timeout) times RetryCnt+1. A retry count
// of 7 means "forever" to rxe (and to package qp, which follows it), while
// librdmacm asks for 7: the keepalive timer applies the count as 7 so that
// a dead peer still surfaces.
func retryTimeout(a roce.QPAttr) time.Duration {
	t := time.Duration(4096<<min(a.Timeout, 31)) * time.Nanosecond
	if a.Timeout == 0 {
		t = 4 * time.Second
	}
	return max(t*time.Duration(min(a.RetryCnt, 7)+1), 2*probeInterval)
}

// probeInterval is how often a connection whose Read or Write is blocked
// sends a keepalive. librdmacm sends them only with SO_KEEPALIVE, so a C
// program blocked on a peer that died after its last ACK waits forever;
// the probe, when the send queue has not moved for retryTimeout, fails the
// connection with ETIMEDOUT (the peer sees nothing of it: a zero-length RDMA WRITE raises
// no completion).
const probeInterval = time.Second

// disconnectWait bounds the DREQ exchange of a connection that failed.
const disconnectWait = 2 * time.Second

// Conn is a connected stream rsocket. It implements net.Conn; its methods
// are safe for concurrent use.
type Conn struct {
	ep     *endpoint
	cmc    *cm.Conn
	qp     *roce.QP
	local  net.Addr
	remote net.Addr

	readMu  sync.Mutex // one Read at a time
	writeMu sync.Mutex // one Write at a time
	rdl     *deadline
	wdl     *deadline

	mu           sync.Mutex // the protocol state below
	w            *wire.Conn
	peer         wire.ConnData
	entry        binary.ByteOrder  // the peer's SGE order
	nextAdv      int               // target SGL slot the peer writes next
	shead        int               // send ring: where the next copied write goes
	peerMaps     []wire.IOMapEntry // the peer's iomap table, as it published it
	iomaps       []*iomapMR        // our riomap registrations
	iomapPending int
	err          error // why the connection failed (sticky)
	peerEOF      bool  // the peer sent SHUTDOWN or DISCONNECT, or is gone
	closing      bool
	peerDisc     bool // the peer's RS_CTRL_DISCONNECT arrived
	// Send work requests in flight, oldest first: what each one holds
	// (kind<<kindShift | bytes), indexed by its sequence number, which is
	// its wr_id. Small data writes go unsignalled while the send queue and
	// buffer are at least half free; a completion stands for every request
	// before it, since an RC send queue completes in order (and a failed or
	// flushed request completes whether signalled or not).
	sent               []uint64
	sentHead, sentTail uint64 // sequence numbers
	unsignaled         int    // data writes posted unsignalled since the last signalled one
	wc                 [32]roce.WorkCompletion
	// Send work requests are built in place and posted in batches: one
	// lock and one transmit pass for all the chunks of a Write.
	batch    [batchMax]roce.SendWR
	bsgl     [batchMax][2]roce.SGE
	bscratch [batchMax][wire.IOMapEntryLen]byte
	nb       int
	batching bool
	rwr      roce.RecvWR

	// The CQ has one owner at a time (librdmacm's cq_wait_lock): the
	// goroutine that waits on it or polls it outside mu. Only the owner
	// polls, so a completion that wakes it is never taken by another
	// goroutine while it stays parked; the others wait on their channel
	// until the owner lets go and wakes them.
	cqOwned bool // under mu
	waiting int  // under mu: goroutines on rwake, wwake, cwake or bgwake

	// Reads and Writes take their own completions (run to completion: a
	// Read waits on the CQ, so the packet that completes it is received by
	// the reading goroutine). The background loop stands by while they
	// come and go and takes completions only when none has for a linger.
	active atomic.Int32  // Reads, Writes and CloseWrites in progress
	gen    atomic.Uint32 // counts them
	bgSeen uint32        // gen at the background loop's last look

	blocked      atomic.Int32 // Reads and Writes waiting for the peer
	kaPending    bool         // a keepalive is posted and not completed (under mu)
	kaPosted     time.Time
	deadAfter    time.Duration // this long without a send completion while a keepalive waits: the peer is gone
	rwake, wwake chan struct{} // buffered 1: progress for the reader / writer
	cwake        chan struct{} // buffered 1: progress for Close
	bgwake       chan struct{} // buffered 1: the CQ is free for the background loop
	bgKick       chan struct{} // buffered 1: Close needs the background loop now
	closing1     atomic.Bool   // closing, for the background loop
	closed       chan struct{} // closed by Close
	ctx          context.Context
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	closeOnce    sync.Once
	closeErr     error
}

// newConn joins an endpoint and an established CM connection whose peer
// sent peer.
func newConn(ep *endpoint, cmc *cm.Conn, peer wire.ConnData) (*Conn, error) {
	w, err := wire.NewConn(ep.connConfig(), &peer)
	if err != nil {
		return nil, err
	}
	c := &Conn{ep: ep, cmc: cmc, qp: cmc.QP(), w: w, peer: peer, entry: peer.EntryOrder(), nextAdv: 1,
		sent:  make([]uint64, ep.cfg.sq+batchMax),
		local: tcpAddr(cmc.LocalAddr()), remote: tcpAddr(cmc.RemoteAddr()),
		rdl: newDeadline(), wdl: newDeadline(), peerMaps: make([]wire.IOMapEntry, ep.cfg.iomap),
		rwake: make(chan struct{}, 1), wwake: make(chan struct{}, 1), cwake: make(chan struct{}, 1),
		bgwake: make(chan struct{}, 1), bgKick: make(chan struct{}, 1), closed: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.deadAfter = retryTimeout(c.qp.Attr())
	stats.conns.Add(1)
	c.mu.Lock()
	// The first pass advertises the second half of the ring at once
	// (rbuf_bytes_avail starts at half), as librdmacm does.
	c.progressLocked()
	c.mu.Unlock()
	c.wg.Add(2)
	go c.progressLoop()
	go c.watch()
	return c, nil
}

// progressLinger is how long no Read or Write must have run before the
// background loop takes completions: long enough that a stream or a
// ping-pong never hands a completion to it (a goroutine wake per message),
// short enough that credits and adverts flow soon after the application
// stops calling.
const progressLinger = 2 * time.Millisecond

// progressLoop takes completions nobody else takes, so that receive
// buffers are reposted and the peer's credits and control messages are
// applied while the application is elsewhere, and serves Close.
func (c *Conn) progressLoop() {
	defer c.wg.Done()
	t := time.NewTimer(progressLinger)
	t.Stop()
	for c.standBy(t) {
		c.mu.Lock()
		if c.cqOwned {
			// A Read or Write (or CloseWrite) holds the CQ: it hands it
			// over when it lets go.
			c.waiting++
			c.mu.Unlock()
			select {
			case <-c.bgwake:
			case <-c.ctx.Done():
			}
			c.mu.Lock()
			c.waiting--
			c.mu.Unlock()
			continue
		}
		c.cqOwned = true
		cq := c.ep.cq
		c.mu.Unlock()
		err := cq.Wait(c.ctx)
		c.mu.Lock()
		c.cqOwned = false
		if err != nil {
			if c.ctx.Err() == nil {
				c.failLocked(err)
			}
			c.mu.Unlock()
			c.wake()
			return
		}
		c.progressLocked()
		c.wakeWaitersLocked()
		c.mu.Unlock()
	}
}

// standBy returns once no Read or Write has run for a linger, or Close
// needs the loop; false when the Conn is done.
func (c *Conn) standBy(t *time.Timer) bool {
	for {
		if c.closing1.Load() {
			return c.ctx.Err() == nil
		}
		g := c.gen.Load()
		if g == c.bgSeen && c.active.Load() == 0 {
			return true
		}
		c.bgSeen = g
		t.Reset(progressLinger)
		select {
		case <-t.C:
		case <-c.bgKick:
			t.Stop()
		case <-c.ctx.Done():
			t.Stop()
			return false
		}
	}
}

// enter and leave bracket a Read, Write or CloseWrite: the background loop
// stands by meanwhile.
func (c *Conn) enter() {
	c.active.Add(1)
	c.gen.Add(1)
}

func (c *Conn) leave() { c.active.Add(-1) }

// awaitLocked blocks until the connection may have moved: it takes the CQ
// when nobody holds it and waits on it (busy-polling the link first, so
// the caller receives what it waits for itself), then applies what came;
// otherwise it waits on ch for the holder to let go. dl ends the wait
// (its deadline, or the end of the connection). Called and returns with
// mu held; the caller looks again at what it waits for.
func (c *Conn) awaitLocked(dl *deadline, ch chan struct{}) {
	c.blocked.Add(1)
	defer c.blocked.Add(-1)
	if !c.cqOwned {
		c.cqOwned = true
		cq := c.ep.cq // Close frees it under mu
		c.mu.Unlock()
		err := cq.Wait(dl)
		c.mu.Lock()
		c.cqOwned = false
		if c.closing {
			c.wakeWaitersLocked()
			return
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			c.failLocked(err) // the CQ or the device closed
		}
		c.progressLocked()
		c.wakeWaitersLocked()
		return
	}
	c.waiting++
	c.mu.Unlock()
	select {
	case <-ch:
	case <-dl.wait():
	case <-c.closed:
	}
	c.mu.Lock()
	c.waiting--
}

// wakeWaitersLocked wakes the goroutines waiting for the CQ's holder.
func (c *Conn) wakeWaitersLocked() {
	if c.waiting > 0 {
		c.wake()
	}
}

// watch follows the CM connection (a DREQ from the peer) and sends
// keepalives.
func (c *Conn) watch() {
	defer c.wg.Done()
	var tick <-chan time.Time
	if ka := c.ep.cfg.keepalive; ka > 0 {
		t := time.NewTicker(ka)
		defer t.Stop()
		tick = t.C
	}
	probe := time.NewTicker(probeInterval)
	defer probe.Stop()
	done := c.cmc.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-probe.C:
			c.mu.Lock()
			if c.kaPending && time.Since(c.kaPosted) > c.deadAfter {
				c.failLocked(&net.OpError{Op: "keepalive", Net: "rsocket", Source: c.local, Addr: c.remote,
					Err: fmt.Errorf("no answer for %v: %w", c.deadAfter, syscall.ETIMEDOUT)})
				c.mu.Unlock()
				c.wake()
				continue
			}
			if c.blocked.Load() > 0 {
				c.keepaliveLocked()
			}
			c.mu.Unlock()
		case <-done:
			done = nil
			c.mu.Lock()
			// The DREQ may overtake completions of what the peer wrote
			// before it: they are in the CQ already (the peer waited for
			// their ACKs), so take them first, even from under a Read
			// that holds the CQ (peerGoneLocked wakes it).
			c.takeLocked()
			c.peerGoneLocked()
			c.mu.Unlock()
			c.wake()
		case <-tick:
			c.mu.Lock()
			c.keepaliveLocked()
			c.mu.Unlock()
		}
	}
}

func (c *Conn) wake() {
	for _, ch := range [...]chan struct{}{c.rwake, c.wwake, c.cwake, c.bgwake} {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// peerGoneLocked: no more data will come and none can go.
func (c *Conn) peerGoneLocked() {
	c.peerEOF = true
	c.w.Readable, c.w.Writable = false, false
	// A Read or Write waiting on the CQ returns.
	c.rdl.terminate()
	c.wdl.terminate()
}

// failLocked ends the connection with err: the QP goes to the error state
// and the CM sends a DREQ, so the peer learns of it.
func (c *Conn) failLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	c.peerGoneLocked()
	var pe *ProtocolError
	if errors.As(err, &pe) {
		stats.protocolErrors.Add(1)
	}
	if c.closing {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(c.ctx, disconnectWait)
		defer cancel()
		_ = c.cmc.Disconnect(ctx)
	}()
}

// progressLocked polls the CQ and applies every completion, then sends
// the credits that became due (rs_process_cq, rs_update_credits). While
// another goroutine holds the CQ it leaves the completions to that one.
//
// It reads only what the CQ holds: a Read or Write that finds nothing
// waits on the CQ (awaitLocked), and that wait reads the link.
func (c *Conn) progressLocked() {
	if !c.cqOwned && c.ep.cq.Len() > 0 {
		c.takeLocked()
	}
	c.creditsLocked()
}

// takeLocked polls the CQ empty and applies every completion. It polls
// even while another goroutine holds the CQ only when the connection is
// about to end, which wakes the holder anyway (terminate).
func (c *Conn) takeLocked() {
	total := 0
	for {
		n := c.ep.cq.Poll(c.wc[:])
		total += n
		for i := range c.wc[:n] {
			wc := &c.wc[i]
			if wc.Opcode == roce.WCRecvRDMAWithImm || wc.Opcode == roce.WCRecv {
				c.onRecv(wc)
			} else {
				c.onSend(wc)
			}
		}
		if n < len(c.wc) {
			break
		}
	}
	if total > 0 {
		// A Read may have taken a Write's completions or the reverse.
		c.wakeWaitersLocked()
	}
}

// Checks onRecv makes itself, on the completion rather than on the bytes.
var (
	errLength    = &wire.Error{Kind: wire.ErrMalformed, Reason: "length", Detail: "payload length does not match the message"}
	errIOMapSlot = &wire.Error{Kind: wire.ErrProtocol, Reason: "slot", Detail: "iomap index out of range"}
)

func (c *Conn) protocolError(err error, what string) {
	c.failLocked(&ProtocolError{Op: what, Err: err})
}

func (c *Conn) onRecv(wc *roce.WorkCompletion) {
	if wc.Status != roce.WCSuccess {
		if wc.Status == roce.WCWRFlushErr {
			c.peerGoneLocked()
			return
		}
		c.failLocked(fmt.Errorf("rsocket: receive completion: %v: %w", wc.Status, syscall.EIO))
		return
	}
	if c.err != nil {
		return
	}
	if !c.closing {
		if err := c.qp.PostRecv(&c.rwr); err != nil {
			c.failLocked(err)
			return
		}
	}
	if wc.Flags&roce.WCWithImm == 0 || wc.Opcode != roce.WCRecvRDMAWithImm {
		c.protocolError(errLength, "message without immediate")
		return
	}
	m, err := wire.ParseImm(wc.Imm)
	if err != nil {
		c.protocolError(err, "immediate")
		return
	}
	switch m.Op() {
	case wire.OpData:
		if wc.ByteLen != m.Data() {
			c.protocolError(errLength, "data")
			return
		}
		if c.peerEOF {
			c.protocolError(wire.ErrClosed, "data")
			return
		}
		if err := c.w.Recv.OnData(c.w.Recv.FillAddr(), m.Data()); err != nil {
			c.protocolError(err, "data")
		}
	case wire.OpSGL:
		switch wc.ByteLen {
		case 0:
			c.w.Send.OnCredit(m.Data())
		case wire.SGELen:
			slot := c.nextAdv
			b := c.ep.tbuf[slot*wire.SGELen : (slot+1)*wire.SGELen]
			sge, err := wire.ParseAdvert(b, binary.NativeEndian)
			// Cleared, so an advert written into the wrong slot reads
			// as empty instead of as the stale one.
			clear(b)
			if err == nil {
				err = c.w.Send.Advertise(slot, sge)
			}
			if err != nil {
				c.protocolError(err, "buffer advert")
				return
			}
			c.nextAdv ^= 1
			c.w.Send.OnCredit(m.Data())
		default:
			c.protocolError(errLength, "buffer advert")
		}
	case wire.OpIOMapSGL:
		i := int(m.Data())
		if i >= len(c.peerMaps) || wc.ByteLen != wire.IOMapEntryLen {
			c.protocolError(errIOMapSlot, "iomap entry")
			return
		}
		off := wire.IOMapOffset(i)
		e, err := wire.ParseIOMapEntry(c.ep.tbuf[off:off+wire.IOMapEntryLen], binary.NativeEndian)
		if err == nil {
			err = c.w.Recv.OnIOMap()
		}
		if err != nil {
			c.protocolError(err, "iomap entry")
			return
		}
		c.peerMaps[i] = e
	case wire.OpCtrl:
		if wc.ByteLen != 0 {
			c.protocolError(errLength, "control message")
			return
		}
		switch m.Data() {
		case wire.CtrlDisconnect:
			c.peerDisc = true
			c.peerGoneLocked()
		case wire.CtrlShutdown:
			// The peer writes no more; if we do not either, it is over.
			c.peerEOF = true
			if c.w.Writable {
				c.w.Readable = false
			} else {
				c.peerGoneLocked()
			}
		}
	}
}

func (c *Conn) onSend(wc *roce.WorkCompletion) {
	seq := wc.WRID
	if seq < c.sentHead || seq >= c.sentTail {
		return // not a request of ours: the QP is not shared
	}
	if c.kaPending {
		// The queue moves: the peer is alive, however slowly it
		// recovers from loss.
		c.kaPosted = time.Now()
	}
	if wc.Status != roce.WCSuccess && !c.closing && c.err == nil {
		if wc.Status == roce.WCWRFlushErr {
			c.peerGoneLocked()
		} else {
			c.failLocked(&net.OpError{Op: "write", Net: "rsocket", Source: c.local, Addr: c.remote,
				Err: fmt.Errorf("%v: %w", wc.Status, syscall.EIO)})
		}
	}
	for ; c.sentHead <= seq; c.sentHead++ {
		id := c.sent[c.sentHead%uint64(len(c.sent))]
		kind, n := id>>kindShift, uint32(id)
		switch kind {
		case kindData, kindIOWrite:
			c.w.Send.DataDone(n)
		case kindIOMap:
			c.w.Send.DataDone(wire.IOMapEntryLen)
		case kindCredit:
			c.w.Recv.CtrlDone()
		case kindKeepalive:
			c.w.Recv.CtrlDone()
			c.kaPending = false
		case kindCtrl:
			c.w.Recv.CtrlDone()
		}
	}
}

// inflight is the number of send work requests posted and not completed.
func (c *Conn) inflight() int { return int(c.sentTail - c.sentHead) }

// creditsLocked sends the credit messages that are due (rs_give_credits).
func (c *Conn) creditsLocked() {
	for i := 0; i < wire.SGLSize && c.err == nil && !c.closing && c.w.Readable && c.w.Recv.CreditDue(); i++ {
		cr, err := c.w.Recv.NextCredit()
		if err != nil {
			return
		}
		wr := c.resetWR(kindCredit<<kindShift, roce.WRRDMAWriteWithImm)
		wr.Imm = uint32(cr.Imm)
		if cr.HasSGE {
			b := c.scratch()[:wire.SGELen]
			cr.SGE.Put(b, c.entry)
			wr.Flags |= roce.SendInline
			wr.Inline = b
			wr.RemoteAddr, wr.RKey = cr.Addr, cr.Key
		}
		c.postLocked()
	}
}

// ctrlLocked posts a zero-length control message (DISCONNECT, SHUTDOWN).
func (c *Conn) ctrlLocked(imm wire.Imm) {
	wr := c.resetWR(kindCtrl<<kindShift|uint64(imm.Data()), roce.WRRDMAWriteWithImm)
	wr.Imm = uint32(imm)
	c.postLocked()
}

// keepaliveLocked posts librdmacm's keepalive: a zero-length RDMA WRITE
// without immediate to address 0, key 0, using a control slot. Runs at every
// period, idle or not, as the tools do.
func (c *Conn) keepaliveLocked() {
	if c.err != nil || c.closing || c.peerEOF {
		return
	}
	if c.kaPending {
		return // the last one has not completed yet
	}
	if _, err := c.w.Recv.Ctrl(wire.CtrlKeepalive); err != nil {
		return // control slots busy: traffic is flowing anyway
	}
	c.resetWR(kindKeepalive<<kindShift, roce.WRRDMAWrite)
	c.postLocked()
	c.kaPending, c.kaPosted = true, time.Now()
}

// batchMax bounds the work requests posted at once.
const batchMax = 16

// resetWR returns the next work request slot, cleared.
func (c *Conn) resetWR(id uint64, op roce.WROpcode) *roce.SendWR {
	if c.nb == batchMax {
		c.flushLocked()
	}
	seq := c.sentTail + uint64(c.nb)
	c.sent[seq%uint64(len(c.sent))] = id
	c.batch[c.nb] = roce.SendWR{ID: seq, Opcode: op, Flags: roce.SendSignaled}
	return &c.batch[c.nb]
}

// scratch is the slot's buffer for inline control payloads (copied when
// the batch is posted).
func (c *Conn) scratch() []byte { return c.bscratch[c.nb][:] }

// postLocked queues the slot resetWR returned; it is posted at once unless
// a Write is gathering its chunks.
func (c *Conn) postLocked() {
	c.nb++
	if !c.batching {
		c.flushLocked()
	}
}

// flushLocked posts the queued work requests.
func (c *Conn) flushLocked() {
	if c.nb == 0 {
		return
	}
	n, err := c.qp.PostSendBatch(c.batch[:c.nb])
	c.sentTail += uint64(n)
	for i := range c.batch[:c.nb] {
		c.batch[i].SGL, c.batch[i].Inline = nil, nil
	}
	c.nb = 0
	if err != nil {
		c.failLocked(err)
	}
}

// writeChunkLocked posts one data write of up to want bytes of p and
// returns how many it took (rsend's loop body).
func (c *Conn) writeChunkLocked(p []byte, want uint32) (int, error) {
	w, err := c.w.Send.WriteData(want)
	if err != nil {
		return 0, err
	}
	c.postDataLocked(p[:w.Len], kindData, roce.WRRDMAWriteWithImm, uint32(w.Imm), w.Addr, w.Key)
	return int(w.Len), nil
}

// postDataLocked posts an RDMA write of p: inline when small enough,
// otherwise copied into the send ring (two SGEs where it wraps).
func (c *Conn) postDataLocked(p []byte, kind uint64, op roce.WROpcode, imm uint32, addr uint64, key uint32) {
	n := len(p)
	wr := c.resetWR(kind<<kindShift|uint64(n), op)
	wr.Imm, wr.RemoteAddr, wr.RKey = imm, addr, key
	size := len(c.ep.sbuf)
	off := c.shead
	if n <= c.ep.cfg.inline {
		wr.Flags |= roce.SendInline
		wr.Inline = p
	} else if sgl := &c.bsgl[c.nb]; off+n <= size {
		copy(c.ep.sbuf[off:], p)
		sgl[0] = c.ep.smr.SGE(off, n)
		wr.SGL = sgl[:1]
	} else {
		k := size - off
		copy(c.ep.sbuf[off:], p[:k])
		copy(c.ep.sbuf, p[k:])
		sgl[0] = c.ep.smr.SGE(off, k)
		sgl[1] = c.ep.smr.SGE(0, n-k)
		wr.SGL = sgl[:2]
	}
	// Inline writes advance the ring too, so that its free space is
	// always the sender's sbuf_bytes_avail.
	c.shead = (off + n) % size
	// A small write goes unsignalled while the queue and the buffer are
	// at least half free (the sender's counts already exclude it): its
	// ACK then wakes nobody. Once either is half used every write is
	// signalled, so a Write blocked on them always has a completion
	// coming that frees what the unsignalled ones hold.
	sqe, sbuf := c.w.Send.Avail()
	if c.unsignaled < c.ep.cfg.sq/4 && 2*int(sbuf) >= size && 2*sqe >= c.ep.cfg.sq-wire.QPCtrlSize {
		wr.Flags &^= roce.SendSignaled
		c.unsignaled++
	} else {
		c.unsignaled = 0
	}
	c.postLocked()
}

// writableLocked says why nothing can be written, or nil.
func (c *Conn) writableLocked() error {
	switch {
	case c.closing:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case !c.w.Writable:
		return syscall.EPIPE
	}
	return nil
}

// Read reads data the peer wrote into the receive ring. It returns io.EOF
// once the peer shut down or disconnected and every byte was read.
func (c *Conn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.enter()
	defer c.leave()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closing {
			return 0, c.opError("read", net.ErrClosed)
		}
		if c.rdl.exceeded() {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		if c.w.Recv.Unread() == 0 {
			c.progressLocked()
		}
		if u := c.w.Recv.Unread(); u > 0 {
			if len(p) == 0 {
				return 0, nil
			}
			return c.copyOutLocked(p, u), nil
		}
		if c.err != nil {
			return 0, c.opError("read", c.err)
		}
		if c.peerEOF || !c.w.Readable {
			return 0, io.EOF
		}
		if len(p) == 0 {
			return 0, nil
		}
		c.awaitLocked(c.rdl, c.rwake)
	}
}

// copyOutLocked copies up to unread bytes from the ring into p and gives
// the space back to the peer.
func (c *Conn) copyOutLocked(p []byte, unread uint32) int {
	n := min(len(p), int(unread))
	off := int(c.w.Recv.ReadOffset())
	k := copy(p[:n], c.ep.rbuf[off:])
	if k < n {
		copy(p[k:n], c.ep.rbuf)
	}
	_ = c.w.Recv.Consume(uint32(n))
	c.creditsLocked()
	return n
}

// Write writes p into the peer's receive ring, each RDMA WRITE as large as
// the peer's advertised buffer, the send buffer and RS_MAX_TRANSFER allow.
// It blocks while the peer grants no credits or buffer space.
func (c *Conn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.enter()
	defer c.leave()
	c.mu.Lock()
	defer c.mu.Unlock()
	done := 0
	for {
		if err := c.writableLocked(); err != nil {
			return done, c.opError("write", err)
		}
		if c.wdl.exceeded() {
			return done, c.opError("write", os.ErrDeadlineExceeded)
		}
		if done == len(p) {
			return done, nil
		}
		if c.w.Send.Blocked() != nil {
			c.progressLocked()
		}
		c.batching = true
		for c.sendIOMapsLocked() && done < len(p) && c.err == nil && c.w.Send.Blocked() == nil {
			n, err := c.writeChunkLocked(p[done:], uint32(min(len(p)-done, wire.MaxTransfer)))
			if err != nil {
				break
			}
			done += n
		}
		c.batching = false
		c.flushLocked()
		if done < len(p) && c.err == nil {
			c.awaitLocked(c.wdl, c.wwake)
		}
	}
}

// CloseWrite shuts down the sending side (rshutdown SHUT_WR): the peer
// reads io.EOF once it has read everything sent before. librdmacm sends
// RS_CTRL_SHUTDOWN, or DISCONNECT when this side no longer reads.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.enter()
	defer c.leave()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closing {
			return c.opError("close", net.ErrClosed)
		}
		if c.err != nil || !c.w.Writable {
			return nil
		}
		imm, err := c.w.Shutdown(false)
		if err == nil {
			c.ctrlLocked(imm)
			return nil
		}
		// All four control slots are in flight: let them complete.
		if c.wdl.exceeded() {
			return c.opError("close", os.ErrDeadlineExceeded)
		}
		c.awaitLocked(c.wdl, c.wwake)
	}
}

// Close sends RS_CTRL_DISCONNECT and keeps the QP serving until the peer
// no longer needs it (closeWait; an unresponsive peer for no longer than
// the QP's retry timeout), then moves the QP to the error state, sends the
// CM DREQ and frees every resource. Blocked Reads and Writes return
// net.ErrClosed.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing = true
		c.closing1.Store(true)
		close(c.closed)
		c.rdl.terminate()
		c.wdl.terminate()
		wait := c.err == nil
		c.mu.Unlock()
		c.wake()
		select {
		case c.bgKick <- struct{}{}:
		default:
		}
		if wait {
			c.closeWait()
		}
		err := c.cmc.Close()
		c.cancel()
		c.wg.Wait()
		// Under mu: a Read or Write that has not yet seen closing may
		// still look at the endpoint.
		c.mu.Lock()
		c.closeErr = errors.Join(err, c.freeIOMaps(), c.ep.free())
		c.mu.Unlock()
		stats.conns.Add(-1)
	})
	return c.closeErr
}

// closeWait is rshutdown(SHUT_RDWR) made safe for the peer: it sends
// DISCONNECT once a control slot is free (credits still being
// retransmitted may hold all four) and waits until every write we posted,
// that DISCONNECT last, is acknowledged (rs_conn_all_sends_done).
//
// It sends DISCONNECT even when the peer's came first, which librdmacm
// does not: a librdmacm peer that disconnected waits in rshutdown until
// its own writes are acknowledged or a DISCONNECT arrives, ignoring the
// DREQ, and its rdma_rxe QP retransmits forever (retry count 7). Had our
// ACK of its last write been lost, a QP torn down here would leave it
// waiting for good; an acknowledged DISCONNECT of ours ends its wait.
//
// The peer's DREQ ends the wait at once (it destroyed its QP); an
// unresponsive peer, the retry timeout without a send completion (counted
// in Stats.CloseTimeouts). The timeout counts from the last completion,
// not from the start: under loss, data still queued may take many
// retransmission timeouts to drain, and cutting it off would leave the
// peer waiting for it.
func (c *Conn) closeWait() {
	t := time.NewTimer(c.deadAfter)
	defer t.Stop()
	sent := false
	last := -1
	for {
		c.mu.Lock()
		select {
		case <-c.cmc.Done():
			// Take what the peer wrote before its DREQ, as watch does.
			c.takeLocked()
			c.mu.Unlock()
			return
		default:
		}
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		if !sent {
			if imm, err := c.w.Shutdown(true); err == nil {
				c.ctrlLocked(imm)
				sent = true
			}
		}
		c.progressLocked()
		done := sent && c.inflight() == 0
		if last >= 0 && c.inflight() < last {
			t.Reset(c.deadAfter) // the queue moves
		}
		last = c.inflight()
		if done {
			c.mu.Unlock()
			return
		}
		// The background loop takes the completions.
		c.waiting++
		c.mu.Unlock()
		timeout := false
		select {
		case <-c.cwake:
		case <-c.cmc.Done():
		case <-t.C:
			timeout = true
		}
		c.mu.Lock()
		c.waiting--
		c.mu.Unlock()
		if timeout {
			stats.closeTimeouts.Add(1)
			return
		}
	}
}

func (c *Conn) opError(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "rsocket", Source: c.local, Addr: c.remote, Err: err}
}

// LocalAddr returns the local address and rdma_cm port.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr returns the peer's address and rdma_cm port.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}

// SetReadDeadline sets the deadline for Read calls, pending ones included.
func (c *Conn) SetReadDeadline(t time.Time) error { c.rdl.set(t); return nil }

// SetWriteDeadline sets the deadline for Write calls, pending ones included.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.set(t); return nil }

// Err returns why the connection failed, or nil.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// ProtocolError reports a peer that broke the rsocket protocol: the
// connection is ended and Stats counts it.
type ProtocolError struct {
	Op  string // what was being received
	Err error  // a wire error: wire.ErrMalformed, wire.ErrProtocol or wire.ErrClosed
}

func (e *ProtocolError) Error() string {
	return "rsocket: peer broke the protocol: " + e.Op + ": " + e.Err.Error()
}
func (e *ProtocolError) Unwrap() error { return e.Err }

func tcpAddr(a netip.AddrPort) net.Addr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a.Addr().Unmap(), a.Port()))
}
