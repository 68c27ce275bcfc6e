package qp

import (
	"time"

	"github.com/goroce/goroce/ib"
)

// CCConfig turns on congestion control in an Engine. Its zero value is
// off, and an engine with it off sends exactly what it sent without it.
type CCConfig struct {
	// DCQCN turns on the three parts of DCQCN for RC and UC QPs: every
	// packet but a CNP leaves with ECT(0) in the ECN field of its traffic
	// class; a QP that receives a packet marked CE sends its peer a CNP
	// (notification point, at most one per MinTimeBetweenCNPs); a QP that
	// receives a CNP cuts its send rate, which the engine enforces by
	// pacing its requests and its READ responses (reaction point, DCQCN in
	// dcqcn.go); ACKs and CNPs are not paced. UD and DC QPs are neither
	// marked nor paced.
	DCQCN bool
	// Params are DCQCN's settings; zero fields take the defaults.
	Params DCQCNParams
}

// CCStats counts congestion control events, under mlx5's counter names.
type CCStats struct {
	NPECNMarked   uint64 // np_ecn_marked_roce_packets: CE-marked packets received
	NPCNPSent     uint64 // np_cnp_sent: CNPs sent
	RPCNPHandled  uint64 // rp_cnp_handled: CNPs that cut a QP's rate
	RPCNPIgnored  uint64 // rp_cnp_ignored: CNPs within the rate reduce monitor period, or with DCQCN off
	RPPacedWaits  uint64 // times a QP's request waited for its rate
	NPCNPCoalesce uint64 // CE marks that found a CNP sent within MinTimeBetweenCNPs
}

// ECN field values (RFC 3168) in the low two bits of the traffic class.
const (
	ecnMask = 3
	ecnECT0 = 2
	ecnCE   = 3
)

// ccEngine is the engine's congestion control state.
type ccEngine struct {
	on     bool
	params DCQCNParams
	stats  CCStats
}

func (c *ccEngine) init(cfg CCConfig) error {
	if !cfg.DCQCN {
		return nil
	}
	c.on = true
	c.params = cfg.Params
	c.params.fill()
	if !c.params.valid() {
		return ErrInvalidArgument
	}
	return nil
}

// ccQP is one QP's congestion control state.
type ccQP struct {
	rp   DCQCN
	pace pacer

	cnpPending bool
	cnpSent    bool          // a CNP left, the last at cnpAt
	cnpAt      time.Duration // when the last CNP was queued
	paceArmed  bool
	paceAt     time.Duration
}

// CCRate returns the QP's DCQCN rate in bits per second and whether it is
// limited below MaxRate; with congestion control off it is (0, false).
func (q *QP) CCRate() (int64, bool) {
	if !q.e.cc.on {
		return 0, false
	}
	if q.cc == nil || q.cc.rp.p == nil {
		return q.e.cc.params.MaxRate, false // never limited
	}
	q.cc.rp.Advance(q.e.clock.Now())
	return q.cc.rp.Rate(), q.cc.rp.Limited()
}

// CCStats returns the congestion control counters.
func (e *Engine) CCStats() CCStats { return e.cc.stats }

// CCMinRate returns the lowest rate of a rate-limited QP, or 0 when no QP
// is limited (or congestion control is off).
func (e *Engine) CCMinRate() int64 {
	if !e.cc.on {
		return 0
	}
	var lo int64
	for _, q := range e.qpList {
		if r, lim := q.CCRate(); lim && (lo == 0 || r < lo) {
			lo = r
		}
	}
	return lo
}

// ccInit makes the QP's congestion control state when it is first used:
// a QP of an engine without congestion control carries a nil pointer.
func (q *QP) ccInit() {
	if q.cc == nil {
		q.cc = new(ccQP)
	}
	if q.cc.rp.p == nil {
		q.cc.rp.init(&q.e.cc.params)
	}
}

func (q *QP) ccApplies() bool {
	return q.e.cc.on && (q.typ == RC || q.typ == UC) && q.dc == nil
}

// noteCE is the notification point: src's packet reached q. A CE mark
// queues a CNP to q's peer unless one was sent within MinTimeBetweenCNPs.
func (q *QP) noteCE(src *Source) {
	if src == nil || src.TrafficClass&ecnMask != ecnCE || !q.ccApplies() {
		return
	}
	e := q.e
	e.cc.stats.NPECNMarked++
	q.ccInit()
	now := e.clock.Now()
	if q.cc.cnpPending || q.cc.cnpSent && now-q.cc.cnpAt < e.cc.params.MinTimeBetweenCNPs {
		e.cc.stats.NPCNPCoalesce++
		return
	}
	q.cc.cnpPending, q.cc.cnpSent, q.cc.cnpAt = true, true, now
	e.schedule(q)
}

// receiveCNP is the reaction point's input: a CNP for the QP it names.
func (e *Engine) receiveCNP(p *ib.Packet, src *Source) error {
	q := e.lookupQP(p.BTH.DestQP())
	if q == nil {
		return ErrUnknownQP
	}
	if q.dc != nil {
		// A DC QP takes no part in congestion control: the CNP is taken
		// and ignored, as it is with congestion control off.
		e.cc.stats.RPCNPIgnored++
		return nil
	}
	if !q.fromPeer(src) {
		e.stats.BadAddress++
		return ErrBadAddress
	}
	if !q.ccApplies() {
		e.cc.stats.RPCNPIgnored++
		return nil
	}
	q.ccInit()
	if q.cc.rp.OnCNP(e.clock.Now()) {
		e.cc.stats.RPCNPHandled++
	} else {
		e.cc.stats.RPCNPIgnored++
	}
	return nil
}

// cnpLen is a CNP's length: BTH, 16 reserved bytes, ICRC.
const cnpLen = ib.BTHSize + ib.CNPReservedSize + ib.ICRCSize

// produceCNP writes a pending CNP into t. CNPs are not paced and leave
// ahead of anything else of the QP, without ECT. The format is RoCEv2's
// (Annex A17): BTH opcode 0x81 to the peer QP with BECN set, 16 reserved
// zero bytes, ICRC. P_Key and PSN are not specified; public captures of
// mlx5 CNPs show the default P_Key 0xFFFF and PSN 0, which this sends. The
// traffic class is DCQCNParams.CNPDSCP (mlx5's cnp_dscp, 48 by default)
// with ECN Not-ECT, or with NoCNPDSCP the QP's with the ECN bits cleared.
func (q *QP) produceCNP(t *TxPacket) bool {
	if q.cc == nil || !q.cc.cnpPending || t.Headroom < 0 || len(t.Buf)-t.Headroom < cnpLen {
		return false
	}
	q.cc.cnpPending = false
	b := t.Buf[t.Headroom:]
	ib.BTH(b[:ib.BTHSize]).Encode(&ib.BTHFields{
		Opcode: ib.CNP,
		PKey:   defaultPKey,
		BECN:   true,
		DestQP: q.attr.DestQPN,
	})
	clear(b[ib.BTHSize:cnpLen])
	t.Len = cnpLen
	q.fillAV(t, &q.attr.AV)
	if d := q.e.cc.params.CNPDSCP; d != NoCNPDSCP {
		t.AV.TrafficClass = uint8(d) << 2
	} else {
		t.AV.TrafficClass &^= ecnMask
	}
	q.e.cc.stats.NPCNPSent++
	return true
}

// markECT sets ECT(0) on a packet a QP under congestion control produced.
func markECT(t *TxPacket) {
	t.AV.TrafficClass = t.AV.TrafficClass&^ecnMask | ecnECT0
}

// paceOK reports whether the QP's rate lets a request leave at now; if
// not, it arms the pacing timer for when it will.
func (q *QP) paceOK(now time.Duration) bool {
	q.ccInit()
	rp := &q.cc.rp
	// Advance only runs timers of a limited rate and never limits it, so
	// an unlimited QP (no CNP yet, or recovered) skips the call.
	if rp.Limited() {
		rp.Advance(now)
	}
	if !rp.Limited() {
		q.cc.pace.reset(now)
		return true
	}
	ok, at := q.cc.pace.ready(now, rp.Rate(), q.mtu)
	if ok {
		return true
	}
	q.e.cc.stats.RPPacedWaits++
	if !q.cc.paceArmed || at < q.cc.paceAt {
		q.cc.paceArmed, q.cc.paceAt = true, at
		q.watchTimers(at)
	}
	return false
}

// paceCharge takes a request of n bytes sent at now from the QP's rate.
func (q *QP) paceCharge(now time.Duration, n int) {
	q.ccInit()
	if !q.cc.rp.Limited() {
		return // OnSend counts nothing at the full rate
	}
	q.cc.rp.OnSend(now, n)
	if q.cc.rp.Limited() {
		q.cc.pace.charge(n)
	}
}

// ccHoldsResponse reports that a READ response stream at the head of the
// responder's queue must wait for the QP's rate: READ responses are the
// responder's data, and a CNP for them (the requester saw them marked)
// names this QP. Single-packet responses (ACKs, atomic ACKs) are not held.
func (q *QP) ccHoldsResponse(now time.Duration) bool {
	return q.ccApplies() && q.resp.outLen > 0 && !q.resp.singleAtHead() && !q.paceOK(now)
}

// ccChargeResponse takes a READ response of n bytes in buf from the QP's
// rate.
func (q *QP) ccChargeResponse(now time.Duration, buf []byte, n int) {
	if !q.ccApplies() {
		return
	}
	switch buf[0] & 0x1F {
	case opReadRespFirst, opReadRespMiddle, opReadRespLast, opReadRespOnly:
		q.paceCharge(now, n)
	}
}

// ccDeadline folds the pacing timer into a QP's earliest deadline.
func (q *QP) ccDeadline(d time.Duration, ok bool) (time.Duration, bool) {
	if q.cc != nil && q.cc.paceArmed && (!ok || q.cc.paceAt < d) {
		return q.cc.paceAt, true
	}
	return d, ok
}

// ccAdvance runs the pacing timer: the QP may send again.
func (q *QP) ccAdvance(now time.Duration) {
	if q.cc != nil && q.cc.paceArmed && now >= q.cc.paceAt {
		q.cc.paceArmed = false
		q.e.schedule(q)
	}
}
