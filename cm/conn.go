package cm

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// ConnectParams describes the REQ of an active connection (rdma_connect).
type ConnectParams struct {
	ServiceID uint64
	Path      Path
	Transport mad.TransportType // RC (default) or UC
	QPN       uint32
	// StartingPSN is the first PSN our QP expects to receive (24 bits; pick
	// it at random). Linux reads a CM Starting PSN as the PSN the *other*
	// side sends with: the peer's sq_psn is our REQ's Starting PSN and ours
	// is its REP's (cm.c: ib_send_cm_req sets rq_psn from the REQ,
	// cm_rep_handler sq_psn from the REP), as captures of rxe confirm.
	StartingPSN uint32
	// ResponderResources and InitiatorDepth are our offer (rdma_cm: device
	// maximum 128 when unspecified).
	ResponderResources, InitiatorDepth uint8
	RetryCount, RNRRetryCount          uint8 // ≤ 7; RNR retry is for the passive QP
	PathMTU                            ib.MTU
	PacketLifeTime                     uint8 // 0: DefaultPacketLifeTime
	CMResponseTimeout                  uint8 // remote and local; 0: DefaultCMResponseTimeout
	MaxCMRetries                       uint8 // 0: DefaultMaxCMRetries
	PacketRate, SL                     uint8
	SRQ, FlowControl                   bool
	PrivateData                        []byte // ≤ 92 bytes, including any cma_hdr
}

// AcceptParams describes the REP of a passive connection (rdma_accept).
type AcceptParams struct {
	QPN uint32
	// StartingPSN is the first PSN our QP expects to receive; the peer
	// sends from it (see ConnectParams.StartingPSN).
	StartingPSN                        uint32
	ResponderResources, InitiatorDepth uint8 // ours; at most the REQ's initiator depth / responder resources
	RNRRetryCount                      uint8 // for the active QP
	SRQ, FlowControl                   bool
	PrivateData                        []byte // ≤ 196 bytes
	// REPLifetime, when not zero, bounds how long the REP is retransmitted
	// waiting for the RTU, whatever response timeout and retries the REQ
	// asked for: the interval is at most a quarter of it, and the retries
	// stop within it (EventTimeout). A half-open connection then lasts
	// that long at most.
	REPLifetime time.Duration
}

// SIDRParams describes a SIDR_REQ (rdma_cm UDP port space resolution).
type SIDRParams struct {
	ServiceID    uint64
	Path         Path
	PKey         uint16        // 0: 0xFFFF
	Timeout      time.Duration // per attempt; 0: 4096 ms as rdma_cm
	MaxCMRetries uint8         // 0: 15
	PrivateData  []byte        // ≤ 216 bytes, including any cma_hdr
}

func checkPath(p Path) error {
	if !p.Local.IsValid() || !p.Remote.IsValid() {
		return fmt.Errorf("%w: path needs local and remote addresses", ErrInvalid)
	}
	return nil
}

func checkPD(pd []byte, a mad.AttrID) error {
	if len(pd) > mad.PrivateDataSize(a) {
		return fmt.Errorf("%w: %d bytes of private data, %v holds %d", ErrInvalid, len(pd), a, mad.PrivateDataSize(a))
	}
	return nil
}

// Connect starts an active connection: it sends a REQ and returns the new
// communication ID. EventReply, EventRejected or EventTimeout follow.
func (e *Engine) Connect(p *ConnectParams) (uint32, error) {
	switch {
	case checkPath(p.Path) != nil:
		return 0, checkPath(p.Path)
	case checkPD(p.PrivateData, mad.AttrREQ) != nil:
		return 0, checkPD(p.PrivateData, mad.AttrREQ)
	case p.QPN == 0 || p.QPN > 0xFFFFFF || p.StartingPSN > ib.PSNMask:
		return 0, fmt.Errorf("%w: QPN %#x / PSN %#x", ErrInvalid, p.QPN, p.StartingPSN)
	case p.PathMTU < ib.MTU256 || p.PathMTU > ib.MTU4096:
		return 0, fmt.Errorf("%w: path MTU code %d", ErrInvalid, p.PathMTU)
	case p.RetryCount > 7 || p.RNRRetryCount > 7:
		return 0, fmt.Errorf("%w: retry counts are 3 bits", ErrInvalid)
	case p.Transport != mad.TransportRC && p.Transport != mad.TransportUC:
		return 0, fmt.Errorf("%w: transport %d", ErrInvalid, p.Transport)
	}
	plt := orDefault(p.PacketLifeTime, DefaultPacketLifeTime)
	rto := orDefault(p.CMResponseTimeout, DefaultCMResponseTimeout)
	retries := orDefault(p.MaxCMRetries, DefaultMaxCMRetries)
	if plt > 30 || rto > 31 || retries > 15 {
		return 0, fmt.Errorf("%w: timeout exponent or retry count out of range", ErrInvalid)
	}
	hop := orDefault(p.Path.HopLimit, e.cfg.HopLimit)
	p.Path.HopLimit = hop
	c := &conn{
		id: e.newID(), state: StateREQSent, active: true, serviceID: p.ServiceID, path: p.Path,
		transport: p.Transport, localQPN: p.QPN, localPSN: p.StartingPSN,
		respRes: p.ResponderResources, initDepth: p.InitiatorDepth, pathMTU: p.PathMTU,
		retryCount: p.RetryCount, ackTimeout: plt + 1, localCMTimeout: rto,
		maxCMRetries: retries, flowControl: p.FlowControl, srq: p.SRQ, pkey: DefaultPKey,
	}
	c.plt = plt
	c.tid = e.formTID(c.id)
	c.timeout = 2*ConvertToDuration(plt) + ConvertToDuration(rto)
	lid := uint16(0xFFFF) // permissive LIDs on RoCE unless the peer is on-link (hop limit ≤ 1)
	if hop <= 1 {
		lid = 0
	}
	req := mad.REQFields{
		LocalCommID: c.id, ServiceID: p.ServiceID, LocalCAGUID: e.cfg.LocalCAGUID,
		LocalQPN: p.QPN, ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RemoteCMResponseTimeout: rto, Transport: p.Transport, FlowControl: p.FlowControl,
		StartingPSN: p.StartingPSN, LocalCMResponseTimeout: rto, RetryCount: p.RetryCount,
		PKey: DefaultPKey, PathMTU: p.PathMTU, RNRRetryCount: p.RNRRetryCount, MaxCMRetries: retries,
		SRQ: p.SRQ,
		Primary: mad.PathFields{LocalLID: lid, RemoteLID: lid,
			LocalGID: ib.GIDFromAddr(p.Path.Local), RemoteGID: ib.GIDFromAddr(p.Path.Remote),
			FlowLabel: p.Path.FlowLabel, PacketRate: p.PacketRate, TrafficClass: p.Path.TrafficClass,
			HopLimit: hop, SL: p.SL, SubnetLocal: hop <= 1,
			LocalACKTimeout: ACKTimeout(e.cfg.CAACKDelay, plt)},
		PrivateData: p.PrivateData,
	}
	e.conns[c.id] = c
	e.send(c, mad.AttrREQ, c.tid, c.timeout, retries, func(m mad.MAD) { m.REQ().Encode(&req) })
	return c.id, nil
}

func orDefault(v, d uint8) uint8 {
	if v == 0 {
		return d
	}
	return v
}

// RTU completes an active connection after EventReply (the caller has moved
// its QP to RTS): it sends the RTU and the ID becomes ESTABLISHED.
func (e *Engine) RTU(id uint32, pd []byte) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	if err := checkPD(pd, mad.AttrRTU); err != nil {
		return err
	}
	if c.state != StateREPRcvd {
		return fmt.Errorf("%w: RTU in %v", ErrState, c.state)
	}
	e.reply(c, mad.AttrRTU, c.tid, func(m mad.MAD) {
		m.RTU().Encode(&mad.RTUFields{LocalCommID: c.id, RemoteCommID: c.remoteID, PrivateData: pd})
	})
	c.state = StateEstablished
	return nil
}

// Accept answers EventRequest with a REP. EventEstablished (on the RTU),
// EventRejected or EventTimeout follow.
func (e *Engine) Accept(id uint32, p *AcceptParams) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	if err := checkPD(p.PrivateData, mad.AttrREP); err != nil {
		return err
	}
	if c.state != StateREQRcvd && c.state != StateMRAREQSent {
		return fmt.Errorf("%w: accept in %v", ErrState, c.state)
	}
	if p.QPN == 0 || p.QPN > 0xFFFFFF || p.StartingPSN > ib.PSNMask || p.RNRRetryCount > 7 {
		return fmt.Errorf("%w: QPN %#x / PSN %#x / RNR retry %d", ErrInvalid, p.QPN, p.StartingPSN, p.RNRRetryCount)
	}
	c.localQPN, c.localPSN = p.QPN, p.StartingPSN
	c.respRes, c.initDepth = p.ResponderResources, p.InitiatorDepth
	c.srq = p.SRQ
	rep := mad.REPFields{
		LocalCommID: c.id, RemoteCommID: c.remoteID, LocalQPN: p.QPN, StartingPSN: p.StartingPSN,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		TargetACKDelay: e.cfg.CAACKDelay, FlowControl: p.FlowControl, RNRRetryCount: p.RNRRetryCount,
		SRQ: p.SRQ, LocalCAGUID: e.cfg.LocalCAGUID, PrivateData: p.PrivateData,
	}
	c.state = StateREPSent
	interval, retries := c.timeout, c.maxCMRetries
	if p.REPLifetime > 0 {
		c.repCap = p.REPLifetime
		interval = max(min(interval, p.REPLifetime/4), time.Millisecond)
		retries = uint8(min(int64(retries), max(int64(p.REPLifetime/interval)-1, 0)))
	}
	e.send(c, mad.AttrREP, c.tid, interval, retries, func(m mad.MAD) { m.REP().Encode(&rep) })
	return nil
}

// Reject refuses a connection in progress with a REJ: a received request
// (REQ_RCVD), a received reply (REP_RCVD), or our own pending REQ or REP.
// The ID is released.
func (e *Engine) Reject(id uint32, reason mad.RejectReason, ari, pd []byte) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	if err := checkPD(pd, mad.AttrREJ); err != nil {
		return err
	}
	if len(ari) > mad.ARISize {
		return fmt.Errorf("%w: %d bytes of ARI", ErrInvalid, len(ari))
	}
	var msg mad.MsgType
	switch c.state {
	case StateREQRcvd, StateMRAREQSent:
		msg = mad.MsgREQ
	case StateREPRcvd:
		msg = mad.MsgREP
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd:
		msg = mad.MsgOther
	default:
		return fmt.Errorf("%w: reject in %v", ErrState, c.state)
	}
	if c.state == StateREPSent {
		// ib_send_cm_rej cancels a REP that is still waiting to be sent
		// (an accept whose QP could not be moved to RTR): the peer then
		// sees only the REJ.
		e.withdrawREP(c.tid, c.id)
	}
	e.queue(c.path, mad.AttrREJ, c.tid, func(m mad.MAD) {
		m.REJ().Encode(&mad.REJFields{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageRejected: msg,
			ARILength: uint8(len(ari)), Reason: reason, ARI: ari, PrivateData: pd})
	})
	if c.state == StateREPSent || c.state == StateMRAREPRcvd {
		e.enterTimewait(c)
		return nil
	}
	e.remove(c)
	return nil
}

// Disconnect sends a DREQ on an established connection. EventDisconnectDone
// follows (on the DREP or after the retries).
func (e *Engine) Disconnect(id uint32, pd []byte) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	if err := checkPD(pd, mad.AttrDREQ); err != nil {
		return err
	}
	if c.state != StateEstablished {
		return fmt.Errorf("%w: disconnect in %v", ErrState, c.state)
	}
	c.state = StateDREQSent
	c.dreqTID = e.formTID(c.id)
	e.send(c, mad.AttrDREQ, c.dreqTID, c.timeout, c.maxCMRetries, func(m mad.MAD) {
		m.DREQ().Encode(&mad.DREQFields{LocalCommID: c.id, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN, PrivateData: pd})
	})
	return nil
}

// Destroy releases id the way cm_destroy_id does: a pending REQ is
// cancelled with REJ TIMEOUT (ARI: our GUID), a request or reply not yet
// answered is rejected with CONSUMER_DEFINED, an established connection is
// disconnected (and released after timewait), and an ID in DREQ_SENT or
// timewait finishes on its own.
func (e *Engine) Destroy(id uint32) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		var guid [8]byte
		binary.BigEndian.PutUint64(guid[:], e.cfg.LocalCAGUID)
		return e.Reject(id, mad.RejTimeout, guid[:], nil)
	case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateREPSent, StateMRAREPRcvd:
		return e.Reject(id, mad.RejConsumerDefined, nil, nil)
	case StateEstablished:
		return e.Disconnect(id, nil)
	case StateSIDRREQSent, StateSIDRREQRcvd:
		if c.state == StateSIDRREQRcvd {
			return e.SIDRReply(id, mad.SIDRReject, 0, 0, nil)
		}
		e.remove(c)
	}
	return nil
}

// SIDRRequest sends a SIDR_REQ; EventSIDRReply follows. The request ID is
// the returned ID.
func (e *Engine) SIDRRequest(p *SIDRParams) (uint32, error) {
	if err := checkPath(p.Path); err != nil {
		return 0, err
	}
	if err := checkPD(p.PrivateData, mad.AttrSIDRREQ); err != nil {
		return 0, err
	}
	p.Path.HopLimit = orDefault(p.Path.HopLimit, e.cfg.HopLimit)
	c := &conn{id: e.newID(), state: StateSIDRREQSent, active: true, serviceID: p.ServiceID, path: p.Path,
		pkey: p.PKey}
	if c.pkey == 0 {
		c.pkey = DefaultPKey
	}
	c.tid = e.formTID(c.id)
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = ConvertToDuration(DefaultCMResponseTimeout)
	}
	retries := orDefault(p.MaxCMRetries, DefaultMaxCMRetries)
	e.conns[c.id] = c
	e.send(c, mad.AttrSIDRREQ, c.tid, timeout, retries, func(m mad.MAD) {
		m.SIDRREQ().Encode(&mad.SIDRREQFields{RequestID: c.id, PKey: c.pkey, ServiceID: p.ServiceID, PrivateData: p.PrivateData})
	})
	return c.id, nil
}

// SIDRReply answers EventSIDRRequest and releases the ID.
func (e *Engine) SIDRReply(id uint32, status mad.SIDRStatus, qpn, qkey uint32, pd []byte) error {
	c, err := e.get(id)
	if err != nil {
		return err
	}
	if err := checkPD(pd, mad.AttrSIDRREP); err != nil {
		return err
	}
	if c.state != StateSIDRREQRcvd {
		return fmt.Errorf("%w: SIDR reply in %v", ErrState, c.state)
	}
	e.queue(c.path, mad.AttrSIDRREP, c.tid, func(m mad.MAD) {
		m.SIDRREP().Encode(&mad.SIDRREPFields{RequestID: c.remoteID, Status: status, QPN: qpn,
			ServiceID: c.serviceID, QKey: qkey, PrivateData: pd})
	})
	e.remove(c)
	return nil
}

func (e *Engine) get(id uint32) (*conn, error) {
	c, ok := e.conns[id]
	if !ok {
		return nil, errUnknownID
	}
	return c, nil
}

// QPAttr returns the attributes, and the mask of those set, that move the
// QP of connection id to state (StateInit, StateRTR or StateRTS), as
// ib_cm_init_qp_attr computes them.
func (e *Engine) QPAttr(id uint32, state roce.QPState) (roce.QPAttr, roce.AttrMask, error) {
	c, err := e.get(id)
	if err != nil {
		return roce.QPAttr{}, 0, err
	}
	var a roce.QPAttr
	var m roce.AttrMask
	switch c.state {
	case StateREQRcvd, StateMRAREQSent, StateREPSent, StateMRAREPRcvd, StateREPRcvd, StateEstablished:
	default:
		return a, 0, fmt.Errorf("%w: QP attributes in %v", ErrState, c.state)
	}
	a.State = state
	switch state {
	case roce.StateInit:
		a.AccessFlags = roce.AccessRemoteWrite
		if c.respRes > 0 {
			a.AccessFlags |= roce.AccessRemoteRead | roce.AccessRemoteAtomic
		}
		a.PKeyIndex, a.Port = 0, 1
		m = roce.AttrState | roce.AttrAccessFlags | roce.AttrPKeyIndex | roce.AttrPort
	case roce.StateRTR:
		if c.state == StateREQRcvd || c.state == StateMRAREQSent {
			return a, 0, fmt.Errorf("%w: RTR needs our REP parameters first", ErrState)
		}
		a.AV = roce.AddressVector{DGID: ib.GIDFromAddr(c.path.Remote), SGID: ib.GIDFromAddr(c.path.Local),
			TrafficClass: c.path.TrafficClass, HopLimit: c.path.HopLimit, FlowLabel: c.path.FlowLabel}
		a.PathMTU = c.pathMTU
		a.DestQPN = c.remoteQPN
		a.RQPSN = c.localPSN // the PSN we announced is the one we receive from
		m = roce.AttrState | roce.AttrAV | roce.AttrPathMTU | roce.AttrDestQPN | roce.AttrRQPSN
		if c.transport == mad.TransportRC {
			a.MaxDestRdAtomic = c.respRes
			a.MinRNRTimer = 0 // rdma_cm leaves it 0 (655.36 ms); see ib-wire §8.7
			m |= roce.AttrMaxDestRdAtomic | roce.AttrMinRNRTimer
		}
	case roce.StateRTS:
		if c.state == StateREQRcvd || c.state == StateMRAREQSent {
			return a, 0, fmt.Errorf("%w: RTS needs our REP parameters first", ErrState)
		}
		a.SQPSN = c.remotePSN // and we send from the one the peer announced
		m = roce.AttrState | roce.AttrSQPSN
		if c.transport == mad.TransportRC {
			a.Timeout = c.ackTimeout
			a.RetryCnt = c.retryCount
			a.RNRRetry = c.rnrRetry
			a.MaxRdAtomic = c.initDepth
			m |= roce.AttrTimeout | roce.AttrRetryCnt | roce.AttrRNRRetry | roce.AttrMaxQPRdAtomic
		}
	default:
		return a, 0, fmt.Errorf("%w: no CM attributes for QP state %v", ErrInvalid, state)
	}
	return a, m, nil
}
