package cm

import (
	"encoding/binary"
	"fmt"

	"github.com/goroce/goroce/cm/mad"
)

// Receive handles one MAD received on QP1. p is the path as seen from here:
// p.Local is the packet's destination address, p.Remote its source. A MAD
// that is not a well-formed CM message yields a *mad.ParseError and changes
// nothing; messages that match no ID are dropped or answered as the Linux CM
// answers them (REJ, DREP, SIDR_REP).
func (e *Engine) Receive(p Path, b []byte) error {
	m, err := mad.ParseCM(b)
	if err != nil {
		e.stats.Malformed++
		return err
	}
	if !p.Local.IsValid() || !p.Remote.IsValid() {
		return fmt.Errorf("%w: receive path needs both addresses", ErrInvalid)
	}
	p.HopLimit = e.cfg.HopLimit // replies use the local route's hop limit
	switch m.AttrID() {
	case mad.AttrREQ:
		e.recvREQ(p, m)
	case mad.AttrMRA:
		e.recvMRA(p, m)
	case mad.AttrREJ:
		e.recvREJ(p, m)
	case mad.AttrREP:
		e.recvREP(p, m)
	case mad.AttrRTU:
		e.recvRTU(p, m)
	case mad.AttrDREQ:
		e.recvDREQ(p, m)
	case mad.AttrDREP:
		e.recvDREP(p, m)
	case mad.AttrSIDRREQ:
		e.recvSIDRREQ(p, m)
	case mad.AttrSIDRREP:
		e.recvSIDRREP(p, m)
	case mad.AttrLAP:
		e.recvLAP(p, m)
	default: // APR: we never send a LAP
		e.stats.Unmatched++
	}
	return nil
}

// peerTimeout caps a timeout exponent the peer chose for us (see
// Config.MaxPeerCMTimeout).
func (e *Engine) peerTimeout(t uint8) uint8 {
	if t > e.cfg.MaxPeerCMTimeout {
		e.stats.Clamped++
		return e.cfg.MaxPeerCMTimeout
	}
	return t
}

// fromPeer reports whether a message for c came from c's peer. The Linux
// CM matches on communication IDs only; on RoCE the source address is as
// cheap to check and keeps another host from ending a connection whose
// IDs it guessed.
func fromPeer(c *conn, p Path) bool { return c.path.Remote == p.Remote }

// issueREJ answers a message that has no ID here (cm_issue_rej): the IDs
// of the message swapped, remote comm ID = the sender's, local comm ID =
// the one the message named as ours (0 for a REQ).
func (e *Engine) issueREJ(p Path, m mad.MAD, localID, remoteID uint32, msg mad.MsgType, reason mad.RejectReason) {
	e.stats.RejectsIssued++
	e.queue(p, mad.AttrREJ, m.TID(), func(o mad.MAD) {
		o.REJ().Encode(&mad.REJFields{LocalCommID: localID, RemoteCommID: remoteID, MessageRejected: msg, Reason: reason})
	})
}

func (e *Engine) recvREQ(p Path, m mad.MAD) {
	r := m.REQ()
	guid := r.LocalCAGUID()
	if id, ok := e.byRemote[remoteKey{r.LocalCommID(), guid}]; ok {
		e.stats.Duplicates++
		c := e.conns[id]
		switch c.state {
		case StateREQRcvd:
			if e.cfg.MRAServiceTimeout == 0 {
				return
			}
			// The consumer has not answered yet: tell the peer to wait
			// (older rdma_cm's delayed MRA).
			c.state = StateMRAREQSent
			e.reply(c, mad.AttrMRA, c.tid, func(o mad.MAD) {
				o.MRA().Encode(&mad.MRAFields{LocalCommID: c.id, RemoteCommID: c.remoteID,
					MessageMRAed: mad.MsgREQ, ServiceTimeout: e.cfg.MRAServiceTimeout})
			})
		case StateMRAREQSent:
			e.out = append(e.out, Outbound{Path: c.path, MAD: c.lastReply})
		case StateTimewait:
			e.queue(c.path, mad.AttrREJ, m.TID(), func(o mad.MAD) {
				o.REJ().Encode(&mad.REJFields{LocalCommID: c.id, RemoteCommID: c.remoteID,
					MessageRejected: mad.MsgREQ, Reason: mad.RejStaleConn})
			})
		}
		return
	}
	if id, ok := e.byQPN[qpnKey{r.LocalQPN(), guid}]; ok {
		// The peer's QP is still connected to us under another ID: the
		// peer restarted. Refuse and tear the old connection down.
		e.issueREJ(p, m, 0, r.LocalCommID(), mad.MsgREQ, mad.RejStaleConn)
		// Only the connection's peer may end it this way (the GUID and
		// QPN of a REQ are the sender's word).
		if c := e.conns[id]; c.state == StateEstablished && fromPeer(c, p) {
			_ = e.Disconnect(id, nil)
		}
		return
	}
	if _, ok := e.listeners[r.ServiceID()]; !ok {
		e.issueREJ(p, m, 0, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidServiceID)
		return
	}
	switch {
	case r.Transport() != mad.TransportRC && r.Transport() != mad.TransportUC:
		e.issueREJ(p, m, 0, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidTransportType)
		return
	case r.PathMTU() < 1 || r.PathMTU() > 5:
		e.issueREJ(p, m, 0, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidMTU)
		return
	}
	// Last of the checks: duplicates of known IDs and refused REQs cost
	// no token, only those that would create an ID do.
	if !e.reqLimit.allow(p.Remote, e.cfg.Clock.Now()) {
		e.stats.RateLimited++
		return
	}
	f := r.Fields()
	pri := f.Primary
	path := p
	path.TrafficClass, path.FlowLabel = pri.TrafficClass, pri.FlowLabel
	if pri.HopLimit != 0 {
		path.HopLimit = pri.HopLimit
	}
	c := &conn{
		id: e.newID(), remoteID: f.LocalCommID, state: StateREQRcvd, serviceID: f.ServiceID,
		tid: m.TID(), path: path, remoteGUID: guid, transport: f.Transport,
		remoteQPN: f.LocalQPN, remotePSN: f.StartingPSN, pathMTU: f.PathMTU,
		retryCount: f.RetryCount, rnrRetry: f.RNRRetryCount,
		ackTimeout: max(e.peerTimeout(pri.LocalACKTimeout), 1), localCMTimeout: f.LocalCMResponseTimeout,
		maxCMRetries: f.MaxCMRetries, flowControl: f.FlowControl, srq: f.SRQ, pkey: f.PKey,
	}
	// REP (and DREQ) retransmit interval: the response time the peer
	// announced for itself, capped so that a peer announcing hours cannot
	// hold a half-open connection (and a listener's slot) that long.
	c.timeout = ConvertToDuration(e.peerTimeout(f.LocalCMResponseTimeout))
	e.conns[c.id] = c
	e.indexRemote(c)
	e.indexQPN(c)
	e.emit(Event{Type: EventRequest, ID: c.id, ServiceID: f.ServiceID, Path: path, REQ: &f, PrivateData: f.PrivateData})
}

func (e *Engine) recvMRA(p Path, m mad.MAD) {
	r := m.MRA()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || !fromPeer(c, p) {
		e.stats.Unmatched++
		return
	}
	switch {
	case r.MessageMRAed() == mad.MsgREQ && c.state == StateREQSent:
		c.state = StateMRAREQRcvd
		c.remoteID = r.LocalCommID()
	case r.MessageMRAed() == mad.MsgREP && c.state == StateREPSent && r.LocalCommID() == c.remoteID:
		c.state = StateMRAREPRcvd
	default:
		e.stats.Unmatched++
		return
	}
	// cm_mra_handler: wait the promised service time plus one ACK timeout,
	// for this and every further retry.
	c.interval = ConvertToDuration(e.peerTimeout(r.ServiceTimeout())) + ConvertToDuration(c.ackTimeout)
	if c.state == StateMRAREPRcvd && c.repCap > 0 {
		c.interval = min(c.interval, c.repCap) // nor may an MRA stretch a bounded REP
	}
	if c.waiting {
		e.arm(c, e.cfg.Clock.Now()+c.interval)
	} else {
		c.deadline = e.cfg.Clock.Now() + c.interval
	}
}

func (e *Engine) recvREJ(p Path, m mad.MAD) {
	r := m.REJ()
	c, ok := e.conns[r.RemoteCommID()]
	byARI := false
	if r.Reason() == mad.RejTimeout && r.ARILength() >= 8 {
		// A cancelled REQ (cm_destroy_id): the rejecter did not know our
		// ID yet; it names itself by comm ID and, in the ARI, CA GUID.
		if id, found := e.byRemote[remoteKey{r.LocalCommID(), binary.BigEndian.Uint64(r.ARI())}]; found {
			c, ok, byARI = e.conns[id], true, true
		}
	}
	// cm_acquire_rejected_id: a REJ names both IDs, except one for a REQ
	// sent before the rejecter had an ID (cm_issue_rej: local comm ID 0).
	// Our REQ's ID does not know the peer's yet and takes any.
	if !ok || !fromPeer(c, p) || !byARI && c.remoteID != 0 && r.LocalCommID() != c.remoteID &&
		(r.LocalCommID() != 0 || r.MessageRejected() != mad.MsgREQ) {
		e.stats.Unmatched++
		return
	}
	ev := Event{Type: EventRejected, ID: c.id, ServiceID: c.serviceID, Err: mad.RejectErrorFrom(r)}
	ev.PrivateData = ev.Err.(*mad.RejectError).PrivateData
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREQRcvd, StateMRAREQSent, StateREPRcvd:
		e.remove(c)
	case StateREPSent, StateMRAREPRcvd, StateEstablished, StateDREQSent:
		e.enterTimewait(c)
	default:
		e.stats.Unmatched++
		return
	}
	e.emit(ev)
}

func (e *Engine) recvREP(p Path, m mad.MAD) {
	r := m.REP()
	c, ok := e.conns[r.RemoteCommID()]
	if ok && !fromPeer(c, p) {
		e.stats.Unmatched++ // not answered: the REJ would go to whoever forged it
		return
	}
	if !ok || !c.active || c.state == StateSIDRREQSent {
		// cm_rep_handler: a REP for no ID of ours is rejected.
		e.issueREJ(p, m, r.RemoteCommID(), r.LocalCommID(), mad.MsgREP, mad.RejInvalidCommID)
		return
	}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
	case StateEstablished, StateREPRcvd:
		// Duplicate REP: our RTU was lost; send it again.
		e.stats.Duplicates++
		if c.state == StateEstablished && c.replyValid {
			e.out = append(e.out, Outbound{Path: c.path, MAD: c.lastReply})
		}
		return
	default:
		e.stats.Unmatched++
		return
	}
	if c.remoteID != 0 && r.LocalCommID() != c.remoteID {
		// The peer named itself in an MRA; this REP is from another ID.
		e.stats.Unmatched++
		return
	}
	f := r.Fields()
	// cm_rep_handler: the peer's comm ID or QP already belongs to another
	// of our connections: a stale connection. Refuse the REP (the REQ
	// keeps waiting for a good one), and disconnect the old connection if
	// it holds the QP.
	if id, dup := e.byRemote[remoteKey{f.LocalCommID, f.LocalCAGUID}]; dup && id != c.id {
		e.issueREJ(p, m, f.RemoteCommID, f.LocalCommID, mad.MsgREP, mad.RejStaleConn)
		return
	}
	if id, dup := e.byQPN[qpnKey{f.LocalQPN, f.LocalCAGUID}]; dup && id != c.id && (c.transport == mad.TransportRC || c.transport == mad.TransportUC) {
		e.issueREJ(p, m, f.RemoteCommID, f.LocalCommID, mad.MsgREP, mad.RejStaleConn)
		if old := e.conns[id]; old.state == StateEstablished && fromPeer(old, p) {
			_ = e.Disconnect(id, nil)
		}
		return
	}
	e.stopTimer(c)
	c.state = StateREPRcvd
	c.remoteID = f.LocalCommID
	c.remoteGUID = f.LocalCAGUID
	c.remoteQPN = f.LocalQPN
	c.remotePSN = f.StartingPSN
	// The peer's responder resources bound what we may issue and its
	// initiator depth what we must accept.
	c.initDepth = f.ResponderResources
	c.respRes = f.InitiatorDepth
	c.rnrRetry = f.RNRRetryCount
	c.ackTimeout = e.peerTimeout(ACKTimeout(f.TargetACKDelay, c.plt))
	e.indexRemote(c)
	e.indexQPN(c)
	e.emit(Event{Type: EventReply, ID: c.id, ServiceID: c.serviceID, Path: c.path, REP: &f, PrivateData: f.PrivateData})
}

func (e *Engine) recvRTU(p Path, m mad.MAD) {
	r := m.RTU()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || !fromPeer(c, p) || r.LocalCommID() != c.remoteID || (c.state != StateREPSent && c.state != StateMRAREPRcvd) {
		e.stats.Unmatched++
		return
	}
	e.stopTimer(c)
	c.state = StateEstablished
	e.emit(Event{Type: EventEstablished, ID: c.id, ServiceID: c.serviceID, Path: c.path, PrivateData: r.Fields().PrivateData})
}

func (e *Engine) recvDREQ(p Path, m mad.MAD) {
	r := m.DREQ()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || !fromPeer(c, p) || c.remoteID != r.LocalCommID() || c.state == StateSIDRREQSent || c.state == StateSIDRREQRcvd {
		// cm_issue_drep: answer a DREQ for an unknown connection anyway so
		// that the peer does not retry.
		e.stats.Unmatched++
		e.queue(p, mad.AttrDREP, m.TID(), func(o mad.MAD) {
			o.DREP().Encode(&mad.DREPFields{LocalCommID: r.RemoteCommID(), RemoteCommID: r.LocalCommID()})
		})
		return
	}
	if r.RemoteQPN() != c.localQPN {
		e.stats.Unmatched++
		return
	}
	evType := EventDisconnected
	switch c.state {
	case StateEstablished, StateREPSent, StateMRAREPRcvd, StateREPRcvd:
	case StateDREQSent:
		evType = EventDisconnectDone
	case StateTimewait:
		e.stats.Duplicates++
		e.queue(c.path, mad.AttrDREP, m.TID(), func(o mad.MAD) {
			o.DREP().Encode(&mad.DREPFields{LocalCommID: c.id, RemoteCommID: c.remoteID})
		})
		return
	default:
		e.stats.Unmatched++
		return
	}
	e.stopTimer(c)
	e.reply(c, mad.AttrDREP, m.TID(), func(o mad.MAD) {
		o.DREP().Encode(&mad.DREPFields{LocalCommID: c.id, RemoteCommID: c.remoteID})
	})
	e.enterTimewait(c)
	e.emit(Event{Type: evType, ID: c.id, ServiceID: c.serviceID, PrivateData: r.Fields().PrivateData})
}

func (e *Engine) recvDREP(p Path, m mad.MAD) {
	r := m.DREP()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || !fromPeer(c, p) || c.remoteID != r.LocalCommID() || c.state != StateDREQSent {
		e.stats.Unmatched++
		return
	}
	e.stopTimer(c)
	e.enterTimewait(c)
	e.emit(Event{Type: EventDisconnectDone, ID: c.id, ServiceID: c.serviceID, PrivateData: r.Fields().PrivateData})
}

func (e *Engine) recvSIDRREQ(p Path, m mad.MAD) {
	r := m.SIDRREQ()
	k := sidrKey{r.RequestID(), p.Remote}
	if _, dup := e.sidrIn[k]; dup {
		e.stats.Duplicates++
		return
	}
	if _, ok := e.listeners[r.ServiceID()]; !ok {
		e.stats.RejectsIssued++
		e.queue(p, mad.AttrSIDRREP, m.TID(), func(o mad.MAD) {
			o.SIDRREP().Encode(&mad.SIDRREPFields{RequestID: r.RequestID(), Status: mad.SIDRUnsupported, ServiceID: r.ServiceID()})
		})
		return
	}
	f := r.Fields()
	c := &conn{id: e.newID(), remoteID: f.RequestID, state: StateSIDRREQRcvd, serviceID: f.ServiceID,
		tid: m.TID(), path: p, pkey: f.PKey, sidr: &k}
	e.conns[c.id] = c
	e.sidrIn[k] = c.id
	e.emit(Event{Type: EventSIDRRequest, ID: c.id, ServiceID: f.ServiceID, Path: p, SIDRREQ: &f, PrivateData: f.PrivateData})
}

func (e *Engine) recvSIDRREP(p Path, m mad.MAD) {
	r := m.SIDRREP()
	c, ok := e.conns[r.RequestID()]
	// cm_sidr_rep_handler: only an ID waiting for a SIDR_REP, and (here)
	// only from the address asked, for the service asked.
	if !ok || c.state != StateSIDRREQSent || !fromPeer(c, p) || r.ServiceID() != c.serviceID {
		e.stats.Unmatched++
		return
	}
	f := r.Fields()
	e.remove(c)
	ev := Event{Type: EventSIDRReply, ID: c.id, ServiceID: c.serviceID, Path: c.path, SIDRREP: &f, PrivateData: f.PrivateData}
	if f.Status != mad.SIDRSuccess {
		ev.Err = f.Status // matches mad.ErrRejected and the status
	}
	e.emit(ev)
}

// recvLAP: RoCE has no alternate paths. Linux drops a LAP on RoCE ports;
// we answer one for an established connection with APR status UNSUPPORTED
// so that the peer stops retrying, and drop the rest.
func (e *Engine) recvLAP(p Path, m mad.MAD) {
	r := m.LAP()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || !fromPeer(c, p) || c.state != StateEstablished || r.LocalCommID() != c.remoteID {
		e.stats.Unmatched++
		return
	}
	e.queue(c.path, mad.AttrAPR, m.TID(), func(o mad.MAD) {
		o.APR().Encode(&mad.APRFields{LocalCommID: c.id, RemoteCommID: c.remoteID, Status: mad.APRUnsupported})
	})
}
