package qp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// responderRig is a single RC QP fed with hand-made request packets.
type responderRig struct {
	t     *testing.T
	e     *qp.Engine
	ep    *qptest.Endpoint
	mem   []byte
	mr    *qp.MR
	slots []qp.TxPacket
}

const rigPSN = 0xFFFFFE

func newResponderRig(t *testing.T) *responderRig {
	e, _ := qp.New(qp.Config{Clock: &qptest.Clock{}})
	ep, err := qptest.NewEndpoint(e, qp.RC, 16)
	if err != nil {
		t.Fatal(err)
	}
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU256
	if err := qptest.BringUp(ep.QP, 0x99, prm, 0, rigPSN, ib.GID{}, ib.GID{}); err != nil {
		t.Fatal(err)
	}
	r := &responderRig{t: t, e: e, ep: ep, mem: make([]byte, 4096)}
	fill(r.mem, 77)
	r.mr, err = qp.RegMRWithKey(ep.PD, r.mem, 0x10000, allAccess, 0x4242)
	if err != nil {
		t.Fatal(err)
	}
	r.slots = make([]qp.TxPacket, 32)
	for i := range r.slots {
		r.slots[i] = qp.TxPacket{Buf: make([]byte, 2048), Headroom: 0}
	}
	return r
}

func (r *responderRig) req(op ib.Opcode, psn uint32, ext []byte, payload []byte, ackReq bool) []ib.Packet {
	r.t.Helper()
	b := make([]byte, ib.BTHSize)
	pc := (-len(payload)) & 3
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: r.ep.QP.QPN(), PSN: ib.PSN(psn), AckReq: ackReq, PadCount: uint8(pc)})
	b = append(append(append(b, ext...), payload...), make([]byte, pc+4)...)
	var p ib.Packet
	if err := ib.ParseIB(b, &p); err != nil {
		r.t.Fatal(err)
	}
	r.e.Receive(&p, &qp.Source{})
	var out []ib.Packet
	n := r.e.Transmit(r.slots)
	for i := 0; i < n; i++ {
		var o ib.Packet
		if err := ib.ParseIB(append([]byte(nil), r.slots[i].Payload()...), &o); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

func rethBytes(va uint64, key, n uint32) []byte {
	b := make([]byte, 16)
	ib.RETH(b).Encode(&ib.RETHFields{VA: va, RKey: key, DMALen: n})
	return b
}

func TestDuplicateRequests(t *testing.T) {
	r := newResponderRig(t)
	p0 := uint32(rigPSN)
	// READ of 1000 bytes at mtu 256: 4 responses, PSNs p0..p0+3 (wrapping).
	out := r.req(ib.RCReadRequest, p0, rethBytes(0x10000+100, 0x4242, 1000), nil, true)
	if len(out) != 4 || out[0].BTH.Opcode() != ib.RCReadResponseFirst || out[3].BTH.Opcode() != ib.RCReadResponseLast {
		t.Fatalf("read responses %d", len(out))
	}
	// The requester lost responses 2 and 3 and re-reads from PSN p0+2 for the rest.
	re := r.req(ib.RCReadRequest, uint32(ib.PSN(p0).Add(2)), rethBytes(0x10000+100+512, 0x4242, 488), nil, true)
	if len(re) != 2 || re[0].BTH.Opcode() != ib.RCReadResponseMiddle || re[1].BTH.Opcode() != ib.RCReadResponseLast ||
		re[0].BTH.PSN() != ib.PSN(p0).Add(2) || re[0].AETH != nil || re[1].AETH == nil {
		t.Fatalf("replayed read: %d packets, first %v psn %#x", len(re), re[0].BTH.Opcode(), re[0].BTH.PSN())
	}
	if !bytes.Equal(append(re[0].Payload, re[1].Payload...), r.mem[100+512:1100]) {
		t.Fatal("replayed read data differs")
	}
	// A re-read outside the original range, or with another key, is ignored.
	if o := r.req(ib.RCReadRequest, uint32(ib.PSN(p0).Add(1)), rethBytes(0x10000+100+256, 0x4242, 2000), nil, true); len(o) != 0 {
		t.Fatal("re-read beyond the original range answered")
	}
	// FETCH_ADD at p0+4, then its duplicate: the same original, executed once.
	atom := make([]byte, 28)
	ib.AtomicETH(atom).Encode(&ib.AtomicETHFields{VA: 0x10000 + 8, RKey: 0x4242, SwapAdd: 5})
	before := binary.NativeEndian.Uint64(r.mem[8:])
	a1 := r.req(ib.RCFetchAdd, uint32(ib.PSN(p0).Add(4)), atom, nil, true)
	a2 := r.req(ib.RCFetchAdd, uint32(ib.PSN(p0).Add(4)), atom, nil, true)
	if len(a1) != 1 || len(a2) != 1 || a1[0].AtomicAckETH.Orig() != before || a2[0].AtomicAckETH.Orig() != before {
		t.Fatalf("atomic replies %d/%d", len(a1), len(a2))
	}
	if got := binary.NativeEndian.Uint64(r.mem[8:]); got != before+5 {
		t.Fatalf("counter %d, want %d: the duplicate ran again", got, before+5)
	}
	// WRITE at p0+5; its duplicate gets an ACK for ePSN−1 and is not executed again.
	w := r.req(ib.RCWriteOnly, uint32(ib.PSN(p0).Add(5)), rethBytes(0x10000+2000, 0x4242, 4), []byte{1, 2, 3, 4}, true)
	copy(r.mem[2000:], []byte{9, 9, 9, 9})
	d := r.req(ib.RCWriteOnly, uint32(ib.PSN(p0).Add(5)), rethBytes(0x10000+2000, 0x4242, 4), []byte{1, 2, 3, 4}, false)
	if len(w) != 1 || len(d) != 1 || d[0].BTH.PSN() != ib.PSN(p0).Add(5) || d[0].AETH.Syndrome() != ib.SyndromeACKUnlimited {
		t.Fatalf("write ACK %d, duplicate ACK %d", len(w), len(d))
	}
	if !bytes.Equal(r.mem[2000:2004], []byte{9, 9, 9, 9}) {
		t.Fatal("duplicate WRITE re-executed")
	}
	// MSN: one READ, one atomic, one WRITE.
	if d[0].AETH.MSN() != 3 {
		t.Fatalf("MSN %d, want 3", d[0].AETH.MSN())
	}
	// A gap: one NAK, then silence until the expected PSN arrives.
	g1 := r.req(ib.RCWriteOnly, uint32(ib.PSN(p0).Add(8)), rethBytes(0x10000, 0x4242, 4), []byte{1, 2, 3, 4}, true)
	g2 := r.req(ib.RCWriteOnly, uint32(ib.PSN(p0).Add(9)), rethBytes(0x10000, 0x4242, 4), []byte{1, 2, 3, 4}, true)
	if len(g1) != 1 || g1[0].AETH.Syndrome() != ib.NAKSyndrome(ib.NAKPSNSequenceError) || g1[0].BTH.PSN() != ib.PSN(p0).Add(6) || len(g2) != 0 {
		t.Fatalf("gap: %d then %d packets", len(g1), len(g2))
	}
	// SEND without a posted receive: RNR NAK carrying min_rnr_timer, PSN of the SEND.
	s := r.req(ib.RCSendOnly, uint32(ib.PSN(p0).Add(6)), nil, []byte{1}, true)
	if len(s) != 1 || s[0].AETH.Syndrome() != ib.RNRNAKSyndrome(12) || s[0].BTH.PSN() != ib.PSN(p0).Add(6) {
		t.Fatalf("RNR: %+v", s)
	}
	if r.ep.QP.State() != qp.StateRTS {
		t.Fatalf("state %v", r.ep.QP.State())
	}
}

func TestDuplicateAtomicWrite(t *testing.T) {
	r := newResponderRig(t)
	val := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	a1 := r.req(ib.RCAtomicWrite, rigPSN, rethBytes(0x10000+64, 0x4242, 8), val, true)
	if len(a1) != 1 || a1[0].BTH.Opcode() != ib.RCReadResponseOnly || len(a1[0].Payload) != 0 || a1[0].AETH.MSN() != 1 ||
		a1[0].BTH.PSN() != rigPSN || !bytes.Equal(r.mem[64:72], val) {
		t.Fatalf("ATOMIC_WRITE answer %+v", a1)
	}
	copy(r.mem[64:], []byte{9, 9, 9, 9, 9, 9, 9, 9})
	a2 := r.req(ib.RCAtomicWrite, rigPSN, rethBytes(0x10000+64, 0x4242, 8), val, true)
	if len(a2) != 1 || a2[0].BTH.Opcode() != ib.RCReadResponseOnly || a2[0].BTH.PSN() != rigPSN {
		t.Fatalf("replayed answer %+v", a2)
	}
	if r.mem[64] != 9 {
		t.Fatal("duplicate ATOMIC_WRITE executed again")
	}
	// Misaligned: NAK invalid request.
	m := r.req(ib.RCAtomicWrite, uint32(ib.PSN(rigPSN).Next()), rethBytes(0x10000+66, 0x4242, 8), val, true)
	if len(m) != 1 || m[0].AETH.Syndrome() != ib.NAKSyndrome(ib.NAKInvalidRequest) {
		t.Fatalf("misaligned ATOMIC_WRITE: %+v", m)
	}
}

func TestReceiveDropReasons(t *testing.T) {
	r := newResponderRig(t)
	mk := func(op ib.Opcode, qpn uint32, pkey uint16, tver uint8) *ib.Packet {
		b := make([]byte, ib.BTHSize+4)
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: pkey, DestQP: qpn, PSN: rigPSN})
		var p ib.Packet
		if err := ib.ParseIB(b, &p); err != nil {
			t.Fatal(err)
		}
		// ib.ParseIB rejects a non-zero TVer itself; set it afterwards to
		// check that the engine does not rely on that.
		p.BTH.SetTVer(tver)
		return &p
	}
	q := r.ep.QP.QPN()
	for _, c := range []struct {
		p    *ib.Packet
		want error
	}{
		{mk(ib.RCSendOnly, q+100, 0xFFFF, 0), qp.ErrUnknownQP},
		{mk(ib.UCSendOnly, q, 0xFFFF, 0), qp.ErrWrongTransport},
		{mk(ib.RCSendOnly, q, 0x1234, 0), qp.ErrBadPKey},
		{mk(ib.RCSendOnly, q, 0x0000, 0), qp.ErrBadPKey},
		{mk(ib.RCSendOnly, q, 0xFFFF, 1), qp.ErrBadHeader},
	} {
		if err := r.e.Receive(c.p, nil); !errors.Is(err, c.want) {
			t.Errorf("%v to %#x pkey %#x: %v, want %v", c.p.BTH.Opcode(), c.p.BTH.DestQP(), c.p.BTH.PKey(), err, c.want)
		}
	}
	// The limited-member P_Key 0x7FFF is accepted (it matches our full 0xFFFF).
	if err := r.e.Receive(mk(ib.RCSendOnly, q, 0x7FFF, 0), nil); errors.Is(err, qp.ErrBadPKey) {
		t.Fatal("P_Key 0x7FFF rejected")
	}
	// A QP not yet in RTR drops requests.
	ep, _ := qptest.NewEndpoint(r.e, qp.RC, 4)
	if err := r.e.Receive(mk(ib.RCSendOnly, ep.QP.QPN(), 0xFFFF, 0), nil); !errors.Is(err, qp.ErrNotReady) {
		t.Fatalf("RESET QP: %v", err)
	}
}

// TestAckOvertakesRetry: after a NAK rewinds the requester, an ACK covering
// everything arrives before the retransmission goes out. The requester must
// complete the work and send nothing more.
func TestAckOvertakesRetry(t *testing.T) {
	e, _ := qp.New(qp.Config{Clock: &qptest.Clock{}})
	ep, _ := qptest.NewEndpoint(e, qp.RC, 8)
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU256
	if err := qptest.BringUp(ep.QP, 0x99, prm, 0xFFFFFF, 0, ib.GID{}, ib.GID{}); err != nil {
		t.Fatal(err)
	}
	mr, _ := ep.PD.RegMR(make([]byte, 1024), 0, qp.AccessLocalWrite)
	ep.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Length: 600, LKey: mr.LKey()}}})
	ep.QP.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Length: 10, LKey: mr.LKey()}}})
	slots := make([]qp.TxPacket, 8)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 1024)}
	}
	if n := e.Transmit(slots); n != 4 {
		t.Fatalf("sent %d packets, want 4", n)
	}
	ack := func(syn ib.Syndrome, psn ib.PSN) {
		b := make([]byte, ib.BTHSize+ib.AETHSize+4)
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: ib.RCAck, PKey: 0xFFFF, DestQP: ep.QP.QPN(), PSN: psn})
		ib.AETH(b[ib.BTHSize:]).Encode(&ib.AETHFields{Syndrome: syn, MSN: 1})
		var p ib.Packet
		if err := ib.ParseIB(b, &p); err != nil {
			t.Fatal(err)
		}
		if err := e.Receive(&p, nil); err != nil {
			t.Fatal(err)
		}
	}
	first := ib.PSN(0xFFFFFF)
	ack(ib.NAKSyndrome(ib.NAKPSNSequenceError), first.Add(1)) // rewinds to PSN first+1
	ack(ib.SyndromeACKUnlimited, first.Add(3))                // but everything arrived
	if n := e.Transmit(slots); n != 0 {
		t.Fatalf("sent %d packets after everything was acknowledged", n)
	}
	var wc [4]qp.WorkCompletion
	if n := ep.SCQ.Poll(wc[:]); n != 2 || wc[0].WRID != 1 || wc[1].WRID != 2 || wc[1].Status != qp.WCSuccess {
		t.Fatalf("completions %d %+v", n, wc[:n])
	}
	// Partially overtaken: a new message, NAK at its second packet, then an
	// ACK for its second packet: the retransmission resumes at the third.
	ep.QP.PostSend(&qp.SendWR{ID: 3, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Length: 1000, LKey: mr.LKey()}}})
	if n := e.Transmit(slots); n != 4 {
		t.Fatalf("sent %d packets, want 4", n)
	}
	ack(ib.NAKSyndrome(ib.NAKPSNSequenceError), first.Add(5))
	ack(ib.SyndromeACKUnlimited, first.Add(5))
	n := e.Transmit(slots)
	var p ib.Packet
	if n != 2 || ib.ParseIB(slots[0].Payload(), &p) != nil || p.BTH.PSN() != first.Add(6) || p.BTH.Opcode() != ib.RCSendMiddle {
		t.Fatalf("resent %d packets, first %v psn %#x", n, p.BTH.Opcode(), p.BTH.PSN())
	}
}

func TestFlush(t *testing.T) {
	r := newResponderRig(t)
	fmr, err := r.ep.PD.RegMR(make([]byte, 256), 0x70000, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessFlushGlobal)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ep.PD.RegMR(make([]byte, 8), 0, qp.AccessFlushPersistent); !errors.Is(err, qp.ErrOpNotSupported) {
		t.Fatalf("persistent flush access: %v", err)
	}
	feth := func(plt, sel uint8) []byte {
		b := make([]byte, 4)
		ib.FETH(b).Encode(&ib.FETHFields{Placement: plt, Selectivity: sel})
		return b
	}
	psn := ib.PSN(rigPSN)
	f1 := r.req(ib.RCFlush, uint32(psn), append(feth(1, 0), rethBytes(0x70000, fmr.RKey(), 256)...), nil, true)
	if len(f1) != 1 || f1[0].BTH.Opcode() != ib.RCReadResponseOnly || f1[0].BTH.PSN() != psn || len(f1[0].Payload) != 0 ||
		f1[0].AETH.Syndrome() != ib.SyndromeACKUnlimited {
		t.Fatalf("FLUSH answer %+v", f1)
	}
	// Whole-MR selectivity ignores the range; a duplicate is answered again.
	f2 := r.req(ib.RCFlush, uint32(psn.Next()), append(feth(1, 1), rethBytes(0, fmr.RKey(), 0)...), nil, true)
	f3 := r.req(ib.RCFlush, uint32(psn.Next()), append(feth(1, 1), rethBytes(0, fmr.RKey(), 0)...), nil, true)
	if len(f2) != 1 || len(f3) != 1 || f3[0].BTH.PSN() != psn.Next() || f3[0].BTH.Opcode() != ib.RCReadResponseOnly {
		t.Fatalf("whole-MR FLUSH %d, replay %d", len(f2), len(f3))
	}
	// A region without flush access: remote access error.
	f4 := r.req(ib.RCFlush, uint32(psn.Add(2)), append(feth(1, 0), rethBytes(0x10000, 0x4242, 8)...), nil, true)
	if len(f4) != 1 || f4[0].BTH.Opcode() != ib.RCAck || f4[0].AETH.Syndrome() != ib.NAKSyndrome(ib.NAKRemoteAccessError) {
		t.Fatalf("FLUSH without access %+v", f4)
	}
}
