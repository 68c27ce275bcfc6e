// Package emulator is a Go sender that behaves on the wire like the SLAC
// firmware's RoCEv2 engine (surf RoCEv2AxiStreamRdmaCore): a stand-in for
// the FPGA in tests, and a tool to qualify a DAQ host before the FPGA
// exists.
//
// Like the firmware it sends each frame as one message of at most one path
// MTU, as SEND WITH IMMEDIATE into the host's posted receives (gen 2) or,
// with Config.Write, as RDMA WRITE WITH IMMEDIATE to the host's slab at
// MRAddr + (counter mod depth)·maxPayload (gen 1). The immediate is
// (counter << 8) | channel, the counter free-running over 24 bits (gen 1:
// wrapping at the host's depth, the firmware's AddrWrapCount). Every frame
// is copied into a replay ring of RingSlots registered slots that is not
// reused before the frame's completion, so a retransmission after a loss or
// an RNR NAK resends identical bytes; RNR retries are infinite (rnr_retry
// 7), the transport retry count and timeout are the firmware's (3, 14).
//
// The firmware streams: it never waits per frame, only for ring room.
// SendBatch is the emulator's streaming form: it hands the device as many
// frames as the ring has room for in one transmit pass, where Send pays a
// link write (on AF_XDP a system call) per frame. A host that is measured
// against the emulator should be fed with SendBatch and a ring that covers
// the ACK round trip, which in software is scheduling, not wire, time.
//
// Setup follows the firmware's metadata-bus sequence: the host's values go
// in (Connect), the FPGA's QP is created and moved to RTR with the host's
// QPN and RqPSN and to RTS with the host's SqPSN, and the FPGA's QPN comes
// back together with the PSN the host passes to CompleteConnection as
// fpgaRqPSN (the host's SqPSN, as PyRogue does).
//
// The emulator runs on a goroce device: its address is an address of the
// interface that device runs on (or of a memory link), so ARP and neighbour
// discovery for it are answered by the kernel, which owns the interface
// (AF_XDP steers only RoCEv2 UDP to the device). It needs no responder of
// its own.
package emulator

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/goroce/goroce/fpga/wire"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// Errors of the emulator.
var (
	ErrTooLarge     = errors.New("emulator: frame larger than the PMTU or the host's slot")
	ErrEmpty        = errors.New("emulator: empty frame")
	ErrNotConnected = errors.New("emulator: not connected")
	ErrCompletion   = errors.New("emulator: send completed with an error")
)

// Config configures an emulator.
type Config struct {
	// PMTU is the path MTU (default 4096).
	PMTU ib.MTU
	// Write selects the gen-1 data path (RDMA WRITE WITH IMMEDIATE).
	Write bool
	// RingSlots is the replay ring size: frames in flight (default 16, the
	// firmware's RING_SLOTS_G).
	RingSlots int
	// RetryCnt and Timeout are the transport retry count and local ACK
	// timeout code (default 3 and 14). RNR retry is always 7 (forever).
	RetryCnt, Timeout uint8
	// SGID is the emulator's GID (default: the device's address of the
	// host's family).
	SGID ib.GID
}

// HostParams are the host's values the FPGA is programmed with.
type HostParams struct {
	QPN   uint32
	GID   ib.GID
	RqPSN uint32
	SqPSN uint32
	// Gen 1 only: the slab and its geometry.
	MRAddr     uint64
	MRRKey     uint32
	MaxPayload int
	Depth      int
}

// Params are the values the firmware returns: the FPGA's QPN and PSNs.
// RqPSN is what the host passes to CompleteConnection as fpgaRqPsn: the PSN
// the FPGA sends first.
type Params struct {
	QPN   uint32
	GID   ib.GID
	RqPSN uint32 // = SqPSN: the host's receive queue must expect it
	SqPSN uint32 // the FPGA's first send PSN
}

// Stats are the emulator's counters. RNRNAKs and Retransmits are the
// device's counters since New (the emulator's device is normally its own).
type Stats struct {
	Frames, Bytes uint64
	Errors        uint64
	RNRNAKs       uint64
	Retransmits   uint64
}

// Emulator is one FPGA sender.
type Emulator struct {
	dev  *roce.Device
	cfg  Config
	pd   *roce.PD
	cq   *roce.CQ
	qp   *roce.QP
	ring *roce.MR
	slot int // ring slot size

	host    HostParams
	params  Params
	nextPSN uint32 // the PSN the next frame goes out with (one packet per frame)
	counter uint32
	sent    uint64        // frames posted
	done    uint64        // frames completed
	wrs     []roce.SendWR // one per ring slot: a batch never exceeds the ring
	sges    []roce.SGE
	one     [1][]byte
	wc      [16]roce.WorkCompletion

	base                  roce.Counters
	frames, bytes, errors atomic.Uint64
}

// New creates an emulator on dev: its PD, CQ and replay ring. Connect
// creates the QP.
func New(dev *roce.Device, cfg Config) (*Emulator, error) {
	if cfg.PMTU == 0 {
		cfg.PMTU = ib.MTU4096
	}
	if cfg.RingSlots <= 0 {
		cfg.RingSlots = 16
	}
	if cfg.RetryCnt == 0 {
		cfg.RetryCnt = 3
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 14
	}
	if !cfg.PMTU.Valid() {
		return nil, fmt.Errorf("emulator: PMTU %d: invalid", cfg.PMTU)
	}
	e := &Emulator{dev: dev, cfg: cfg, slot: cfg.PMTU.Bytes(), base: dev.Counters(),
		wrs: make([]roce.SendWR, cfg.RingSlots), sges: make([]roce.SGE, cfg.RingSlots)}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(2 * cfg.RingSlots); err != nil {
		e.pd.Close()
		return nil, err
	}
	if e.ring, err = e.pd.RegisterMR(make([]byte, cfg.RingSlots*e.slot), roce.AccessLocalWrite); err != nil {
		e.cq.Close()
		e.pd.Close()
		return nil, err
	}
	return e, nil
}

// Connect programs the emulator with the host's values and returns its own,
// as the firmware's QP create / INIT / RTR / RTS sequence does. The first
// frame goes out with PSN h.SqPSN.
func (e *Emulator) Connect(ctx context.Context, h HostParams) (Params, error) {
	return e.connect(ctx, h, h.SqPSN)
}

// Reconnect drops the QP and connects to a new host QP. With keepPSN the
// new QP goes on at the PSN the old one would have sent next, and the
// counter goes on too: an FPGA that was not soft-reset while the host
// restarted. Without it, Reconnect is a soft reset followed by Connect.
func (e *Emulator) Reconnect(ctx context.Context, h HostParams, keepPSN bool) (Params, error) {
	psn := h.SqPSN
	if keepPSN {
		psn = e.nextPSN
	} else {
		e.counter = 0
	}
	if e.qp != nil {
		e.qp.Close()
		e.qp = nil
		// Completions of the old QP are gone with it.
		for e.cq.Poll(e.wc[:]) > 0 {
		}
		e.sent, e.done = 0, 0
	}
	return e.connect(ctx, h, psn)
}

func (e *Emulator) connect(ctx context.Context, h HostParams, sqPSN uint32) (Params, error) {
	if e.qp != nil {
		return Params{}, errors.New("emulator: already connected (use Reconnect)")
	}
	if e.cfg.Write && (h.MaxPayload <= 0 || h.Depth <= 0 || h.MRRKey == 0) {
		return Params{}, fmt.Errorf("emulator: the gen-1 data path needs the host's MR address, rkey, slot size and depth")
	}
	q, err := e.pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: roce.QPCap{MaxSendWR: e.cfg.RingSlots, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return Params{}, err
	}
	sgid := e.cfg.SGID
	if sgid == (ib.GID{}) {
		if sgid, err = e.dev.SourceGID(h.GID.Addr()); err != nil {
			q.Close()
			return Params{}, err
		}
	}
	// The firmware's modify requests: access 0x0E, max_rd_atomic and
	// max_dest_rd_atomic 16, timeout 14, RNR retry 7.
	err = q.Connect(ctx, &roce.ConnectAttr{RemoteQPN: h.QPN, RemoteGID: h.GID, SGID: sgid,
		RemotePSN: h.RqPSN, LocalPSN: sqPSN, PathMTU: e.cfg.PMTU,
		Access:  roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessLocalWrite,
		Timeout: e.cfg.Timeout, RetryCnt: e.cfg.RetryCnt, RNRRetry: 7, MinRNRTimer: 1, RdAtomic: 16,
		NoDefaults: true, HopLimit: 64})
	if err != nil {
		q.Close()
		return Params{}, err
	}
	e.qp, e.host, e.nextPSN = q, h, sqPSN
	e.params = Params{QPN: q.QPN(), GID: sgid, RqPSN: sqPSN, SqPSN: sqPSN}
	return e.params, nil
}

// Params returns the values Connect returned.
func (e *Emulator) Params() Params { return e.params }

// MaxFrame returns the largest frame: the PMTU, and in gen 1 also the
// host's slot size.
func (e *Emulator) MaxFrame() int {
	n := e.slot
	if e.cfg.Write && e.host.MaxPayload < n {
		n = e.host.MaxPayload
	}
	return n
}

// Send sends one frame on channel ch. It copies p into the replay ring and
// returns once the frame is posted; when the ring is full it first waits
// for the oldest frame's completion (the firmware back-pressures its input
// the same way). ctx bounds that wait. Send is not safe for concurrent use.
func (e *Emulator) Send(ctx context.Context, ch uint8, p []byte) error {
	e.one[0] = p
	_, err := e.SendBatch(ctx, ch, e.one[:])
	e.one[0] = nil
	return err
}

// SendBatch sends frames on channel ch, in order, as Send would one by one,
// but posts as many as the replay ring has room for at once, so the device
// transmits them in one pass (one link write for up to its TxBatch
// frames): the firmware streams frames back to back and does not pay a
// host's per-frame system call. It waits for room in the ring like Send and
// returns how many frames were posted; on an invalid frame it stops there
// with the frame's error.
func (e *Emulator) SendBatch(ctx context.Context, ch uint8, frames [][]byte) (int, error) {
	if e.qp == nil {
		return 0, ErrNotConnected
	}
	sent := 0
	for sent < len(frames) {
		for e.sent-e.done >= uint64(e.cfg.RingSlots) {
			if err := e.reap(ctx, true); err != nil {
				return sent, err
			}
		}
		room := e.cfg.RingSlots - int(e.sent-e.done)
		k, err := e.fill(ch, frames[sent:min(len(frames), sent+room)])
		if k > 0 {
			n, perr := e.qp.PostSendBatch(e.wrs[:k])
			e.post(n)
			sent += n
			if perr != nil {
				e.errors.Add(1)
				return sent, perr
			}
		}
		if err != nil {
			e.errors.Add(1)
			return sent, err
		}
		if err := e.reap(ctx, false); err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// fill copies frames into the ring slots after the last one posted and
// prepares their work requests in e.wrs; it stops at an invalid frame and
// returns how many it prepared with that frame's error.
func (e *Emulator) fill(ch uint8, frames [][]byte) (int, error) {
	limit := e.MaxFrame()
	ring := e.ring.Bytes()
	counter := e.counter
	for k, p := range frames {
		if len(p) == 0 {
			return k, ErrEmpty
		}
		if len(p) > limit {
			return k, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, len(p), limit)
		}
		id := e.sent + uint64(k)
		i := int(id % uint64(e.cfg.RingSlots))
		copy(ring[i*e.slot:], p)
		e.sges[k] = e.ring.SGE(i*e.slot, len(p))
		w := &e.wrs[k]
		*w = roce.SendWR{ID: id, Opcode: roce.WRSendWithImm, Flags: roce.SendSignaled, SGL: e.sges[k : k+1 : k+1],
			Imm: uint32(wire.MakeImm(counter, ch))}
		if e.cfg.Write {
			w.Opcode = roce.WRRDMAWriteWithImm
			w.RemoteAddr = e.host.MRAddr + uint64(int(counter)%e.host.Depth*e.host.MaxPayload)
			w.RKey = e.host.MRRKey
		}
		counter = (counter + 1) & 0xFFFFFF
		if e.cfg.Write && int(counter) >= e.host.Depth {
			counter = 0
		}
	}
	return len(frames), nil
}

// post accounts for the first n work requests of e.wrs, posted.
func (e *Emulator) post(n int) {
	for i := range e.wrs[:n] {
		w := &e.wrs[i]
		e.sent++
		e.nextPSN = (e.nextPSN + 1) & ib.PSNMask
		e.counter = (e.counter + 1) & 0xFFFFFF
		if e.cfg.Write && int(e.counter) >= e.host.Depth {
			e.counter = 0
		}
		e.frames.Add(1)
		e.bytes.Add(uint64(w.SGL[0].Length))
	}
}

// reap takes completions; with wait it blocks until there is at least one.
func (e *Emulator) reap(ctx context.Context, wait bool) error {
	for {
		n := e.cq.Poll(e.wc[:])
		for i := range e.wc[:n] {
			e.done++
			if e.wc[i].Status != roce.WCSuccess {
				e.errors.Add(1)
				return fmt.Errorf("%w: frame %d: %v", ErrCompletion, e.wc[i].WRID, e.wc[i].Status)
			}
		}
		if n > 0 || !wait {
			return nil
		}
		if err := e.cq.Wait(ctx); err != nil {
			return err
		}
	}
}

// Flush waits until every frame sent is acknowledged.
func (e *Emulator) Flush(ctx context.Context) error {
	for e.sent > e.done {
		if err := e.reap(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// Outstanding returns the frames sent and not yet acknowledged.
func (e *Emulator) Outstanding() int { return int(e.sent - e.done) }

// Stats returns the counters.
func (e *Emulator) Stats() Stats {
	c := e.dev.Counters()
	return Stats{Frames: e.frames.Load(), Bytes: e.bytes.Load(), Errors: e.errors.Load(),
		RNRNAKs: c.RcvdRNRErr - e.base.RcvdRNRErr, Retransmits: c.CompleterRetryErr - e.base.CompleterRetryErr}
}

// Close destroys the QP, the ring and the CQ.
func (e *Emulator) Close() error {
	if e.qp != nil {
		e.qp.Close()
		e.qp = nil
	}
	if e.ring != nil {
		e.ring.Close()
		e.cq.Close()
		e.pd.Close()
		e.ring = nil
	}
	return nil
}
