package cm

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/cm/mad"
)

// forgeREJ builds a REJ MAD.
func forgeREJ(f *mad.REJFields) []byte {
	var b [mad.Size]byte
	m := mad.MAD(b[:])
	h := mad.CMHeader(mad.AttrREJ, 0x1234)
	m.Encode(&h)
	m.REJ().Encode(f)
	return b[:]
}

// TestPeerTimeoutsCapped: a REQ announcing a response timeout of 31
// (2.3 h) and an MRA of service timeout 31 pace our retries at the cap.
func TestPeerTimeoutsCapped(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	cp := p.connectParams(testSID)
	cp.CMResponseTimeout = 31
	if _, err := p.a.e.Connect(cp); err != nil {
		t.Fatal(err)
	}
	p.pump()
	req := p.b.take(t, EventRequest)
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		t.Fatal(err)
	}
	c := p.b.e.conns[req.ID]
	if c.interval != ConvertToDuration(DefaultMaxPeerCMTimeout) || p.b.e.Stats().Clamped == 0 {
		t.Errorf("REP retry interval %v, clamped %d", c.interval, p.b.e.Stats().Clamped)
	}
	// An MRA for the REP asking for 2^31 × 4 µs: the wait is capped too.
	var b [mad.Size]byte
	m := mad.MAD(b[:])
	h := mad.CMHeader(mad.AttrMRA, c.tid)
	m.Encode(&h)
	m.MRA().Encode(&mad.MRAFields{LocalCommID: c.remoteID, RemoteCommID: c.id, MessageMRAed: mad.MsgREP, ServiceTimeout: 31})
	if err := p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, b[:]); err != nil {
		t.Fatal(err)
	}
	if want := ConvertToDuration(DefaultMaxPeerCMTimeout) + ConvertToDuration(c.ackTimeout); c.state != StateMRAREPRcvd || c.interval != want {
		t.Errorf("after MRA: %v, interval %v, want %v", c.state, c.interval, want)
	}
}

// TestForgedMessagesDropped: messages naming a connection's IDs but
// coming from another address, and REJs of a REP or established
// connection that do not name the peer's ID, change nothing.
func TestForgedMessagesDropped(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, bID := p.establish()
	ca := p.a.e.conns[aID]
	other := netip.MustParseAddr("10.0.0.66")
	for _, tc := range []struct {
		name string
		from netip.Addr
		rej  mad.REJFields
	}{
		{"from another address", other, mad.REJFields{LocalCommID: bID, RemoteCommID: aID, MessageRejected: mad.MsgOther, Reason: mad.RejConsumerDefined}},
		{"without the peer's ID", p.b.addr, mad.REJFields{RemoteCommID: aID, MessageRejected: mad.MsgOther, Reason: mad.RejConsumerDefined}},
		{"with another peer ID", p.b.addr, mad.REJFields{LocalCommID: bID + 1, RemoteCommID: aID, MessageRejected: mad.MsgREP, Reason: mad.RejConsumerDefined}},
	} {
		before := p.a.e.Stats().Unmatched
		if err := p.a.e.Receive(Path{Local: p.a.addr, Remote: tc.from}, forgeREJ(&tc.rej)); err != nil {
			t.Fatal(err)
		}
		if ca.state != StateEstablished || p.a.e.Stats().Unmatched != before+1 {
			t.Errorf("REJ %s: state %v, unmatched %d→%d", tc.name, ca.state, before, p.a.e.Stats().Unmatched)
		}
	}
	// DREQ and DREP from another address are dropped too (a DREQ for an
	// unknown connection is answered, but this one names ours).
	if err := p.a.e.Disconnect(aID, nil); err != nil {
		t.Fatal(err)
	}
	o, _ := p.a.e.PollOutbound()
	if err := p.b.e.Receive(Path{Local: p.b.addr, Remote: other}, o.MAD[:]); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.b.e.State(bID); s != StateEstablished {
		t.Errorf("DREQ from another address: B in %v", s)
	}
	p.b.e.out = nil
	// The real DREQ ends it.
	if err := p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, o.MAD[:]); err != nil {
		t.Fatal(err)
	}
	p.pump()
	p.b.take(t, EventDisconnected)
	p.a.take(t, EventDisconnectDone)
	p.drain()
	p.assertEmpty()
}

// TestREPStaleConnection: a REP naming a QP that already has a
// connection with us is refused with REJ STALE_CONN and the old connection
// is disconnected (cm_rep_handler); the new REQ keeps waiting.
func TestREPStaleConnection(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	oldA, _ := p.establish()
	cp := p.connectParams(testSID)
	cp.QPN++ // a new QP of A's
	newA, err := p.a.e.Connect(cp)
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	req := p.b.take(t, EventRequest)
	// B answers with the QPN of the old connection (acceptParams' QPN).
	p.filter = func(from *side, o *Outbound) []Outbound {
		if from == p.a && mad.MAD(o.MAD[:]).AttrID() == mad.AttrDREQ {
			return nil // keep the old connection's DREQ from ending the test early
		}
		return []Outbound{*o}
	}
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		t.Fatal(err)
	}
	p.pump()
	if s, _ := p.a.e.State(newA); s != StateREQSent {
		t.Errorf("new connection after a stale REP: %v", s)
	}
	if s, _ := p.a.e.State(oldA); s != StateDREQSent {
		t.Errorf("old connection after a stale REP: %v", s)
	}
	var rej mad.MAD
	for _, o := range p.sent[p.a] {
		if m := mad.MAD(o.MAD[:]); m.AttrID() == mad.AttrREJ {
			rej = m
		}
	}
	if rej == nil || rej.REJ().Reason() != mad.RejStaleConn || rej.REJ().MessageRejected() != mad.MsgREP {
		t.Fatalf("no REJ STALE_CONN for the REP")
	}
	ev := p.b.take(t, EventRejected)
	if ev.ID != req.ID {
		t.Errorf("B's rejected ID %#x, want %#x", ev.ID, req.ID)
	}
}

// TestSIDRReplyFromElsewhere: a SIDR_REP must come from the address asked
// and name the service asked.
func TestSIDRReplyFromElsewhere(t *testing.T) {
	p := newPair(t)
	sid := mad.ServiceID(mad.PortSpaceUDP, 7174)
	_ = p.b.e.Listen(sid)
	id, err := p.a.e.SIDRRequest(&SIDRParams{ServiceID: sid, Path: Path{Local: p.a.addr, Remote: p.b.addr}})
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	sreq := p.b.take(t, EventSIDRRequest)
	if err := p.b.e.SIDRReply(sreq.ID, mad.SIDRSuccess, 0x33, mad.UDPQKey, nil); err != nil {
		t.Fatal(err)
	}
	o, _ := p.b.e.PollOutbound()
	if err := p.a.e.Receive(Path{Local: p.a.addr, Remote: netip.MustParseAddr("10.0.0.66")}, o.MAD[:]); err != nil {
		t.Fatal(err)
	}
	wrongSID := o.MAD
	mad.MAD(wrongSID[:]).SIDRREP().Encode(&mad.SIDRREPFields{RequestID: id, QPN: 0x33, ServiceID: sid + 1, QKey: mad.UDPQKey})
	if err := p.a.e.Receive(Path{Local: p.a.addr, Remote: p.b.addr}, wrongSID[:]); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.a.e.State(id); s != StateSIDRREQSent {
		t.Fatalf("after forged SIDR_REPs: %v", s)
	}
	if err := p.a.e.Receive(Path{Local: p.a.addr, Remote: p.b.addr}, o.MAD[:]); err != nil {
		t.Fatal(err)
	}
	p.pump()
	if ev := p.a.take(t, EventSIDRReply); ev.Err != nil || ev.SIDRREP.QPN != 0x33 {
		t.Errorf("SIDR reply %+v", ev)
	}
}

// TestREPQPNInTimewait: a connection in timewait no longer holds the
// peer's QP (cm_enter_timewait → cm_cleanup_timewait), so a REP that names
// that QP again, as a restarted peer's first QP does, is accepted.
func TestREPQPNInTimewait(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	oldA, oldB := p.establish()
	if err := p.b.e.Disconnect(oldB, nil); err != nil {
		t.Fatal(err)
	}
	p.pump()
	if s, _ := p.a.e.State(oldA); s != StateTimewait {
		t.Fatalf("old connection: %v, want timewait", s)
	}
	cp := p.connectParams(testSID)
	cp.QPN++
	newA, err := p.a.e.Connect(cp)
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	req := p.b.take(t, EventRequest)
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil { // the old connection's QPN
		t.Fatal(err)
	}
	p.pump()
	if s, _ := p.a.e.State(newA); s != StateREPRcvd {
		t.Fatalf("new connection after a REP naming a QP in timewait: %v", s)
	}
}
