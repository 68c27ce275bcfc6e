package cm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/roce"
)

func TestTimerMath(t *testing.T) {
	for _, c := range []struct {
		delay, plt, want uint8
	}{{15, 16, 17}, {15, 18, 19}, {15, 0, 15}, {15, 14, 16}, {15, 13, 16}, {15, 12, 15}, {0, 18, 19}, {15, 31, 31}, {0, 0, 2}} {
		if got := ACKTimeout(c.delay, c.plt); got != c.want {
			t.Errorf("ACKTimeout(%d, %d) = %d, want %d", c.delay, c.plt, got, c.want)
		}
	}
	for _, c := range []struct {
		t    uint8
		want time.Duration
	}{{0, time.Millisecond}, {8, time.Millisecond}, {16, 256 * time.Millisecond}, {20, 4096 * time.Millisecond}, {24, 65536 * time.Millisecond}} {
		if got := ConvertToDuration(c.t); got != c.want {
			t.Errorf("ConvertToDuration(%d) = %v", c.t, got)
		}
	}
}

func TestConnectDisconnect(t *testing.T) {
	p := newPair(t)
	if err := p.b.e.Listen(testSID); err != nil {
		t.Fatal(err)
	}
	aID, err := p.a.e.Connect(p.connectParams(testSID))
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	if s, _ := p.a.e.State(aID); s != StateREQSent {
		t.Fatalf("active state %v", s)
	}
	req := p.b.take(t, EventRequest)
	if req.REQ.LocalQPN != 0x11 || !bytes.HasPrefix(req.PrivateData, []byte("hello")) || req.Path.Remote != p.a.addr {
		t.Fatalf("request event %+v", req)
	}
	// The REQ as Linux rdma_cm would send it (ib-wire §8.5/§8.6).
	sentREQ := mad.MAD(p.sent[p.a][0].MAD[:])
	r := sentREQ.REQ()
	if r.Primary().LocalLID != 0xFFFF || r.Primary().LocalACKTimeout != 19 || r.MaxCMRetries() != 15 ||
		r.RemoteCMResponseTimeout() != 20 || r.LocalCMResponseTimeout() != 20 || r.PKey() != 0xFFFF ||
		sentREQ.TID() != uint64(1)<<32|uint64(aID>>24|aID>>8&0xff00|aID<<8&0xff0000|aID<<24) {
		t.Errorf("REQ fields %+v tid %#x", r.Fields(), sentREQ.TID())
	}
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		t.Fatal(err)
	}
	p.pump()
	rep := p.a.take(t, EventReply)
	if rep.REP.LocalQPN != 0x22 || rep.REP.TargetACKDelay != 15 || !bytes.HasPrefix(rep.PrivateData, []byte("welcome")) {
		t.Fatalf("reply %+v", rep.REP)
	}
	if s, _ := p.b.e.State(req.ID); s != StateREPSent {
		t.Fatalf("passive state %v", s)
	}

	// Both QPs get matching attributes.
	aINIT, _, _ := p.a.e.QPAttr(aID, roce.StateInit)
	aRTR, aRTRMask, err := p.a.e.QPAttr(aID, roce.StateRTR)
	if err != nil {
		t.Fatal(err)
	}
	aRTS, _, _ := p.a.e.QPAttr(aID, roce.StateRTS)
	bRTR, _, _ := p.b.e.QPAttr(req.ID, roce.StateRTR)
	bRTS, _, _ := p.b.e.QPAttr(req.ID, roce.StateRTS)
	bINIT, _, _ := p.b.e.QPAttr(req.ID, roce.StateInit)
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"A dest QPN", uint64(aRTR.DestQPN), 0x22}, {"B dest QPN", uint64(bRTR.DestQPN), 0x11},
		// Linux semantics: each side sends from the Starting PSN the peer announced.
		{"A rq_psn", uint64(aRTR.RQPSN), 0x123456}, {"B rq_psn", uint64(bRTR.RQPSN), 0xABCDEF},
		{"A sq_psn", uint64(aRTS.SQPSN), 0xABCDEF}, {"B sq_psn", uint64(bRTS.SQPSN), 0x123456},
		// B accepts at most 8 reads from A, and issues at most 2 to A.
		{"A max_rd_atomic", uint64(aRTS.MaxRdAtomic), 8}, {"B max_dest_rd_atomic", uint64(bRTR.MaxDestRdAtomic), 8},
		{"A max_dest_rd_atomic", uint64(aRTR.MaxDestRdAtomic), 2}, {"B max_rd_atomic", uint64(bRTS.MaxRdAtomic), 2},
		// Each QP uses the RNR retry count the peer chose.
		{"A rnr_retry", uint64(aRTS.RNRRetry), 5}, {"B rnr_retry", uint64(bRTS.RNRRetry), 6},
		{"A retry", uint64(aRTS.RetryCnt), 7}, {"B retry", uint64(bRTS.RetryCnt), 7},
		{"A timeout", uint64(aRTS.Timeout), 19}, {"B timeout", uint64(bRTS.Timeout), 19},
		{"A mtu", uint64(aRTR.PathMTU), 3}, {"B mtu", uint64(bRTR.PathMTU), 3},
		{"B min_rnr", uint64(bRTR.MinRNRTimer), 0},
		{"B flow label", uint64(bRTR.AV.FlowLabel), 0x83CA0}, {"B hop limit", uint64(bRTR.AV.HopLimit), 64},
		{"A access", uint64(aINIT.AccessFlags), uint64(roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic)},
		{"B access", uint64(bINIT.AccessFlags), uint64(roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	if aRTR.AV.DGID.Addr() != p.b.addr || bRTR.AV.DGID.Addr() != p.a.addr || aRTR.AV.SGID.Addr() != p.a.addr {
		t.Errorf("AVs %+v / %+v", aRTR.AV, bRTR.AV)
	}
	if aRTRMask&(roce.AttrDestQPN|roce.AttrRQPSN|roce.AttrAV|roce.AttrPathMTU|roce.AttrMaxDestRdAtomic|roce.AttrMinRNRTimer) == 0 {
		t.Errorf("RTR mask %v", aRTRMask)
	}

	if err := p.a.e.RTU(aID, nil); err != nil {
		t.Fatal(err)
	}
	p.pump()
	p.b.take(t, EventEstablished)
	if s, _ := p.a.e.State(aID); s != StateEstablished {
		t.Fatalf("active state %v", s)
	}
	// No retransmission once established.
	p.clock.t += time.Minute
	p.a.e.Advance()
	p.b.e.Advance()
	if _, ok := p.a.e.PollOutbound(); ok {
		t.Fatal("active side retransmitted after RTU")
	}
	if _, ok := p.b.e.PollOutbound(); ok {
		t.Fatal("passive side retransmitted after RTU")
	}

	if err := p.b.e.Disconnect(req.ID, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	p.pump()
	if ev := p.a.take(t, EventDisconnected); !bytes.HasPrefix(ev.PrivateData, []byte("bye")) {
		t.Errorf("DREQ private data %q", ev.PrivateData[:3])
	}
	p.b.take(t, EventDisconnectDone)
	if s, _ := p.a.e.State(aID); s != StateTimewait {
		t.Errorf("after DREQ: %v", s)
	}
	dreq := mad.MAD(p.sent[p.b][len(p.sent[p.b])-1].MAD[:])
	if dreq.AttrID() != mad.AttrDREQ || dreq.DREQ().RemoteQPN() != 0x11 {
		t.Errorf("DREQ %v %+v", dreq.AttrID(), dreq.DREQ().Fields())
	}
	drep := mad.MAD(p.sent[p.a][len(p.sent[p.a])-1].MAD[:])
	if drep.AttrID() != mad.AttrDREP || drep.TID() != dreq.TID() {
		t.Errorf("DREP %v tid %#x vs %#x", drep.AttrID(), drep.TID(), dreq.TID())
	}
	// Timewait lasts ConvertToDuration(19) = 2048 ms.
	start := p.clock.t
	p.drain()
	if d := p.clock.t - start; d != 2048*time.Millisecond {
		t.Errorf("timewait lasted %v", d)
	}
	p.a.take(t, EventExit)
	p.b.take(t, EventExit)
	p.assertEmpty()
}

func TestNoListener(t *testing.T) {
	p := newPair(t)
	aID, err := p.a.e.Connect(p.connectParams(testSID))
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	ev := p.a.take(t, EventRejected)
	if !errors.Is(ev.Err, mad.RejInvalidServiceID) || !errors.Is(ev.Err, mad.ErrRejected) {
		t.Fatalf("err %v", ev.Err)
	}
	rej := mad.MAD(p.sent[p.b][0].MAD[:])
	if f := rej.REJ().Fields(); f.LocalCommID != 0 || f.RemoteCommID != aID || f.MessageRejected != mad.MsgREQ ||
		rej.TID() != mad.MAD(p.sent[p.a][0].MAD[:]).TID() {
		t.Errorf("REJ %+v", f)
	}
	p.assertEmpty()
}

func TestREQTimeout(t *testing.T) {
	p := newPair(t)
	p.filter = func(*side, *Outbound) []Outbound { return nil } // the peer is gone
	start := p.clock.t
	if _, err := p.a.e.Connect(p.connectParams(testSID)); err != nil {
		t.Fatal(err)
	}
	p.pump()
	p.drain()
	ev := p.a.take(t, EventTimeout)
	if !errors.Is(ev.Err, ErrTimeout) {
		t.Fatal(ev.Err)
	}
	sent := p.sent[p.a]
	if len(sent) != 16 {
		t.Fatalf("%d REQs sent, want 1 + 15 retries", len(sent))
	}
	for _, o := range sent {
		if o.MAD != sent[0].MAD {
			t.Fatal("retransmitted REQ differs from the first")
		}
	}
	// 16 waits of 2×conv(18) + conv(20) = 6144 ms.
	if d := p.clock.t - start; d != 16*6144*time.Millisecond {
		t.Errorf("gave up after %v", d)
	}
	if p.a.e.Stats().Retransmits != 15 {
		t.Errorf("stats %+v", p.a.e.Stats())
	}
	p.assertEmpty()
}

func TestREPTimeoutAndLostRTU(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, _ := p.a.e.Connect(p.connectParams(testSID))
	p.pump()
	req := p.b.take(t, EventRequest)
	_ = p.b.e.Accept(req.ID, acceptParams())
	// Drop every RTU: B retransmits the REP, A answers each duplicate with
	// the RTU again; with the RTUs lost B finally gives up.
	p.filter = func(from *side, o *Outbound) []Outbound {
		if mad.MAD(o.MAD[:]).AttrID() == mad.AttrRTU {
			return nil
		}
		return []Outbound{*o}
	}
	p.pump()
	p.a.take(t, EventReply)
	if err := p.a.e.RTU(aID, nil); err != nil {
		t.Fatal(err)
	}
	p.pump()
	for i := 0; i < 40 && len(p.b.events) == 0; i++ {
		p.advance()
	}
	ev := p.b.take(t, EventTimeout)
	if !errors.Is(ev.Err, ErrTimeout) {
		t.Fatal(ev.Err)
	}
	reps, rtus := 0, 0
	for _, o := range p.sent[p.b] {
		if mad.MAD(o.MAD[:]).AttrID() == mad.AttrREP {
			reps++
		}
	}
	for _, o := range p.sent[p.a] {
		if mad.MAD(o.MAD[:]).AttrID() == mad.AttrRTU {
			rtus++
		}
	}
	if reps != 16 || rtus != 16 {
		t.Errorf("%d REPs, %d RTUs; want 16 each", reps, rtus)
	}
	if p.b.e.Stats().Retransmits != 15 || p.a.e.Stats().Duplicates != 15 {
		t.Errorf("stats B %+v A %+v", p.b.e.Stats(), p.a.e.Stats())
	}
	// A is established with a peer that has forgotten it: A disconnects,
	// B answers with a DREP though it has no such ID.
	_ = p.a.e.Disconnect(aID, nil)
	p.pump()
	p.a.take(t, EventDisconnectDone)
	p.drain()
	p.assertEmpty()
}

func TestMRAExtendsWait(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, _ := p.a.e.Connect(p.connectParams(testSID))
	p.pump()
	req := p.b.take(t, EventRequest)
	// B's consumer is slow: A's retransmitted REQ makes B send an MRA.
	p.advance()
	if s, _ := p.b.e.State(req.ID); s != StateMRAREQSent {
		t.Fatalf("passive after duplicate REQ: %v", s)
	}
	if s, _ := p.a.e.State(aID); s != StateMRAREQRcvd {
		t.Fatalf("active after MRA: %v", s)
	}
	mra := mad.MAD(p.sent[p.b][0].MAD[:])
	if mra.AttrID() != mad.AttrMRA || mra.MRA().ServiceTimeout() != 24 || mra.MRA().MessageMRAed() != mad.MsgREQ {
		t.Fatalf("MRA %v %+v", mra.AttrID(), mra.MRA().Fields())
	}
	// A now waits conv(24) + conv(ack timeout 19) = 65536 + 2048 ms.
	d, _ := p.a.e.NextDeadline()
	if w := d - p.clock.t; w != 67584*time.Millisecond {
		t.Errorf("wait after MRA %v", w)
	}
	// A further duplicate gets the same MRA again.
	p.advance()
	if n := len(p.sent[p.b]); n != 2 || p.sent[p.b][1].MAD != p.sent[p.b][0].MAD {
		t.Errorf("MRA not repeated: %d", n)
	}
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		t.Fatal(err)
	}
	p.pump()
	p.a.take(t, EventReply)
	_ = p.a.e.RTU(aID, nil)
	p.pump()
	p.b.take(t, EventEstablished)
}

func TestNoMRAByDefault(t *testing.T) {
	p := newPair(t)
	p.b.e.cfg.MRAServiceTimeout = 0
	_ = p.b.e.Listen(testSID)
	aID, _ := p.a.e.Connect(p.connectParams(testSID))
	p.pump()
	req := p.b.take(t, EventRequest)
	p.advance() // retransmitted REQ
	if s, _ := p.b.e.State(req.ID); s != StateREQRcvd || len(p.sent[p.b]) != 0 || p.b.e.Stats().Duplicates != 1 {
		t.Fatalf("duplicate REQ: state %v, %d MADs sent", s, len(p.sent[p.b]))
	}
	if s, _ := p.a.e.State(aID); s != StateREQSent {
		t.Fatalf("active %v", s)
	}
}

func TestConsumerReject(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, _ := p.a.e.Connect(p.connectParams(testSID))
	p.pump()
	req := p.b.take(t, EventRequest)
	if err := p.b.e.Reject(req.ID, mad.RejConsumerDefined, nil, []byte("busy")); err != nil {
		t.Fatal(err)
	}
	p.pump()
	ev := p.a.take(t, EventRejected)
	var re *mad.RejectError
	if !errors.As(ev.Err, &re) || re.Reason != mad.RejConsumerDefined || !bytes.HasPrefix(re.PrivateData, []byte("busy")) {
		t.Fatalf("%v", ev.Err)
	}
	if _, err := p.a.e.State(aID); !errors.Is(err, ErrState) || err != errUnknownID {
		t.Error("active ID survived the REJ")
	}
	p.assertEmpty()
}

func TestStaleConnection(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	_, bID := p.establish()
	// A restarts (new engine, same GUID and QPN) and connects again.
	p.a.e = newEngine(t, p.clock, 99, 0x505400fffe000001)
	p.a.events = nil
	if _, err := p.a.e.Connect(p.connectParams(testSID)); err != nil {
		t.Fatal(err)
	}
	p.pump()
	ev := p.a.take(t, EventRejected)
	if !errors.Is(ev.Err, mad.RejStaleConn) {
		t.Fatalf("%v", ev.Err)
	}
	// B tore the old connection down with a DREQ (answered by A's new
	// engine with a DREP for an unknown ID).
	p.b.take(t, EventDisconnectDone)
	if s, _ := p.b.e.State(bID); s != StateTimewait {
		t.Errorf("old connection in %v", s)
	}
	p.drain()
	p.assertEmpty()
}

func TestDREQEdgeCases(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, bID := p.establish()
	// A DREQ naming the wrong QPN is dropped.
	m := make(mad.MAD, mad.Size)
	h := mad.CMHeader(mad.AttrDREQ, 5)
	m.Encode(&h)
	m.DREQ().Encode(&mad.DREQFields{LocalCommID: aID, RemoteCommID: bID, RemoteQPN: 0x99})
	if err := p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, m); err != nil {
		t.Fatal(err)
	}
	if s, _ := p.b.e.State(bID); s != StateEstablished {
		t.Fatalf("wrong-QPN DREQ changed state to %v", s)
	}
	if _, ok := p.b.e.PollOutbound(); ok {
		t.Fatal("wrong-QPN DREQ answered")
	}
	// A DREQ for an unknown ID gets a DREP with the IDs swapped.
	m.DREQ().Encode(&mad.DREQFields{LocalCommID: 0x1111, RemoteCommID: 0x2222, RemoteQPN: 0x22})
	_ = p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, m)
	o, ok := p.b.e.PollOutbound()
	if !ok {
		t.Fatal("no DREP for unknown DREQ")
	}
	d := mad.MAD(o.MAD[:])
	if d.AttrID() != mad.AttrDREP || d.DREP().LocalCommID() != 0x2222 || d.DREP().RemoteCommID() != 0x1111 || d.TID() != 5 || o.Path.Remote != p.a.addr {
		t.Fatalf("DREP %+v", d.DREP().Fields())
	}
	// Simultaneous DREQs: both sides end in timewait, each with DisconnectDone.
	_ = p.a.e.Disconnect(aID, nil)
	_ = p.b.e.Disconnect(bID, nil)
	p.pump()
	p.a.take(t, EventDisconnectDone)
	p.b.take(t, EventDisconnectDone)
	// A duplicate DREQ in timewait is answered again.
	m.DREQ().Encode(&mad.DREQFields{LocalCommID: aID, RemoteCommID: bID, RemoteQPN: 0x22})
	_ = p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, m)
	if o, ok := p.b.e.PollOutbound(); !ok || mad.MAD(o.MAD[:]).AttrID() != mad.AttrDREP {
		t.Fatal("no DREP in timewait")
	}
	p.drain()
	p.assertEmpty()
}

func TestDREQTimeout(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, _ := p.establish()
	p.filter = func(from *side, o *Outbound) []Outbound {
		if from == p.a {
			return nil
		}
		return []Outbound{*o}
	}
	_ = p.a.e.Disconnect(aID, nil)
	p.pump()
	for i := 0; i < 100 && len(p.a.events) == 0; i++ {
		p.advance()
	}
	if ev := p.a.take(t, EventDisconnectDone); !errors.Is(ev.Err, ErrTimeout) {
		t.Fatalf("%v", ev.Err)
	}
	p.drain()
	// B never heard the DREQ and stays established: its own table keeps the ID.
	if n, _ := p.b.e.Len(); n != 1 {
		t.Errorf("B holds %d IDs", n)
	}
	if n, _ := p.a.e.Len(); n != 0 || !p.a.e.tablesEmpty() {
		t.Errorf("A holds %d IDs", n)
	}
}

func TestSIDR(t *testing.T) {
	p := newPair(t)
	sid := mad.ServiceID(mad.PortSpaceUDP, 7174)
	_ = p.b.e.Listen(sid)
	id, err := p.a.e.SIDRRequest(&SIDRParams{ServiceID: sid, Path: Path{Local: p.a.addr, Remote: p.b.addr}, PrivateData: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	p.pump()
	req := p.b.take(t, EventSIDRRequest)
	if req.SIDRREQ.RequestID != id || req.SIDRREQ.PKey != 0xFFFF {
		t.Fatalf("%+v", req.SIDRREQ)
	}
	if err := p.b.e.SIDRReply(req.ID, mad.SIDRSuccess, 0x33, mad.UDPQKey, []byte("y")); err != nil {
		t.Fatal(err)
	}
	p.pump()
	rep := p.a.take(t, EventSIDRReply)
	if rep.Err != nil || rep.SIDRREP.QPN != 0x33 || rep.SIDRREP.QKey != mad.UDPQKey || rep.SIDRREP.ServiceID != sid {
		t.Fatalf("%+v %v", rep.SIDRREP, rep.Err)
	}
	p.assertEmpty()

	// No listener: status UNSUPPORTED.
	_, _ = p.a.e.SIDRRequest(&SIDRParams{ServiceID: sid + 1, Path: Path{Local: p.a.addr, Remote: p.b.addr}})
	p.pump()
	if rep := p.a.take(t, EventSIDRReply); !errors.Is(rep.Err, mad.ErrRejected) || rep.SIDRREP.Status != mad.SIDRUnsupported {
		t.Fatalf("%v", rep.Err)
	}
	// No answer: timeout after the retries; a duplicate SIDR_REQ creates
	// no second request at B.
	p.filter = func(from *side, o *Outbound) []Outbound {
		if from == p.b {
			return nil
		}
		return []Outbound{*o}
	}
	_, _ = p.a.e.SIDRRequest(&SIDRParams{ServiceID: sid, Path: Path{Local: p.a.addr, Remote: p.b.addr}, MaxCMRetries: 2})
	p.pump()
	p.drain()
	if rep := p.a.take(t, EventSIDRReply); !errors.Is(rep.Err, ErrTimeout) {
		t.Fatalf("%v", rep.Err)
	}
	if n := len(p.b.events); n != 1 || p.b.e.Stats().Duplicates != 2 {
		t.Errorf("B saw %d requests, %d duplicates", n, p.b.e.Stats().Duplicates)
	}
	_ = p.b.e.Destroy(p.b.take(t, EventSIDRRequest).ID)
	p.pump()
	p.assertEmpty()
}

func TestLAPAnswered(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, bID := p.establish()
	m := make(mad.MAD, mad.Size)
	h := mad.CMHeader(mad.AttrLAP, 9)
	m.Encode(&h)
	m.LAP().Encode(&mad.LAPFields{LocalCommID: aID, RemoteCommID: bID, RemoteQPN: 0x22})
	_ = p.b.e.Receive(Path{Local: p.b.addr, Remote: p.a.addr}, m)
	o, ok := p.b.e.PollOutbound()
	if !ok {
		t.Fatal("no APR")
	}
	if a := mad.MAD(o.MAD[:]); a.AttrID() != mad.AttrAPR || a.APR().Status() != mad.APRUnsupported || a.TID() != 9 {
		t.Fatalf("%v %+v", a.AttrID(), a.APR().Fields())
	}
}

func TestDestroy(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	aID, _ := p.a.e.Connect(p.connectParams(testSID))
	p.pump()
	p.b.take(t, EventRequest)
	// Destroying a pending REQ sends REJ TIMEOUT with our GUID as ARI.
	if err := p.a.e.Destroy(aID); err != nil {
		t.Fatal(err)
	}
	p.pump()
	ev := p.b.take(t, EventRejected)
	var re *mad.RejectError
	if !errors.As(ev.Err, &re) || re.Reason != mad.RejTimeout || len(re.ARI) != 8 || re.ARI[7] != 0x01 {
		t.Fatalf("%+v", re)
	}
	p.assertEmpty()
	// Destroying an established connection disconnects it.
	aID, _ = p.establish()
	_ = p.a.e.Destroy(aID)
	p.pump()
	p.b.take(t, EventDisconnected)
	p.drain()
	p.assertEmpty()
}

func TestCallerErrors(t *testing.T) {
	p := newPair(t)
	cp := p.connectParams(testSID)
	cp.PrivateData = make([]byte, 93)
	if _, err := p.a.e.Connect(cp); !errors.Is(err, ErrInvalid) {
		t.Errorf("93 bytes of private data: %v", err)
	}
	cp = p.connectParams(testSID)
	cp.PathMTU = 9
	if _, err := p.a.e.Connect(cp); !errors.Is(err, ErrInvalid) {
		t.Errorf("MTU 9: %v", err)
	}
	if err := p.a.e.RTU(12345, nil); !errors.Is(err, ErrState) || err != errUnknownID {
		t.Errorf("RTU unknown: %v", err)
	}
	id, _ := p.a.e.Connect(p.connectParams(testSID))
	if err := p.a.e.RTU(id, nil); !errors.Is(err, ErrState) {
		t.Errorf("RTU before REP: %v", err)
	}
	if err := p.a.e.Disconnect(id, nil); !errors.Is(err, ErrState) {
		t.Errorf("disconnect before established: %v", err)
	}
	if _, _, err := p.a.e.QPAttr(id, roce.StateRTR); !errors.Is(err, ErrState) {
		t.Errorf("QPAttr in REQ_SENT: %v", err)
	}
	if err := p.a.e.Listen(1); err != nil {
		t.Fatal(err)
	}
	if err := p.a.e.Listen(1); !errors.Is(err, ErrListening) {
		t.Errorf("double listen: %v", err)
	}
	if _, err := NewEngine(Config{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty config: %v", err)
	}
}
