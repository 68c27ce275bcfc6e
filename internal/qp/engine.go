package qp

import (
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/ib"
)

// Clock gives the engine the current time as a monotonic offset.
type Clock interface {
	Now() time.Duration
}

// Device limits, as rxe advertises them.
const (
	MaxMsgSize     = 1 << 31 // largest message (rxe: RXE_PORT_MAX_MSG_SZ)
	MaxSGE         = 32
	MaxInline      = 400
	MaxQPWR        = 1 << 14
	MaxCQE         = 1<<15 - 1
	MaxRdAtomic    = 128 // max_qp_rd_atom / max_qp_init_rd_atom
	maxPktPerAck   = 64  // RXE_MAX_PKT_PER_ACK: AckReq on a packet preceded by more than this many without one
	maxUnackedPSNs = 128 // requester window (RXE_MAX_UNACKED_PSNS)
	firstQPN       = 17
	defaultPKey    = 0xFFFF
	maxHeaderLen   = 12 + 16 + 4 + 28 // BTH + RETH + ImmDt, or BTH + AtomicETH, plus slack
	grhAreaLen     = 40
)

// GSIQKey is the Q_Key of QP1 (IB_QP1_QKEY).
const GSIQKey = 0x80010000

// Config configures an Engine.
type Config struct {
	// Clock is required.
	Clock Clock
	// PortMTU is the active MTU of the port: the UD payload limit. Default MTU1024
	// (what rxe reports on a 1500-byte netdev).
	PortMTU ib.MTU
	// CC turns on congestion control (ccrate.go); off by default.
	CC CCConfig
	// Shards splits the QPs that have packets to send into this many
	// queues by QPN (QPN mod Shards, 1..MaxShards; default 1), so that a
	// device can run one transmit pass per shard at once
	// (Engine.TransmitShard): the packets of one QP always come from the
	// same queue, in order.
	Shards int
}

// MaxShards is the largest Config.Shards.
const MaxShards = 64

// AddressVector says where packets of a QP (RC/UC) or of a UD send go.
// The destination MAC is not the engine's business: the device resolves it.
type AddressVector struct {
	DGID         ib.GID
	SGID         ib.GID // source GID (the local address the device sends from)
	TrafficClass uint8
	HopLimit     uint8
	FlowLabel    uint32
	// SrcPort is the UDP source port; 0 means the rxe per-QP default.
	SrcPort uint16
}

// Source describes where a received packet came from.
type Source struct {
	SGID, DGID   ib.GID
	SrcPort      uint16
	TrafficClass uint8
	HopLimit     uint8
	FlowLabel    uint32
	// NetworkHeader is the IPv4 (20 bytes) or IPv6 (40 bytes) header as received;
	// it fills the 40-byte GRH area of UD receive buffers. May be nil.
	NetworkHeader []byte
}

// TxPacket is one outgoing packet slot. The device sets Buf and Headroom;
// Transmit writes the IB packet (BTH … pad, then 4 reserved ICRC bytes) at
// Buf[Headroom:] and sets Len, AV and SrcQPN.
type TxPacket struct {
	Buf      []byte
	Headroom int
	Len      int // IB packet length including the 4 ICRC bytes
	AV       AddressVector
	SrcQPN   uint32
}

// Payload returns the IB packet written into the slot.
func (t *TxPacket) Payload() []byte { return t.Buf[t.Headroom : t.Headroom+t.Len] }

// Stats counts engine events.
type Stats struct {
	RxPackets, TxPackets uint64
	RxDropped            uint64
	Retransmits          uint64 // go-back-N episodes started
	Timeouts             uint64
	// Probes counts resends from the first unacknowledged PSN after a
	// probe timeout (a few round trips without progress; cc.go), each of
	// which would otherwise have waited for the local ACK timeout.
	Probes uint64
	// SpuriousProbes counts probes found needless: the path had stalled,
	// nothing was lost, and the probe timeout rises above such stalls.
	SpuriousProbes           uint64
	RNRNAKsRcvd, RNRNAKsSent uint64
	SeqNAKsRcvd, SeqNAKsSent uint64
	DuplicateRequests        uint64
	BadAddress               uint64 // RC/UC packets from or to an address other than the QP's peer
	// RKeyViolations counts requests refused for their R_Key (a remote
	// access error NAK on RC, a dropped message on UC): a key that names no
	// MR or window usable by the QP, or that lacks the access or the range.
	RKeyViolations uint64
	ShortTxBuffer  uint64
	DC             DCStats

	// AcksCoalesced counts positive ACKs not sent because a later ACK of
	// the same QP, queued before the next transmit pass, covers them: a
	// burst of requests received in one batch is acknowledged once.
	AcksCoalesced uint64
}

// Engine owns every verbs object of one device and runs their transport.
type Engine struct {
	clock   Clock
	portMTU ib.MTU

	qps     map[uint32]*QP
	rxQP    *QP // the QP of the last packet received (lookupQP)
	qpList  []*QP
	nextQPN uint32

	keys keyTable

	closed bool
	ready  []readyList // one per shard (Config.Shards)
	// readyMask has bit i set while ready[i] is not empty. It is written
	// under the caller's serialization and read without it
	// (ReadyShards), so that a device learns which shards to transmit on
	// without taking its lock.
	readyMask atomic.Uint64
	turn      int       // the shard Transmit starts at (round robin)
	timers    timerHeap // QPs that may have a timer running (timers.go)
	// armed is the earliest timer armed since the last TakeArmed
	// (armedOK: any), so a driver learns of an earlier deadline in O(1)
	// instead of asking NextDeadline again.
	armed   time.Duration
	armedOK bool
	stats   Stats

	onEvent func(Event) // asynchronous events (events.go)
	dc      dcEngine
	cc      ccEngine
}

// New creates an engine.
func New(cfg Config) (*Engine, error) {
	if cfg.Clock == nil {
		return nil, ErrInvalidArgument
	}
	if cfg.PortMTU == 0 {
		cfg.PortMTU = ib.MTU1024
	}
	if cfg.PortMTU.Bytes() == 0 {
		return nil, ErrInvalidArgument
	}
	if cfg.Shards == 0 {
		cfg.Shards = 1
	}
	if cfg.Shards < 0 || cfg.Shards > MaxShards {
		return nil, ErrInvalidArgument
	}
	e := &Engine{
		clock:   cfg.Clock,
		portMTU: cfg.PortMTU,
		qps:     make(map[uint32]*QP),
		nextQPN: firstQPN,
		ready:   make([]readyList, cfg.Shards),
	}
	for i := range e.ready {
		e.ready[i].bit, e.ready[i].mask = 1<<i, &e.readyMask
	}
	e.keys.init()
	if err := e.cc.init(cfg.CC); err != nil {
		return nil, err
	}
	return e, nil
}

// Close destroys every QP; the engine accepts no packets afterwards.
func (e *Engine) Close() error {
	if e.closed {
		return ErrClosed
	}
	for len(e.qpList) > 0 {
		e.qpList[len(e.qpList)-1].Destroy()
	}
	e.closed = true
	return nil
}

// HasWork reports whether some QP may have packets to send: the device calls
// Transmit when it does (after Receive, PostSend, Modify or Advance).
func (e *Engine) HasWork() bool { return e.readyMask.Load() != 0 }

// Shards returns the number of transmit shards (Config.Shards).
func (e *Engine) Shards() int { return len(e.ready) }

// ShardOf returns the transmit shard of the QP numbered qpn.
func (e *Engine) ShardOf(qpn uint32) int { return int(qpn % uint32(len(e.ready))) }

// ReadyShards returns a mask of the shards that may have packets to send
// (bit i: shard i). Unlike the other methods it is safe to call at any
// time, concurrently with any of them: a device calls it after its engine
// calls to learn which transmit passes to run. A bit set by an engine call
// is seen by a ReadyShards that follows the call.
func (e *Engine) ReadyShards() uint64 { return e.readyMask.Load() }

// Stats returns the engine counters.
func (e *Engine) Stats() Stats { return e.stats }

// PortMTU returns the active port MTU.
func (e *Engine) PortMTU() ib.MTU { return e.portMTU }

// SetPortMTU changes the active port MTU (the UD payload limit), for example
// when the netdev MTU changes (see ib.ActiveMTU).
func (e *Engine) SetPortMTU(m ib.MTU) error {
	if m.Bytes() == 0 {
		return ErrInvalidArgument
	}
	e.portMTU = m
	return nil
}

// QP returns the queue pair with number qpn, or nil.
func (e *Engine) QP(qpn uint32) *QP { return e.qps[qpn] }

// readyList is a FIFO of QPs that may have packets to send: one shard's.
// Its bit in the mask is set while the list or its inbox is not empty.
type readyList struct {
	head, tail *QP
	bit        uint64         // this list's bit in *mask
	mask       *atomic.Uint64 // the engine's readyMask
	// inbox is a stack of the QPs PostSendConcurrent posted on, pushed
	// without the engine's serialization; the transmit pass moves them
	// into the list (drain). A QP is in it at most once (QP.inboxed).
	inbox atomic.Pointer[QP]
}

// post puts q in the inbox, unless it is there already, and raises the
// shard's bit. Safe at any time; under q.sqMu, so that Destroy, which
// drains after it marks q destroyed under that lock, leaves no post of a
// live QP behind.
func (r *readyList) post(q *QP) {
	// q's new tail was stored before inboxed is read: if it is seen set,
	// drain clears it later and the transmit pass that follows absorbs
	// the tail.
	if q.inboxed.Load() || !q.inboxed.CompareAndSwap(false, true) {
		return
	}
	for {
		old := r.inbox.Load()
		q.inboxNext = old
		if r.inbox.CompareAndSwap(old, q) {
			break
		}
	}
	r.mask.Or(r.bit)
}

// drain moves the QPs of the inbox into the list, in the order they came.
func (r *readyList) drain() {
	if r.inbox.Load() == nil {
		return
	}
	var rev *QP
	for q := r.inbox.Swap(nil); q != nil; {
		next := q.inboxNext
		q.inboxNext = rev
		rev, q = q, next
	}
	for q := rev; q != nil; {
		next := q.inboxNext
		q.inboxNext = nil
		// Its link read and cleared first: a post may push it again now.
		q.inboxed.Store(false)
		if !q.destroyed {
			r.push(q)
		}
		q = next
	}
}

// emptied drops the shard's bit when the list has become empty, unless a
// post has filled the inbox meanwhile.
func (r *readyList) emptied() {
	r.mask.And(^r.bit)
	if r.inbox.Load() != nil {
		r.mask.Or(r.bit)
	}
}

func (r *readyList) push(q *QP) {
	if q.inReady {
		return
	}
	q.inReady = true
	q.readyNext = nil
	if r.tail == nil {
		r.head = q
		r.mask.Or(r.bit)
	} else {
		r.tail.readyNext = q
	}
	r.tail = q
}

func (r *readyList) pop() *QP {
	q := r.head
	if q == nil {
		return nil
	}
	r.head = q.readyNext
	if r.head == nil {
		r.tail = nil
		r.emptied()
	}
	q.readyNext = nil
	q.inReady = false
	return q
}

func (r *readyList) remove(q *QP) {
	if !q.inReady {
		return
	}
	var prev *QP
	for c := r.head; c != nil; c = c.readyNext {
		if c == q {
			if prev == nil {
				r.head = c.readyNext
			} else {
				prev.readyNext = c.readyNext
			}
			if r.tail == c {
				r.tail = prev
			}
			if r.head == nil {
				r.emptied()
			}
			break
		}
		prev = c
	}
	q.inReady = false
	q.readyNext = nil
}

// Transmit fills up to len(pkts) slots with packets to send and returns how
// many it filled. Each slot needs room for Headroom + the path MTU + 64 bytes;
// a slot too small for the next packet ends the call (counted in
// Stats.ShortTxBuffer) without losing anything. It serves every shard,
// starting at a different one each call.
func (e *Engine) Transmit(pkts []TxPacket) int {
	if len(e.ready) == 1 {
		return e.TransmitShard(0, pkts)
	}
	n := 0
	for i := range e.ready {
		k, short := e.transmit((e.turn+i)%len(e.ready), pkts[n:])
		n += k
		if short || n == len(pkts) {
			break
		}
	}
	e.turn = (e.turn + 1) % len(e.ready)
	return n
}

// TransmitShard is Transmit for the QPs of one shard (ShardOf). The
// packets of a QP come from its shard only, so a device that runs one
// transmit pass per shard at a time, each sending its packets in the order
// TransmitShard gave them, sends every QP's packets in order.
func (e *Engine) TransmitShard(shard int, pkts []TxPacket) int {
	n, _ := e.transmit(shard, pkts)
	return n
}

// transmit is TransmitShard; short says a slot too short ended it.
func (e *Engine) transmit(shard int, pkts []TxPacket) (n int, short bool) {
	now := e.clock.Now()
	rl := &e.ready[shard]
	rl.drain()
	for n < len(pkts) {
		q := rl.pop()
		if q == nil {
			break
		}
		short = false
		q.absorbPosts()
		for n < len(pkts) {
			r := q.produce(now, &pkts[n])
			if r == produced {
				n++
				continue
			}
			short = r == shortBuffer
			break
		}
		q.publishHead() // UD sends complete as they leave
		// Round robin: a QP that filled the last slot or met a short one
		// goes to the back of the queue and keeps its work.
		if short || (n == len(pkts) && q.mayHaveWork()) {
			rl.push(q)
		}
		if short {
			break
		}
	}
	e.stats.TxPackets += uint64(n)
	return n, short
}

// Receive processes one received IB packet. src describes the network source
// (it may be nil; UD receives then get a zero GRH area).
// A non-nil error says why the packet was dropped; it never needs handling
// beyond counting.
func (e *Engine) Receive(p *ib.Packet, src *Source) error {
	e.stats.RxPackets++
	if e.closed {
		return ErrClosed
	}
	if len(p.BTH) < ib.BTHSize {
		e.stats.RxDropped++
		return ErrBadHeader
	}
	if p.BTH.Opcode().Transport() == ib.TransportDC {
		err := e.receiveDC(p, src)
		if err != nil {
			e.stats.RxDropped++
		}
		return err
	}
	if p.BTH.Opcode() == ib.CNP {
		err := e.receiveCNP(p, src)
		if err != nil {
			e.stats.RxDropped++
		}
		return err
	}
	q := e.lookupQP(p.BTH.DestQP())
	if q == nil {
		e.stats.RxDropped++
		return ErrUnknownQP
	}
	err := q.receive(p, src)
	q.publishHead()
	if err != nil {
		e.stats.RxDropped++
	}
	return err
}

// lookupQP returns the QP numbered qpn, or nil. Received packets come in
// runs to one QP, so the QP of the last packet is tried before the map;
// Destroy forgets it, so a QPN reused by a new QP is looked up afresh.
func (e *Engine) lookupQP(qpn uint32) *QP {
	if q := e.rxQP; q != nil && q.qpn == qpn && !q.destroyed {
		return q
	}
	q := e.qps[qpn]
	if q != nil {
		e.rxQP = q
	}
	return q
}

// NextDeadline returns the earliest pending timer of any QP.
func (e *Engine) NextDeadline() (time.Duration, bool) { return e.timers.next() }

// TakeArmed returns the earliest deadline armed since the previous call
// and forgets it. A driver that sleeps until NextDeadline calls it after
// each engine call that may arm a timer (Receive, Transmit) and wakes
// earlier when it returns a deadline before its planned wake-up; so it
// never needs to poll. The deadline may belong to a timer since stopped
// or pushed later: a wake-up at it finds nothing due.
func (e *Engine) TakeArmed() (time.Duration, bool) {
	at, ok := e.armed, e.armedOK
	e.armedOK = false
	return at, ok
}

// Advance runs every timer due at or before now.
func (e *Engine) Advance(now time.Duration) { e.timers.advance(now) }

func (e *Engine) schedule(q *QP) { e.readyOf(q).push(q) }

// readyOf returns the ready list of q's shard. A DC initiator's context
// has its DCT's QPN, and the DC NAK sender QPN 0.
func (e *Engine) readyOf(q *QP) *readyList {
	if len(e.ready) == 1 {
		return &e.ready[0]
	}
	return &e.ready[q.qpn%uint32(len(e.ready))]
}

// keyTable maps L_Keys/R_Keys to memory regions and memory windows, which
// share one index space so that a key names at most one object. An MR key
// is index<<8 | an 8-bit generation; deregistration bumps the generation,
// and a slot whose generation would wrap is retired, so an MR key once
// invalidated is never honoured again. A window's low 8 bits are the
// consumer key its binder chooses (mw.go). Free slots are reused
// oldest-first to delay reuse as long as possible.
type keyTable struct {
	mrs  []*MR
	mws  []*MW
	gens []uint8
	uses []uint16
	free []uint32 // FIFO of free indices
}

const maxMRIndex = 1 << 24

func (k *keyTable) init() {
	// Index 0 is never used so that key 0 (often "no key") is never valid.
	k.mrs = append(k.mrs, nil)
	k.mws = append(k.mws, nil)
	k.gens = append(k.gens, 0)
	k.uses = append(k.uses, 256)
}

func (k *keyTable) alloc(mr *MR) (uint32, bool) {
	idx, ok := k.allocIndex()
	if !ok {
		return 0, false
	}
	k.mrs[idx] = mr
	return idx<<8 | uint32(k.gens[idx]), true
}

// allocMW takes a slot for a window and returns its initial key.
func (k *keyTable) allocMW(mw *MW) (uint32, bool) {
	idx, ok := k.allocIndex()
	if !ok {
		return 0, false
	}
	k.mws[idx] = mw
	return idx<<8 | uint32(k.gens[idx]), true
}

func (k *keyTable) allocIndex() (uint32, bool) {
	var idx uint32
	if len(k.free) > 0 && len(k.mrs) >= 1024 {
		idx = k.free[0]
		k.free = k.free[1:]
	} else if len(k.mrs) < maxMRIndex {
		idx = uint32(len(k.mrs))
		k.mrs = append(k.mrs, nil)
		k.mws = append(k.mws, nil)
		// Spread initial generations so neighbouring keys differ in their low byte.
		k.gens = append(k.gens, uint8(idx*0x9D+0x35))
		k.uses = append(k.uses, 0)
	} else if len(k.free) > 0 {
		idx = k.free[0]
		k.free = k.free[1:]
	} else {
		return 0, false
	}
	k.uses[idx]++
	return idx, true
}

func (k *keyTable) release(key uint32) {
	idx := key >> 8
	if idx == 0 || int(idx) >= len(k.mrs) || (k.mrs[idx] == nil && k.mws[idx] == nil) {
		return
	}
	k.mrs[idx] = nil
	k.mws[idx] = nil
	k.gens[idx]++
	if k.uses[idx] < 255 {
		k.free = append(k.free, idx)
	}
	// else: retired; every generation has been used once.
}

func (k *keyTable) lookup(key uint32) *MR {
	idx := key >> 8
	if int(idx) >= len(k.mrs) {
		return nil
	}
	mr := k.mrs[idx]
	if mr == nil || mr.key != key || !mr.valid {
		return nil
	}
	return mr
}

// lookupMW returns the window whose current R_Key is key, in any state.
func (k *keyTable) lookupMW(key uint32) *MW {
	idx := key >> 8
	if int(idx) >= len(k.mws) {
		return nil
	}
	mw := k.mws[idx]
	if mw == nil || mw.rkey != key {
		return nil
	}
	return mw
}
