package qp

import (
	"errors"
	"time"

	"github.com/goroce/goroce/ib"
)

// DC queue pair types (mlx5dv_create_qp with MLX5DV_DCTYPE_DCI / _DCT). The
// values are goroce's: ibverbs creates both as IBV_QPT_DRIVER.
const (
	// DCI is a dynamically connected initiator: it sends to one DCT at a
	// time, each send work request naming its target (SendWR.AH, RemoteQPN
	// = the DCT number, DCKey).
	DCI QPType = 0x20
	// DCT is a dynamically connected target: it serves many DCIs at once
	// through its SRQ, identified by its QP number and a 64-bit access key.
	DCT QPType = 0x21
)

// DCInitAttr configures a DCT.
type DCInitAttr struct {
	// Key is the DC access key every connecting DCI must present
	// (dct_access_key).
	Key uint64
	// MaxInitiators bounds the initiators the DCT keeps responder state
	// for at once (default DefaultDCTInitiators). When all are in use, the
	// least recently used one silent for DCTReclaimIdle is reclaimed; if
	// there is none, a new initiator is refused with an RNR NAK and retries.
	MaxInitiators int
}

// DC limits and timers.
const (
	DefaultDCTInitiators = 4096
	MaxDCTInitiators     = 1 << 20
	// DCILinger is how long an idle DCI stays connected before it
	// disconnects: back-to-back work for the same target pays no connect.
	DCILinger = time.Millisecond
	// DCTReclaimIdle is how long an initiator must have been silent before
	// a full DCT may reclaim its state. A DCI disconnects when it goes
	// idle, which frees the state at once; this covers a DISCONNECT that
	// was lost and a DCI that went away. Reclaiming a live initiator would
	// lose the saved READ and atomic results its retries may still need.
	DCTReclaimIdle = time.Second
	// dcDefaultRdAtomic is the responder resources per initiator (an mlx5
	// DCT has no max_dest_rd_atomic attribute).
	dcDefaultRdAtomic = 16
	dcNAKRing         = 64
	dcFreeKeep        = 8 // released initiator states a DCT keeps for reuse
	// dcReqExtra and dcRespExtra are what a DC request and response carry
	// beyond the RC packet of the same operation: DCETH, RDETH and (requests)
	// DETH. A transmit slot needs dcReqExtra bytes more than for RC.
	dcReqExtra  = ib.DCETHSize + ib.RDETHSize + ib.DETHSize
	dcRespExtra = ib.DCETHSize + ib.RDETHSize
)

// ErrBadDCKey reports a DC CONNECT whose key is not the DCT's.
var ErrBadDCKey = errors.New("qp: DC access key mismatch")

// DCStats counts DC events (engine-wide).
type DCStats struct {
	ConnectsSent, ConnectsRcvd       uint64
	DisconnectsSent, DisconnectsRcvd uint64
	TargetSwitches                   uint64 // DCI connections to a target other than the previous one
	BadKey                           uint64 // CONNECTs refused (NAKed), DISCONNECTs and requests dropped for a wrong DC key
	UnknownTarget                    uint64 // DC packets for a QPN that is no DCT/DCI here (CONNECTs NAKed)
	UnknownInitiator                 uint64 // requests from a DCI the DCT holds no state for
	Stale                            uint64 // packets of an older connection (connection number or target mismatch)
	NoResources                      uint64 // CONNECTs refused because every initiator slot was busy (RNR NAKed)
	Reclaimed                        uint64 // initiator state reclaimed by a DCT
	NAKsSent                         uint64 // NAKs sent without initiator state (bad key, unknown DCT, full)
	NAKsDropped                      uint64 // such NAKs dropped because their queue was full
	BadHeader                        uint64 // DC packets without their DC headers (for example parsed without ParseDC)
}

// DC roles of a QP.
const (
	dcInitiator = iota + 1
	dcTarget
	dcContext // one initiator's responder state inside a DCT
	dcOrphan  // the engine's sender of NAKs that have no QP
)

// Control packets a DCI has to send before its next request.
const (
	ctlNone = iota
	ctlConnect
	ctlDisconnect
)

type dcPeer struct {
	av   AddressVector
	dctn uint32
	key  uint64
}

type dcInitKey struct {
	gid ib.GID
	qpn uint32
}

// dcTomb is what a DCT remembers of an initiator whose state it dropped:
// a CONNECT of the same connection number (a retry, or a duplicate still in the
// network) resumes at the old expected PSN, so requests the DCT already
// executed are recognised as duplicates instead of running twice.
type dcTomb struct {
	gen  uint32
	epsn ib.PSN
	msn  uint32
}

// bury records t for k; the oldest tombstones go first once there are as
// many as the DCT has initiator slots.
func (d *dcQP) bury(k dcInitKey, t dcTomb) {
	if _, ok := d.tombs[k]; !ok {
		if len(d.tombRing) < d.maxInit {
			d.tombRing = append(d.tombRing, k)
		} else {
			delete(d.tombs, d.tombRing[d.tombNext])
			d.tombRing[d.tombNext] = k
			d.tombNext = (d.tombNext + 1) % len(d.tombRing)
		}
	}
	d.tombs[k] = t
}

// dcQP is the DC state of a QP.
type dcQP struct {
	role uint8

	// DCI
	connected    bool
	gen          uint32 // connection number (RDETH EEC), 24 bits
	target       dcPeer
	ctl          uint8
	retryConnect bool // a CONNECT went out for the retry under way
	lingerArmed  bool
	lingerAt     time.Duration

	// DCT
	key      uint64
	maxInit  int
	ctxs     map[dcInitKey]*QP
	free     []*QP
	tombs    map[dcInitKey]dcTomb
	tombRing []dcInitKey
	tombNext int
	lastKey  dcInitKey // one-entry cache in front of ctxs: the same
	lastCtx  *QP       // initiator usually sends many packets in a row

	// context
	parent *QP
	ikey   dcInitKey
	last   time.Duration
}

func (d *dcQP) qpType() QPType {
	if d.role == dcInitiator {
		return DCI
	}
	return DCT
}

// tableType is the type whose state table governs Modify.
func (q *QP) tableType() QPType {
	if q.dc != nil {
		return q.dc.qpType()
	}
	return q.typ
}

func (q *QP) isDCI() bool { return q.dc != nil && q.dc.role == dcInitiator }

// resetDC forgets a DCI's connection or a DCT's initiators (the QP went
// back to RESET).
func (q *QP) resetDC() {
	d := q.dc
	d.connected, d.ctl, d.retryConnect, d.lingerArmed = false, ctlNone, false, false
	if d.role == dcTarget {
		for _, c := range d.ctxs {
			q.releaseCtx(c)
		}
	}
}

func (d *dcQP) opAllowed(op WROpcode) bool {
	if d.role != dcInitiator {
		return false
	}
	switch op {
	case WRSend, WRSendWithImm, WRRDMAWrite, WRRDMAWriteWithImm, WRRDMARead, WRAtomicCmpAndSwp, WRAtomicFetchAndAdd:
		return true
	}
	return false
}

func (d *dcQP) hasControl(q *QP) bool {
	switch d.role {
	case dcInitiator:
		return d.ctl != ctlNone
	case dcOrphan:
		return q.e.dc.nakLen > 0
	}
	return false
}

// dcPrepare checks the DC parts of a CreateQP and fills the queue sizes a DC
// QP does not use (a DCI has no receive queue, a DCT no send queue).
func dcPrepare(init *QPInitAttr, c *QPCap) error {
	switch init.Type {
	case DCI:
		if init.SRQ != nil {
			return ErrInvalidArgument
		}
		if c.MaxRecvWR == 0 {
			c.MaxRecvWR = 1
		}
	case DCT:
		// As on mlx5, a DCT receives through an SRQ.
		if init.SRQ == nil {
			return ErrInvalidArgument
		}
		if c.MaxSendWR == 0 {
			c.MaxSendWR = 1
		}
		if init.DC.MaxInitiators < 0 || init.DC.MaxInitiators > MaxDCTInitiators {
			return ErrInvalidArgument
		}
	}
	return nil
}

func (q *QP) initDC(init *QPInitAttr) {
	switch init.Type {
	case DCI:
		q.dc = &dcQP{role: dcInitiator}
	case DCT:
		n := init.DC.MaxInitiators
		if n == 0 {
			n = DefaultDCTInitiators
		}
		q.dc = &dcQP{role: dcTarget, key: init.DC.Key, maxInit: n, ctxs: make(map[dcInitKey]*QP),
			tombs: make(map[dcInitKey]dcTomb)}
		q.attr.MaxDestRdAtomic = dcDefaultRdAtomic
	}
}

// destroyDC drops a DCT's initiator state.
func (q *QP) destroyDC() {
	if q.dc == nil || q.dc.role != dcTarget {
		return
	}
	for _, c := range q.dc.ctxs {
		q.e.readyOf(c).remove(c)
		c.destroyed = true
	}
	clear(q.dc.ctxs)
	clear(q.dc.tombs)
	q.dc.lastCtx = nil
	q.dc.free, q.dc.tombRing = nil, nil
}

// dcMove is one entry of dcStateTable: the attributes a DCI and a DCT need.
type dcMove struct {
	dci, dct *transition
}

func tr(req, opt AttrMask) *transition { return &transition{true, req | AttrState, opt} }

// dcStateTable follows mlx5's DC bring-up (rdma-core mlx5dv_create_qp man
// page, perftest): a DCI goes RESET→INIT→RTR→RTS like an RC QP without a
// remote address; a DCT goes RESET→INIT→RTR and serves in RTR.
var dcStateTable = map[[2]QPState]dcMove{
	{StateReset, StateInit}: {tr(AttrPKeyIndex|AttrPort, 0), tr(AttrPKeyIndex|AttrPort|AttrAccessFlags, 0)},
	{StateInit, StateInit}:  {tr(0, AttrPKeyIndex|AttrPort), tr(0, AttrPKeyIndex|AttrPort|AttrAccessFlags)},
	{StateInit, StateRTR}: {tr(AttrPathMTU, AttrAV|AttrPKeyIndex),
		tr(AttrPathMTU|AttrMinRNRTimer, AttrAV|AttrAccessFlags|AttrPKeyIndex|AttrMaxDestRdAtomic)},
	{StateRTR, StateRTR}: {nil, tr(0, AttrAccessFlags|AttrMinRNRTimer)},
	{StateRTR, StateRTS}: {tr(AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic, AttrCurState), nil},
	{StateRTS, StateRTS}: {tr(0, AttrCurState|AttrTimeout|AttrRetryCnt|AttrRNRRetry), nil},
	{StateRTS, StateSQD}: {tr(0, AttrEnSQDAsyncNotify), nil},
	{StateSQD, StateRTS}: {tr(0, AttrCurState), nil},
	{StateSQD, StateSQD}: {tr(0, AttrCurState|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic), nil},
}

func dcTransitionFor(t QPType, from, to QPState) transition {
	if from > StateErr || to > StateErr {
		return transition{}
	}
	if to == StateReset || to == StateErr {
		return transition{valid: true, req: AttrState}
	}
	m, ok := dcStateTable[[2]QPState{from, to}]
	if !ok {
		return transition{}
	}
	p := m.dci
	if t == DCT {
		p = m.dct
	}
	if p == nil {
		return transition{}
	}
	return *p
}

// dcEngine holds the engine's DC state that belongs to no QP: NAKs for
// CONNECTs that found no DCT, a wrong key or no room, in a bounded ring.
type dcEngine struct {
	orphan  *QP
	naks    [dcNAKRing]dcNAK
	nakHead int
	nakLen  int
}

type dcNAK struct {
	av    AddressVector
	dest  uint32 // the DCI
	src   uint32 // the DCT number asked for
	gen   uint32
	psn   ib.PSN
	syn   ib.Syndrome
	sport uint16
}

// queueNAK answers a CONNECT that created no initiator state.
func (e *Engine) queueNAK(p *ib.Packet, src *Source, syn ib.Syndrome) {
	dci, gen := p.DCCETH.DCI(), p.DCCETH.Conn()
	if e.dc.nakLen == len(e.dc.naks) {
		e.stats.DC.NAKsDropped++
		return
	}
	if e.dc.orphan == nil {
		e.dc.orphan = &QP{e: e, typ: RC, state: StateRTS, mtu: 256, dc: &dcQP{role: dcOrphan}}
	}
	n := &e.dc.naks[(e.dc.nakHead+e.dc.nakLen)%len(e.dc.naks)]
	*n = dcNAK{av: replyAV(src), dest: dci, src: p.BTH.DestQP(), gen: gen, psn: p.BTH.PSN(), syn: syn,
		sport: ib.RXESourcePort(dci ^ p.BTH.DestQP())}
	e.dc.nakLen++
	e.stats.DC.NAKsSent++
	e.schedule(e.dc.orphan)
}

// replyAV is the address vector answering a packet from src.
func replyAV(src *Source) AddressVector {
	if src == nil {
		return AddressVector{HopLimit: 64}
	}
	return AddressVector{DGID: src.SGID, SGID: src.DGID, TrafficClass: src.TrafficClass, HopLimit: 64}
}

// receiveDC dispatches a packet of the DC opcode space.
func (e *Engine) receiveDC(p *ib.Packet, src *Source) error {
	op := p.BTH.Opcode()
	if !dcHeadersPresent(p) {
		e.stats.DC.BadHeader++
		return ErrBadHeader
	}
	if p.BTH.TVer() != 0 {
		return ErrBadHeader
	}
	q := e.lookupQP(p.BTH.DestQP())
	if q == nil || q.dc == nil {
		e.stats.DC.UnknownTarget++
		if op == ib.DCConnect && p.DCCETH.Flags()&ib.DCCDisconnect == 0 {
			e.queueNAK(p, src, ib.NAKSyndrome(ib.NAKInvalidRequest))
		}
		if q == nil {
			return ErrUnknownQP
		}
		return ErrWrongTransport
	}
	if !pkeyMatch(p.BTH.PKey(), defaultPKey) {
		return ErrBadPKey
	}
	if q.dc.role == dcInitiator {
		return q.dciReceive(p, src)
	}
	return q.dctReceive(p, src)
}

// dcHeadersPresent checks the DC headers ParseDC guarantees: DCETH, then
// DCCETH (CONNECT) or RDETH, and DETH on requests.
func dcHeadersPresent(p *ib.Packet) bool {
	if len(p.DCETH) < ib.DCETHSize {
		return false
	}
	if p.BTH.Opcode() == ib.DCConnect {
		return len(p.DCCETH) >= ib.DCCETHSize
	}
	low := uint8(p.BTH.Opcode()) & 0x1F
	if len(p.RDETH) < ib.RDETHSize {
		return false
	}
	return opClass[low]&clResponse != 0 || len(p.DETH) >= ib.DETHSize
}

// dciReceive takes a response for a DCI: it must come from the current
// target and connection; then the RC completer handles it.
func (q *QP) dciReceive(p *ib.Packet, src *Source) error {
	d := q.dc
	low := uint8(p.BTH.Opcode()) & 0x1F
	if p.BTH.Opcode() == ib.DCConnect || opClass[low]&clResponse == 0 {
		return ErrWrongTransport // a DCI takes no requests
	}
	if !q.acceptsResponses() {
		return ErrNotReady
	}
	if !d.connected || p.DCETH.DCTN() != d.target.dctn || p.RDETH.EEC() != d.gen {
		q.e.stats.DC.Stale++
		return ErrDropped
	}
	if !q.fromPeer(src) {
		q.e.stats.BadAddress++
		return ErrBadAddress
	}
	now := q.e.clock.Now()
	err := q.complete(p, now)
	if d.connected && q.sqHead == q.sqTail && q.state == StateRTS {
		d.lingerArmed = true
		d.lingerAt = now + DCILinger
		q.watchTimers(d.lingerAt)
	}
	return err
}

// advanceDC runs a DCI's linger timer: an idle DCI disconnects.
func (q *QP) advanceDC(now time.Duration) {
	d := q.dc
	if !d.lingerArmed || now < d.lingerAt {
		return
	}
	d.lingerArmed = false
	if d.connected && q.sqHead == q.sqTail && d.ctl == ctlNone && q.state == StateRTS {
		d.ctl = ctlDisconnect
		q.e.schedule(q)
	}
}

// dciPlan decides whether a control packet must precede the next request,
// and reports false when the DCI must wait for its outstanding work to
// complete before it may change target.
func (q *QP) dciPlan() bool {
	d := q.dc
	if d.ctl != ctlNone || q.req.rnrWait {
		return true
	}
	if q.req.needRetry && ib.PSNDiff(q.req.maxPSN, q.comp.psn) <= 0 {
		// A retry the last ACK overtook (the timer or a probe fired, then
		// the ACK came before the resend left) has nothing to resend. Left
		// pending, it would take the next request out under the current
		// connection whatever that request needs: after the idle DCI's
		// DISCONNECT, under the old connection number without a CONNECT, to
		// a DCT that dropped this initiator; or to the previous target.
		q.rewind()
	}
	if q.req.needRetry {
		// Resend from the first unacknowledged PSN behind a fresh CONNECT of
		// the same connection number: if the first CONNECT was lost, or the DCT
		// reclaimed this initiator, the retry recreates the state (a DCT
		// ignores a CONNECT of the connection it already has).
		if d.connected && !d.retryConnect {
			d.retryConnect = true
			d.ctl = ctlConnect
		}
		return true
	}
	d.retryConnect = false
	if q.req.idx == q.sqTail {
		return true
	}
	w := q.wqe(q.req.idx)
	if w.started || q.state == StateSQD {
		return true // SQD starts no new work request, so no new connection
	}
	t := dcPeer{av: w.av, dctn: w.remoteQPN, key: w.dcKey}
	if d.connected && t == d.target {
		return true
	}
	if d.connected {
		if q.sqHead != q.req.idx {
			return false // one target at a time: drain first
		}
		d.ctl = ctlDisconnect
		return true
	}
	if t != d.target {
		q.e.stats.DC.TargetSwitches++
	}
	d.target = t
	d.gen = (d.gen + 1) & ib.PSNMask
	d.connected = true
	d.ctl = ctlConnect
	d.lingerArmed = false
	q.attr.AV = t.av
	q.attr.DestQPN = t.dctn
	return true
}

// produceDC builds the next packet of a DC QP: a DCI's CONNECT or
// DISCONNECT, or any RC packet of the QP turned into its DC form.
func (q *QP) produceDC(now time.Duration, t *TxPacket) int {
	d := q.dc
	switch d.role {
	case dcOrphan:
		return q.e.produceNAK(t)
	case dcInitiator:
		if q.state != StateRTS && q.state != StateSQD {
			return idle
		}
		if !q.dciPlan() {
			return idle
		}
		if d.ctl != ctlNone {
			return q.produceConnect(t)
		}
	case dcContext:
		if !d.parent.acceptsRequests() {
			return idle
		}
	}
	// Build the RC packet further in, then move the BTH forward and put
	// the DC headers between it and the RC extension headers. A DCI only
	// sends requests and an initiator's state at a DCT only responses, so
	// the room to leave is known before the packet is built.
	extra := dcRespExtra
	if d.role == dcInitiator {
		extra = dcReqExtra
	}
	inner := *t
	inner.Headroom += extra
	r := q.produceBody(now, &inner)
	if r != produced {
		return r
	}
	b := t.Buf[t.Headroom:]
	copy(b[:ib.BTHSize], b[extra:extra+ib.BTHSize])
	b[0] |= byte(ib.TransportDC)
	h := b[ib.BTHSize:]
	if d.role == dcInitiator {
		ib.DCETH(h).Encode(&ib.DCETHFields{Key: d.target.key})
		ib.RDETH(h[ib.DCETHSize:]).Encode(&ib.RDETHFields{EEC: d.gen})
		ib.DETH(h[ib.DCETHSize+ib.RDETHSize:]).Encode(&ib.DETHFields{SrcQP: q.qpn})
	} else {
		ib.DCETH(h).Encode(&ib.DCETHFields{DCTN: q.qpn})
		ib.RDETH(h[ib.DCETHSize:]).Encode(&ib.RDETHFields{EEC: d.gen})
	}
	t.Len = inner.Len + extra
	t.AV, t.SrcQPN = inner.AV, inner.SrcQPN
	return produced
}

const dcConnectLen = ib.BTHSize + ib.DCETHSize + ib.DCCETHSize

// produceConnect sends the DCI's pending CONNECT or DISCONNECT.
func (q *QP) produceConnect(t *TxPacket) int {
	d := q.dc
	if t.Headroom < 0 || len(t.Buf)-t.Headroom < dcConnectLen+ib.ICRCSize {
		q.e.stats.ShortTxBuffer++
		return shortBuffer
	}
	b := t.Buf[t.Headroom:]
	flags := uint8(0)
	psn := q.req.psn
	if q.req.needRetry {
		psn = q.comp.psn // where the rewind resends from
	}
	if d.ctl == ctlDisconnect {
		flags = ib.DCCDisconnect
		q.e.stats.DC.DisconnectsSent++
	} else {
		q.e.stats.DC.ConnectsSent++
	}
	writeBTH(b, uint8(ib.DCConnect), false, false, 0, d.target.dctn, psn)
	ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{Key: d.target.key})
	ib.DCCETH(b[ib.BTHSize+ib.DCETHSize:]).Encode(&ib.DCCETHFields{Flags: flags, DCI: q.qpn, Conn: d.gen})
	t.Len = finish(b, dcConnectLen, 0)
	q.fillAV(t, &d.target.av)
	if d.ctl == ctlDisconnect {
		d.connected = false
	}
	d.ctl = ctlNone
	return produced
}

// produceNAK sends the oldest queued NAK without initiator state.
func (e *Engine) produceNAK(t *TxPacket) int {
	if e.dc.nakLen == 0 {
		return idle
	}
	const n = ib.BTHSize + dcRespExtra + ib.AETHSize
	if t.Headroom < 0 || len(t.Buf)-t.Headroom < n+ib.ICRCSize {
		e.stats.ShortTxBuffer++
		return shortBuffer
	}
	k := &e.dc.naks[e.dc.nakHead]
	b := t.Buf[t.Headroom:]
	writeBTH(b, uint8(ib.DCAck), false, false, 0, k.dest, k.psn)
	ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{DCTN: k.src})
	ib.RDETH(b[ib.BTHSize+ib.DCETHSize:]).Encode(&ib.RDETHFields{EEC: k.gen})
	ib.AETH(b[ib.BTHSize+dcRespExtra:]).Encode(&ib.AETHFields{Syndrome: k.syn})
	t.Len = finish(b, n, 0)
	t.AV = k.av
	t.AV.SrcPort = k.sport
	t.SrcQPN = k.src
	e.dc.nakHead = (e.dc.nakHead + 1) % len(e.dc.naks)
	e.dc.nakLen--
	return produced
}

// dctReceive handles a request or CONNECT for a DCT.
func (q *QP) dctReceive(p *ib.Packet, src *Source) error {
	d := q.dc
	if d.role != dcTarget {
		return ErrWrongTransport
	}
	if !q.acceptsRequests() {
		return ErrNotReady
	}
	op := p.BTH.Opcode()
	var k dcInitKey
	var gen uint32
	if op == ib.DCConnect {
		k.qpn, gen = p.DCCETH.DCI(), p.DCCETH.Conn()
	} else {
		if opClass[uint8(op)&0x1F]&clResponse != 0 {
			return ErrWrongTransport
		}
		k.qpn, gen = p.DETH.SrcQP(), p.RDETH.EEC()
	}
	if src != nil {
		k.gid = src.SGID
	}
	now := q.e.clock.Now()
	c := d.lastCtx
	if c == nil || d.lastKey != k {
		c = d.ctxs[k]
		d.lastKey, d.lastCtx = k, c
	}
	if op == ib.DCConnect {
		// The key first, for a DISCONNECT too: it names its DCI and
		// connection number in the clear, so without the key anyone could
		// end another initiator's connection and have its requests dropped.
		disconnect := p.DCCETH.Flags()&ib.DCCDisconnect != 0
		if disconnect {
			q.e.stats.DC.DisconnectsRcvd++
		} else {
			q.e.stats.DC.ConnectsRcvd++
		}
		if p.DCETH.Key() != d.key {
			q.e.stats.DC.BadKey++
			if !disconnect { // a DISCONNECT expects no answer: dropped
				q.e.queueNAK(p, src, ib.NAKSyndrome(ib.NAKRemoteAccessError))
			}
			return ErrBadDCKey
		}
		if disconnect {
			if c != nil && c.dc.gen == gen && c.resp.outLen == 0 && !c.resp.haveRecv {
				q.releaseCtx(c)
			}
			return nil
		}
		if c != nil && c.dc.gen == gen && c.state == StateRTS {
			c.dc.last = now
			return nil // a repeated CONNECT: keep the state
		}
		if c == nil {
			if c = q.acquireCtx(now); c == nil {
				q.e.stats.DC.NoResources++
				q.e.queueNAK(p, src, ib.RNRNAKSyndrome(ib.RNRTimer(q.attr.MinRNRTimer)))
				return ErrNoResources
			}
			d.ctxs[k] = c
			d.lastKey, d.lastCtx = k, c
		}
		psn, msn := p.BTH.PSN(), uint32(0)
		if tb, ok := d.tombs[k]; ok {
			delete(d.tombs, k)
			if tb.gen == gen && ib.PSNDiff(tb.epsn, psn) > 0 {
				psn, msn = tb.epsn, tb.msn
			}
		}
		q.startCtx(c, k, gen, psn, msn, src, now)
		return nil
	}
	if c == nil {
		q.e.stats.DC.UnknownInitiator++
		return ErrDropped
	}
	if p.DCETH.Key() != d.key {
		q.e.stats.DC.BadKey++
		return ErrBadDCKey
	}
	if c.dc.gen != gen {
		q.e.stats.DC.Stale++
		return ErrDropped
	}
	if c.state != StateRTS {
		return ErrNotReady
	}
	c.dc.last = now
	return c.respond(p)
}

// acquireCtx finds room for one more initiator: a free slot, or the least
// recently used idle initiator's.
func (q *QP) acquireCtx(now time.Duration) *QP {
	d := q.dc
	if len(d.ctxs) < d.maxInit {
		if n := len(d.free); n > 0 {
			c := d.free[n-1]
			d.free[n-1] = nil
			d.free = d.free[:n-1]
			return c
		}
		return q.newCtx()
	}
	var lru *QP
	for _, c := range d.ctxs {
		if now-c.dc.last < DCTReclaimIdle {
			continue
		}
		if lru == nil || c.dc.last < lru.dc.last {
			lru = c
		}
	}
	if lru == nil {
		return nil
	}
	q.e.stats.DC.Reclaimed++
	q.releaseCtx(lru)
	if n := len(d.free) - 1; n >= 0 {
		c := d.free[n]
		d.free[n] = nil
		d.free = d.free[:n]
		return c
	}
	return q.newCtx()
}

func (q *QP) newCtx() *QP {
	return &QP{e: q.e, pd: q.pd, typ: RC, qpn: q.qpn, sendCQ: q.sendCQ, recvCQ: q.recvCQ, srq: q.srq,
		cap: q.cap, dc: &dcQP{role: dcContext, parent: q}}
}

// releaseCtx forgets one initiator. A receive WQE held by an unfinished
// message completes with a flush error rather than vanishing.
func (q *QP) releaseCtx(c *QP) {
	d := q.dc
	delete(d.ctxs, c.dc.ikey)
	if d.lastCtx == c {
		d.lastCtx = nil
	}
	d.bury(c.dc.ikey, dcTomb{gen: c.dc.gen, epsn: c.resp.epsn, msn: c.resp.msn})
	q.e.readyOf(c).remove(c)
	if c.resp.haveRecv {
		c.postRecvWC(&c.resp.cur, WCWRFlushErr, 0)
		c.resp.haveRecv = false
	}
	c.state = StateReset
	// Keep a few for the next initiators; the rest go, so that a burst of
	// initiators leaves no lasting memory behind.
	if len(d.free) < dcFreeKeep {
		d.free = append(d.free, c)
	}
}

// startCtx (re)starts an initiator's responder state at the CONNECT's PSN.
func (q *QP) startCtx(c *QP, k dcInitKey, gen uint32, psn ib.PSN, msn uint32, src *Source, now time.Duration) {
	if c.resp.haveRecv {
		c.postRecvWC(&c.resp.cur, WCWRFlushErr, 0)
	}
	q.e.readyOf(c).remove(c)
	c.dc.ikey, c.dc.gen, c.dc.last = k, gen, now
	c.attr = q.attr
	c.attr.AV = replyAV(src)
	c.attr.DestQPN = k.qpn
	c.attr.RQPSN = uint32(psn)
	c.mtu = q.mtu
	c.sport = ib.RXESourcePort(k.qpn ^ q.qpn)
	c.state = StateRTS
	c.resp.reset(psn)
	c.resp.msn = msn
	c.resp.initResources(int(q.attr.MaxDestRdAtomic))
}

// DCTInitiators returns how many initiators a DCT holds state for.
func (q *QP) DCTInitiators() int {
	if q.dc == nil || q.dc.role != dcTarget {
		return 0
	}
	return len(q.dc.ctxs)
}
