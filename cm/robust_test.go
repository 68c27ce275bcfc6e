package cm

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
)

func TestMalformedMADs(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	from := Path{Local: p.b.addr, Remote: p.a.addr}
	good := make(mad.MAD, mad.Size)
	h := mad.CMHeader(mad.AttrREQ, 1)
	good.Encode(&h)
	good.REQ().Encode(&mad.REQFields{LocalCommID: 1, ServiceID: testSID, LocalQPN: 5, PathMTU: 3})
	bad := map[string][]byte{
		"empty":         nil,
		"header only":   good[:mad.HeaderSize],
		"one short":     good[:mad.Size-1],
		"base version":  withByte(good, 0, 2),
		"class SA":      withByte(good, 1, 0x03),
		"class version": withByte(good, 2, 1),
		"response bit":  withByte(good, 3, 0x83),
		"method get":    withByte(good, 3, 0x01),
		"attribute":     withByte(good, 17, 0x42),
		"ClassPortInfo": withByte(good, 17, 0x01),
	}
	for name, b := range bad {
		err := p.b.e.Receive(from, b)
		var pe *mad.ParseError
		if !errors.As(err, &pe) || !(errors.Is(err, ib.ErrTruncated) || errors.Is(err, ib.ErrUnsupported)) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := p.b.e.Stats().Malformed; got != uint64(len(bad)) {
		t.Errorf("Malformed = %d", got)
	}
	if _, ok := p.b.e.PollOutbound(); ok {
		t.Error("a malformed MAD was answered")
	}
	if _, ok := p.b.e.PollEvent(); ok {
		t.Error("a malformed MAD made an event")
	}
	p.assertEmpty()

	// Well-formed but unacceptable REQs get the Linux REJ, no state.
	for _, c := range []struct {
		mod    func(f *mad.REQFields)
		reason mad.RejectReason
	}{
		{func(f *mad.REQFields) { f.Transport = mad.TransportRD }, mad.RejInvalidTransportType},
		{func(f *mad.REQFields) { f.PathMTU = 0 }, mad.RejInvalidMTU},
		{func(f *mad.REQFields) { f.PathMTU = 7 }, mad.RejInvalidMTU},
		{func(f *mad.REQFields) { f.ServiceID++ }, mad.RejInvalidServiceID},
	} {
		f := good.REQ().Fields()
		c.mod(&f)
		m := make(mad.MAD, mad.Size)
		m.Encode(&h)
		m.REQ().Encode(&f)
		if err := p.b.e.Receive(from, m); err != nil {
			t.Fatal(err)
		}
		o, ok := p.b.e.PollOutbound()
		if !ok || mad.MAD(o.MAD[:]).REJ().Reason() != c.reason {
			t.Errorf("want REJ %v, got %v", c.reason, mad.MAD(o.MAD[:]).REJ().Reason())
		}
	}
	p.assertEmpty()
}

func withByte(b []byte, off int, v byte) []byte {
	c := append([]byte(nil), b...)
	c[off] = v
	return c
}

// TestOutOfOrder delivers every message type to an engine that does not
// expect it: nothing changes, nothing is left behind.
func TestOutOfOrder(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	from := Path{Local: p.b.addr, Remote: p.a.addr}
	msgs := map[mad.AttrID]func(m mad.MAD){
		mad.AttrRTU:     func(m mad.MAD) { m.RTU().Encode(&mad.RTUFields{LocalCommID: 1, RemoteCommID: 2}) },
		mad.AttrMRA:     func(m mad.MAD) { m.MRA().Encode(&mad.MRAFields{LocalCommID: 1, RemoteCommID: 2}) },
		mad.AttrREJ:     func(m mad.MAD) { m.REJ().Encode(&mad.REJFields{LocalCommID: 1, RemoteCommID: 2, Reason: 28}) },
		mad.AttrDREP:    func(m mad.MAD) { m.DREP().Encode(&mad.DREPFields{LocalCommID: 1, RemoteCommID: 2}) },
		mad.AttrSIDRREP: func(m mad.MAD) { m.SIDRREP().Encode(&mad.SIDRREPFields{RequestID: 2}) },
		mad.AttrLAP:     func(m mad.MAD) { m.LAP().Encode(&mad.LAPFields{LocalCommID: 1, RemoteCommID: 2}) },
		mad.AttrAPR:     func(m mad.MAD) { m.APR().Encode(&mad.APRFields{LocalCommID: 1, RemoteCommID: 2}) },
	}
	for a, fill := range msgs {
		m := make(mad.MAD, mad.Size)
		h := mad.CMHeader(a, 3)
		m.Encode(&h)
		fill(m)
		if err := p.b.e.Receive(from, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := p.b.e.PollOutbound(); ok {
		t.Error("stray message answered")
	}
	if got := p.b.e.Stats().Unmatched; got != uint64(len(msgs)) {
		t.Errorf("Unmatched = %d", got)
	}
	// A REP for no ID is rejected with INVALID_COMM_ID.
	m := make(mad.MAD, mad.Size)
	h := mad.CMHeader(mad.AttrREP, 3)
	m.Encode(&h)
	m.REP().Encode(&mad.REPFields{LocalCommID: 7, RemoteCommID: 8, LocalQPN: 9})
	_ = p.b.e.Receive(from, m)
	if o, ok := p.b.e.PollOutbound(); !ok || mad.MAD(o.MAD[:]).REJ().Reason() != mad.RejInvalidCommID ||
		mad.MAD(o.MAD[:]).REJ().RemoteCommID() != 7 || mad.MAD(o.MAD[:]).REJ().MessageRejected() != mad.MsgREP {
		t.Error("REP for no ID not rejected")
	}
	p.assertEmpty()

	// Messages naming a live ID but in the wrong state do nothing either.
	aID, err := p.a.e.Connect(p.connectParams(testSID))
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	bID := p.b.take(t, EventRequest).ID
	for _, a := range []mad.AttrID{mad.AttrRTU, mad.AttrDREP, mad.AttrMRA, mad.AttrLAP} {
		m := make(mad.MAD, mad.Size)
		h := mad.CMHeader(a, 3)
		m.Encode(&h)
		m.RTU().Encode(&mad.RTUFields{LocalCommID: aID, RemoteCommID: bID}) // same two leading words in each
		if a == mad.AttrMRA {
			m.MRA().Encode(&mad.MRAFields{LocalCommID: aID, RemoteCommID: bID, MessageMRAed: mad.MsgREP})
		}
		_ = p.b.e.Receive(from, m)
		if s, _ := p.b.e.State(bID); s != StateREQRcvd {
			t.Errorf("%v moved REQ_RCVD to %v", a, s)
		}
	}
	if _, ok := p.b.e.PollOutbound(); ok {
		t.Error("out-of-order message answered")
	}
}

// TestDuplicatedAndReordered runs connections through a network that
// duplicates and reorders MADs: every connection still comes up and goes
// down, and both engines end empty.
func TestDuplicatedAndReordered(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	r := rand.New(rand.NewPCG(5, 6))
	var held []Outbound
	p.filter = func(from *side, o *Outbound) []Outbound {
		out := []Outbound{*o}
		if r.IntN(3) == 0 {
			out = append(out, *o) // duplicate
		}
		if r.IntN(4) == 0 {
			held = append(held, *o) // replay later, out of order
		}
		return out
	}
	for i := 0; i < 50; i++ {
		aID, _ := p.establish()
		for _, o := range held {
			_ = p.a.e.Receive(Path{Local: p.a.addr, Remote: p.b.addr}, o.MAD[:])
			_ = p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, o.MAD[:])
		}
		held = held[:0]
		p.pump()
		if s, err := p.a.e.State(aID); err != nil || s != StateEstablished {
			t.Fatalf("cycle %d: %v %v", i, s, err)
		}
		_ = p.a.e.Disconnect(aID, nil)
		p.pump()
		p.drain()
		p.a.events, p.b.events = nil, nil
	}
	p.filter = nil
	p.drain()
	p.assertEmpty()
}

// TestThousandCycles connects and disconnects 1,000 times, alternating who
// disconnects, and checks that nothing accumulates.
func TestThousandCycles(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	for i := 0; i < 1000; i++ {
		aID, bID := p.establish()
		if i%2 == 0 {
			_ = p.a.e.Disconnect(aID, nil)
		} else {
			_ = p.b.e.Disconnect(bID, nil)
		}
		p.pump()
		p.drain()
		for _, s := range []*side{p.a, p.b} {
			if len(s.events) != 2 { // disconnected/done + exit
				t.Fatalf("cycle %d: %v events %v", i, s.addr, typesOf(s.events))
			}
			s.events = nil
		}
		p.assertEmpty()
		if t.Failed() {
			t.Fatalf("cycle %d", i)
		}
		p.sent = map[*side][]Outbound{}
	}
	if n, l := p.b.e.Len(); n != 0 || l != 1 {
		t.Errorf("B: %d IDs, %d listeners", n, l)
	}
}

// FuzzEngine feeds arbitrary MADs, from two peers, to an engine that has a
// listener, an established connection and a pending one, then runs every
// timer: no panic, every error typed, and nothing but the established
// connection may survive.
func FuzzEngine(f *testing.F) {
	p := newPair(f)
	_ = p.b.e.Listen(testSID)
	aID, bID := p.establish()
	seed := make(mad.MAD, mad.Size)
	for _, a := range []mad.AttrID{mad.AttrREQ, mad.AttrMRA, mad.AttrREJ, mad.AttrREP, mad.AttrRTU, mad.AttrDREQ,
		mad.AttrDREP, mad.AttrSIDRREQ, mad.AttrSIDRREP, mad.AttrLAP, mad.AttrAPR} {
		h := mad.CMHeader(a, 1)
		seed.Encode(&h)
		seed.RTU().Encode(&mad.RTUFields{LocalCommID: aID, RemoteCommID: bID})
		if a == mad.AttrREQ {
			seed.REQ().Encode(&mad.REQFields{LocalCommID: 77, ServiceID: testSID, LocalQPN: 0x11, PathMTU: 3, MaxCMRetries: 2})
		}
		f.Add(append([]byte(nil), seed...), byte(0))
	}
	for _, o := range p.sent[p.a] {
		f.Add(o.MAD[:], byte(1))
	}
	for _, o := range p.sent[p.b] {
		f.Add(o.MAD[:], byte(2))
	}
	f.Fuzz(func(t *testing.T, b []byte, who byte) {
		q := newPair(t)
		_ = q.b.e.Listen(testSID)
		_, bID := q.establish()
		_, _ = q.a.e.Connect(q.connectParams(testSID))
		q.pump()
		q.filter = func(*side, *Outbound) []Outbound { return nil }
		remote := q.a.addr
		if who&1 != 0 {
			remote = netip.MustParseAddr("10.0.0.9")
		}
		for i := 0; i < 3; i++ {
			err := q.b.e.Receive(Path{Local: q.b.addr, Remote: remote}, b)
			var pe *mad.ParseError
			if err != nil && !errors.As(err, &pe) {
				t.Fatalf("untyped error %v", err)
			}
		}
		q.pump()
		// The consumer refuses whatever the MADs asked for.
		for _, ev := range q.b.events {
			switch ev.Type {
			case EventRequest:
				if err := q.b.e.Reject(ev.ID, mad.RejConsumerDefined, nil, nil); err != nil {
					t.Fatal(err)
				}
			case EventSIDRRequest:
				if err := q.b.e.SIDRReply(ev.ID, mad.SIDRReject, 0, 0, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		q.pump()
		q.drain()
		for id, c := range q.b.e.conns {
			if id != bID || (c.state != StateEstablished && c.state != StateIdle) {
				t.Fatalf("left behind: %#x in %v", id, c.state)
			}
		}
	})
}
