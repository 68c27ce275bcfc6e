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
		e.recvMRA(m)
	case mad.AttrREJ:
		e.recvREJ(m)
	case mad.AttrREP:
		e.recvREP(p, m)
	case mad.AttrRTU:
		e.recvRTU(m)
	case mad.AttrDREQ:
		e.recvDREQ(p, m)
	case mad.AttrDREP:
		e.recvDREP(m)
	case mad.AttrSIDRREQ:
		e.recvSIDRREQ(p, m)
	case mad.AttrSIDRREP:
		e.recvSIDRREP(m)
	case mad.AttrLAP:
		e.recvLAP(p, m)
	default: // APR: we never send a LAP
		e.stats.Unmatched++
	}
	return nil
}

// issueREJ answers a message that has no ID here (cm_issue_rej): local comm
// ID 0, remote comm ID = the sender's.
func (e *Engine) issueREJ(p Path, m mad.MAD, remoteID uint32, msg mad.MsgType, reason mad.RejectReason) {
	e.stats.RejectsIssued++
	e.queue(p, mad.AttrREJ, m.TID(), func(o mad.MAD) {
		o.REJ().Encode(&mad.REJFields{RemoteCommID: remoteID, MessageRejected: msg, Reason: reason})
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
		e.issueREJ(p, m, r.LocalCommID(), mad.MsgREQ, mad.RejStaleConn)
		if c := e.conns[id]; c.state == StateEstablished {
			_ = e.Disconnect(id, nil)
		}
		return
	}
	if _, ok := e.listeners[r.ServiceID()]; !ok {
		e.issueREJ(p, m, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidServiceID)
		return
	}
	switch {
	case r.Transport() != mad.TransportRC && r.Transport() != mad.TransportUC:
		e.issueREJ(p, m, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidTransportType)
		return
	case r.PathMTU() < 1 || r.PathMTU() > 5:
		e.issueREJ(p, m, r.LocalCommID(), mad.MsgREQ, mad.RejInvalidMTU)
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
		ackTimeout: max(pri.LocalACKTimeout, 1), localCMTimeout: f.LocalCMResponseTimeout,
		maxCMRetries: f.MaxCMRetries, flowControl: f.FlowControl, srq: f.SRQ, pkey: f.PKey,
	}
	// REP (and DREQ) retransmit interval: the response time the peer
	// announced for itself.
	c.timeout = ConvertToDuration(f.LocalCMResponseTimeout)
	e.conns[c.id] = c
	e.indexRemote(c)
	e.indexQPN(c)
	e.emit(Event{Type: EventRequest, ID: c.id, ServiceID: f.ServiceID, Path: path, REQ: &f, PrivateData: f.PrivateData})
}

func (e *Engine) recvMRA(m mad.MAD) {
	r := m.MRA()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok {
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
	c.interval = ConvertToDuration(r.ServiceTimeout()) + ConvertToDuration(c.ackTimeout)
	if c.waiting {
		e.arm(c, e.cfg.Clock.Now()+c.interval)
	} else {
		c.deadline = e.cfg.Clock.Now() + c.interval
	}
}

func (e *Engine) recvREJ(m mad.MAD) {
	r := m.REJ()
	c, ok := e.conns[r.RemoteCommID()]
	if r.Reason() == mad.RejTimeout && r.ARILength() >= 8 {
		// A cancelled REQ (cm_destroy_id): the rejecter did not know our
		// ID yet; it names itself by comm ID and, in the ARI, CA GUID.
		if id, found := e.byRemote[remoteKey{r.LocalCommID(), binary.BigEndian.Uint64(r.ARI())}]; found {
			c, ok = e.conns[id], true
		}
	}
	if !ok || (c.remoteID != 0 && r.LocalCommID() != 0 && r.LocalCommID() != c.remoteID) {
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
	if !ok || !c.active || c.state == StateSIDRREQSent {
		// cm_rep_handler: a REP for no ID of ours is rejected.
		e.issueREJ(p, m, r.LocalCommID(), mad.MsgREP, mad.RejInvalidCommID)
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
	f := r.Fields()
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
	c.ackTimeout = ACKTimeout(f.TargetACKDelay, c.plt)
	e.indexRemote(c)
	e.indexQPN(c)
	e.emit(Event{Type: EventReply, ID: c.id, ServiceID: c.serviceID, Path: c.path, REP: &f, PrivateData: f.PrivateData})
}

func (e *Engine) recvRTU(m mad.MAD) {
	r := m.RTU()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || r.LocalCommID() != c.remoteID || (c.state != StateREPSent && c.state != StateMRAREPRcvd) {
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
	if !ok || c.remoteID != r.LocalCommID() || c.state == StateSIDRREQSent || c.state == StateSIDRREQRcvd {
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

func (e *Engine) recvDREP(m mad.MAD) {
	r := m.DREP()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || c.remoteID != r.LocalCommID() || c.state != StateDREQSent {
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

func (e *Engine) recvSIDRREP(m mad.MAD) {
	r := m.SIDRREP()
	c, ok := e.conns[r.RequestID()]
	if !ok || c.state != StateSIDRREQSent {
		e.stats.Unmatched++
		return
	}
	f := r.Fields()
	e.remove(c)
	ev := Event{Type: EventSIDRReply, ID: c.id, ServiceID: c.serviceID, Path: c.path, SIDRREP: &f, PrivateData: f.PrivateData}
	if f.Status != mad.SIDRSuccess {
		ev.Err = fmt.Errorf("%w: status %d", ErrSIDRStatus, f.Status)
	}
	e.emit(ev)
}

// recvLAP: RoCE has no alternate paths. Linux drops a LAP on RoCE ports;
// we answer one for an established connection with APR status UNSUPPORTED
// so that the peer stops retrying, and drop the rest.
func (e *Engine) recvLAP(p Path, m mad.MAD) {
	r := m.LAP()
	c, ok := e.conns[r.RemoteCommID()]
	if !ok || c.state != StateEstablished || r.LocalCommID() != c.remoteID {
		e.stats.Unmatched++
		return
	}
	e.queue(c.path, mad.AttrAPR, m.TID(), func(o mad.MAD) {
		o.APR().Encode(&mad.APRFields{LocalCommID: c.id, RemoteCommID: c.remoteID, Status: mad.APRUnsupported})
	})
}
