package qp_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

const dcKey = 0x00000000ffeeddcc // cuObject's default dc_key, zero-extended

// dcFix is a set of DCIs on side A and DCTs on side B of one qptest.Net.
type dcFix struct {
	t    testing.TB
	net  *qptest.Net
	pd   *qp.PD
	scq  *qp.CQ
	ah   *qp.AH
	dcis []*qp.QP
	dcts []*qptest.DCTEndpoint
}

func newDCFix(t testing.TB, imp impairment, p qptest.RCParams, nDCI, nDCT, depth, maxInit int) *dcFix {
	t.Helper()
	n, err := qptest.NewNet(qptest.Options{AtoB: imp.ab, BtoA: imp.ba, PortMTU: ib.MTU4096})
	if err != nil {
		t.Fatal(err)
	}
	f := &dcFix{t: t, net: n}
	if f.pd, err = n.A.E.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if f.scq, err = n.A.E.CreateCQ(qp.MaxCQE); err != nil {
		t.Fatal(err)
	}
	if f.ah, err = f.pd.CreateAH(qp.AddressVector{DGID: n.B.GID, SGID: n.A.GID, HopLimit: 64}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nDCI; i++ {
		q, err := f.pd.CreateQP(&qp.QPInitAttr{Type: qp.DCI, SendCQ: f.scq, RecvCQ: f.scq,
			Cap: qp.QPCap{MaxSendWR: depth, MaxSendSGE: 2, MaxInlineData: 64}})
		if err != nil {
			t.Fatal(err)
		}
		if err := qptest.BringUpDCI(q, p, p.PSNA+uint32(i)*977&ib.PSNMask); err != nil {
			t.Fatal(err)
		}
		f.dcis = append(f.dcis, q)
	}
	for i := 0; i < nDCT; i++ {
		d, err := qptest.NewDCT(n.B.E, dcKey, 1024, maxInit)
		if err != nil {
			t.Fatal(err)
		}
		if err := qptest.BringUpDCT(d.QP, p); err != nil {
			t.Fatal(err)
		}
		f.dcts = append(f.dcts, d)
	}
	return f
}

var dcOps = []qp.WROpcode{qp.WRSend, qp.WRRDMAWrite, qp.WRSendWithImm, qp.WRRDMARead, qp.WRRDMAWriteWithImm,
	qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp}

// dcWorkload posts nMsg operations from every DCI, cycling through the DCTs
// and the opcodes, and checks every byte and completion.
type dcWorkload struct {
	f     *dcFix
	nMsg  int
	slot  int
	aSrc  []byte // per DCI × message
	aDst  []byte
	aMR   *qp.MR
	aDMR  *qp.MR
	bBuf  [][]byte // per DCT: WRITE/SEND destinations and READ sources
	bMR   []*qp.MR
	bAtom [][]byte
	bAMR  []*qp.MR
	bRecv [][]byte // per DCT: receive buffers, one slot per posted receive
	bRMR  []*qp.MR
	nRecv []int
	model [][]uint64 // atomic counter per DCT and DCI (DCIs race each other)
	orig  map[int]uint64
	step  func() // if set, called on every step of run (a hostile third party)
}

func (f *dcFix) workload(nMsg int) *dcWorkload {
	w := &dcWorkload{f: f, nMsg: nMsg, slot: 4096, orig: map[int]uint64{}}
	total := len(f.dcis) * nMsg * w.slot
	w.aSrc = make([]byte, total)
	w.aDst = make([]byte, total)
	fill(w.aSrc, 42)
	for k := 0; k < len(f.dcis)*nMsg; k++ {
		binary.BigEndian.PutUint32(w.aSrc[k*w.slot:], uint32(k))
	}
	var err error
	if w.aMR, err = f.pd.RegMR(w.aSrc, 0x10_0000_0000, qp.AccessLocalWrite); err != nil {
		f.t.Fatal(err)
	}
	if w.aDMR, err = f.pd.RegMR(w.aDst, 0x20_0000_0000, qp.AccessLocalWrite); err != nil {
		f.t.Fatal(err)
	}
	for j, d := range f.dcts {
		b := make([]byte, total)
		fill(b, uint64(j)+7)
		mr, err := d.PD.RegMR(b, 0x30_0000_0000, allAccess)
		if err != nil {
			f.t.Fatal(err)
		}
		a := make([]byte, 8*len(f.dcis))
		amr, err := d.PD.RegMR(a, 0x40_0000_0000, allAccess)
		if err != nil {
			f.t.Fatal(err)
		}
		w.bBuf, w.bMR, w.bAtom, w.bAMR = append(w.bBuf, b), append(w.bMR, mr), append(w.bAtom, a), append(w.bAMR, amr)
		w.model = append(w.model, make([]uint64, len(f.dcis)))
		r := make([]byte, total)
		rmr, err := d.PD.RegMR(r, 0x50_0000_0000, qp.AccessLocalWrite)
		if err != nil {
			f.t.Fatal(err)
		}
		w.bRecv, w.bRMR, w.nRecv = append(w.bRecv, r), append(w.bRMR, rmr), append(w.nRecv, 0)
	}
	return w
}

// size is message k's length; every message starts with its number, so a
// SEND found in any receive buffer of the shared SRQ can be checked.
func (w *dcWorkload) size(k int) int { return 4 + (k*733)%3000 }

// post posts message k (global index k = dci*nMsg + m) of DCI i.
func (w *dcWorkload) post(i, m int) error {
	f := w.f
	k := i*w.nMsg + m
	j := (m + i) % len(f.dcts)
	op := dcOps[(m+i)%len(dcOps)]
	d := f.dcts[j]
	off := uint64(k * w.slot)
	n := w.size(k)
	wr := qp.SendWR{ID: uint64(k), Opcode: op, Flags: qp.SendSignaled, Imm: uint32(k),
		SGL:        []qp.SGE{{Addr: 0x10_0000_0000 + off, Length: uint32(n), LKey: w.aMR.LKey()}},
		RemoteAddr: 0x30_0000_0000 + off, RKey: w.bMR[j].RKey(),
		AH: f.ah, RemoteQPN: d.QP.QPN(), DCKey: dcKey}
	switch op {
	case qp.WRSend, qp.WRSendWithImm, qp.WRRDMAWriteWithImm:
		// Post the send first: a full send queue must not leak receives.
		// The SRQ hands receives out in posting order, whichever DCI's
		// message arrives first: any slot must fit any message.
		if err := f.dcis[i].PostSend(&wr); err != nil {
			return err
		}
		r := w.nRecv[j]
		rwr := qp.RecvWR{ID: uint64(r), SGL: []qp.SGE{{Addr: 0x50_0000_0000 + uint64(r*w.slot), Length: uint32(w.slot), LKey: w.bRMR[j].LKey()}}}
		if err := d.SRQ.PostRecv(&rwr); err != nil {
			f.t.Fatal(err)
		}
		w.nRecv[j]++
		return nil
	case qp.WRRDMARead:
		wr.SGL[0] = qp.SGE{Addr: 0x20_0000_0000 + off, Length: uint32(n), LKey: w.aDMR.LKey()}
	case qp.WRAtomicFetchAndAdd, qp.WRAtomicCmpAndSwp:
		wr.SGL[0] = qp.SGE{Addr: 0x20_0000_0000 + off, Length: 8, LKey: w.aDMR.LKey()}
		wr.RemoteAddr, wr.RKey = 0x40_0000_0000+uint64(8*i), w.bAMR[j].RKey()
		mv := &w.model[j][i]
		w.orig[k] = *mv
		next := *mv + uint64(k)
		if op == qp.WRAtomicFetchAndAdd {
			wr.CompareAdd = uint64(k)
		} else {
			wr.CompareAdd, wr.Swap = *mv, *mv^0xABCD
			next = *mv ^ 0xABCD
		}
		if err := f.dcis[i].PostSend(&wr); err != nil {
			return err
		}
		*mv = next
		return nil
	}
	return f.dcis[i].PostSend(&wr)
}

// run posts everything (as send queue room allows) and waits for every
// completion; it returns the DCI completions by WR ID.
func (w *dcWorkload) run(limit time.Duration) {
	f := w.f
	t := f.t
	t.Helper()
	next := make([]int, len(f.dcis))
	got := map[uint64]qp.WorkCompletion{}
	var wc [64]qp.WorkCompletion
	recvs := 0
	wantRecvs := 0
	for i := range f.dcis {
		for m := 0; m < w.nMsg; m++ {
			switch dcOps[(m+i)%len(dcOps)] {
			case qp.WRSend, qp.WRSendWithImm, qp.WRRDMAWriteWithImm:
				wantRecvs++
			}
		}
	}
	recvWCs := make([][]qp.WorkCompletion, len(f.dcts))
	done := func() bool {
		if w.step != nil {
			w.step()
		}
		for {
			n := f.scq.Poll(wc[:])
			for _, c := range wc[:n] {
				if c.Status != qp.WCSuccess {
					t.Fatalf("DCI completion %d: %v", c.WRID, c.Status)
				}
				got[c.WRID] = c
			}
			if n < len(wc) {
				break
			}
		}
		recvs = 0
		for j, d := range f.dcts {
			recvWCs[j] = pollAll(d.CQ, recvWCs[j])
			recvs += len(recvWCs[j])
		}
		for i := range f.dcis {
			for next[i] < w.nMsg {
				if err := w.post(i, next[i]); err != nil {
					if err != qp.ErrQueueFull {
						t.Fatalf("DCI %d message %d: %v", i, next[i], err)
					}
					break
				}
				next[i]++
			}
		}
		return len(got) == len(f.dcis)*w.nMsg && recvs == wantRecvs
	}
	if err := f.net.Run(done, limit); err != nil {
		for i, q := range f.dcis {
			t.Logf("DCI %d: next %d %s", i, next[i], qp.DebugDC(q))
		}
		for j, d := range f.dcts {
			t.Logf("DCT %d: %d initiators, CQ %d %s", j, d.QP.DCTInitiators(), len(recvWCs[j]), qp.DebugDCT(d.QP))
			for _, c := range recvWCs[j] {
				if c.Status != qp.WCSuccess {
					t.Logf("  recv %d: %v", c.WRID, c.Status)
				}
			}
		}
		t.Fatalf("%v: %d/%d completions, %d/%d receives; A %+v; B %+v", err, len(got), len(f.dcis)*w.nMsg, recvs, wantRecvs,
			f.net.A.E.Stats(), f.net.B.E.Stats())
	}
	for j, wcs := range recvWCs {
		for _, c := range wcs {
			if c.Status != qp.WCSuccess {
				t.Fatalf("DCT receive %d: %v", c.WRID, c.Status)
			}
			if c.Opcode != qp.WCRecv {
				continue
			}
			b := w.bRecv[j][int(c.WRID)*w.slot:]
			k := int(binary.BigEndian.Uint32(b))
			if k >= len(f.dcis)*w.nMsg || int(c.ByteLen) != w.size(k) || !bytes.Equal(b[:c.ByteLen], w.aSrc[k*w.slot:k*w.slot+int(c.ByteLen)]) {
				t.Fatalf("DCT %d receive %d: message %d, %d bytes: data differs", j, c.WRID, k, c.ByteLen)
			}
		}
	}
	for k := 0; k < len(f.dcis)*w.nMsg; k++ {
		i, m := k/w.nMsg, k%w.nMsg
		j := (m + i) % len(f.dcts)
		op := dcOps[(m+i)%len(dcOps)]
		off := k * w.slot
		n := w.size(k)
		src := w.aSrc[off : off+n]
		switch op {
		case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm:
			if !bytes.Equal(w.bBuf[j][off:off+n], src) {
				t.Fatalf("message %d (%v to DCT %d): data differs", k, op, j)
			}
		case qp.WRRDMARead:
			if !bytes.Equal(w.aDst[off:off+n], w.bBuf[j][off:off+n]) {
				t.Fatalf("READ %d: data differs", k)
			}
		default:
			if v := binary.NativeEndian.Uint64(w.aDst[off:]); v != w.orig[k] {
				t.Fatalf("atomic %d (%v): original %#x, want %#x", k, op, v, w.orig[k])
			}
		}
	}
	for j := range f.dcts {
		for i := range f.dcis {
			if v := binary.NativeEndian.Uint64(w.bAtom[j][8*i:]); v != w.model[j][i] {
				t.Fatalf("DCT %d counter %d: %#x want %#x", j, i, v, w.model[j][i])
			}
		}
	}
}

func TestDCEveryOpcodeUnderImpairments(t *testing.T) {
	p := qptest.DefaultRC
	for _, imp := range impairments() {
		if imp.name == "slow" && testing.Short() {
			continue
		}
		t.Run(imp.name, func(t *testing.T) {
			f := newDCFix(t, imp, p, 2, 5, 32, 0)
			w := f.workload(70)
			w.run(time.Hour)
			s := f.net.A.E.Stats().DC
			if s.ConnectsSent == 0 || s.TargetSwitches == 0 {
				t.Fatalf("no connections? %+v", s)
			}
		})
	}
}

func TestDCPSNWrap(t *testing.T) {
	p := qptest.DefaultRC
	p.PSNA = ib.PSNMask - 20
	imp := impairment{"loss10", faultnet.Config{Seed: 31, Loss: 0.1, Delay: time.Microsecond},
		faultnet.Config{Seed: 32, Loss: 0.1, Delay: time.Microsecond}}
	f := newDCFix(t, imp, p, 1, 3, 16, 0)
	f.workload(60).run(time.Hour)
}

// A DCI switches targets with work in flight: every WR names the next DCT,
// so the DCI drains and reconnects for each one.
func TestDCISwitchesBetweenManyTargets(t *testing.T) {
	imp := impairment{"reorder", faultnet.Config{Seed: 41, Reorder: 0.1, ReorderDepth: 3, Loss: 0.02, Delay: time.Microsecond},
		faultnet.Config{Seed: 42, Duplicate: 0.05, Loss: 0.02, Delay: time.Microsecond}}
	f := newDCFix(t, imp, qptest.DefaultRC, 3, 40, 64, 0)
	f.workload(120).run(time.Hour)
	a, b := f.net.A.E.Stats().DC, f.net.B.E.Stats().DC
	if a.TargetSwitches < 100 || b.ConnectsRcvd < 100 {
		t.Fatalf("switches %d, connects received %d", a.TargetSwitches, b.ConnectsRcvd)
	}
	// Idle DCIs disconnect after DCILinger; the DCTs then hold no state.
	f.net.Clock.T += 2 * qp.DCILinger
	if err := f.net.Run(func() bool {
		for _, d := range f.dcts {
			if d.QP.DCTInitiators() != 0 {
				return false
			}
		}
		return true
	}, time.Second); err != nil && imp.ab.Loss == 0 {
		t.Fatal(err)
	}
	if f.net.A.E.Stats().DC.DisconnectsSent == 0 {
		t.Fatal("no DISCONNECT after idling")
	}
}

// dcSendOne posts one signalled SEND (or op) from dci to dct and runs until it
// completes; it returns the completion.
func (f *dcFix) sendOne(dci *qp.QP, dctn uint32, key uint64, op qp.WROpcode) qp.WorkCompletion {
	f.t.Helper()
	buf := make([]byte, 64)
	mr, err := f.pd.RegMR(buf, 0x9000, qp.AccessLocalWrite)
	if err != nil {
		f.t.Fatal(err)
	}
	wr := qp.SendWR{ID: 77, Opcode: op, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0x9000, Length: 8, LKey: mr.LKey()}},
		AH: f.ah, RemoteQPN: dctn, DCKey: key, RemoteAddr: 0x30_0000_0000, RKey: 1}
	if err := dci.PostSend(&wr); err != nil {
		f.t.Fatal(err)
	}
	var got []qp.WorkCompletion
	if err := f.net.Run(func() bool { got = pollAll(f.scq, got); return len(got) > 0 }, time.Hour); err != nil {
		f.t.Fatal(err)
	}
	return got[0]
}

func TestDCWrongKeyRefused(t *testing.T) {
	f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 8, 0)
	wc := f.sendOne(f.dcis[0], f.dcts[0].QP.QPN(), dcKey+1, qp.WRRDMAWrite)
	if wc.Status != qp.WCRemAccessErr {
		t.Fatalf("status %v", wc.Status)
	}
	if s := f.net.B.E.Stats().DC; s.BadKey != 1 || s.NAKsSent != 1 || f.dcts[0].QP.DCTInitiators() != 0 {
		t.Fatalf("%+v", s)
	}
	if f.dcis[0].State() != qp.StateErr {
		t.Fatalf("DCI state %v", f.dcis[0].State())
	}
}

func TestDCUnknownTarget(t *testing.T) {
	f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 8, 0)
	wc := f.sendOne(f.dcis[0], 0x7777, dcKey, qp.WRSend)
	if wc.Status != qp.WCRemInvReqErr {
		t.Fatalf("status %v", wc.Status)
	}
	if s := f.net.B.E.Stats().DC; s.UnknownTarget == 0 || s.NAKsSent == 0 {
		t.Fatalf("%+v", s)
	}
}

// A DCT that goes away with work in flight: the DCI's retry reconnects, the
// CONNECT meets no DCT and is NAKed, and the work fails instead of hanging.
func TestDCTargetGoesAway(t *testing.T) {
	p := qptest.DefaultRC
	p.Timeout = 8
	f := newDCFix(t, impairments()[0], p, 1, 2, 16, 0)
	w := f.workload(40)
	for m := 0; m < 16; m++ {
		if err := w.post(0, m); err != nil {
			t.Fatal(err)
		}
	}
	f.net.Step() // requests leave, nothing answered yet
	f.dcts[1].QP.Destroy()
	var got []qp.WorkCompletion
	if err := f.net.Run(func() bool { got = pollAll(f.scq, got); return len(got) == 16 }, time.Hour); err != nil {
		t.Fatalf("%v: %d completions", err, len(got))
	}
	bad := 0
	for _, c := range got {
		if c.Status != qp.WCSuccess {
			bad++
		}
	}
	if bad == 0 || f.dcis[0].State() != qp.StateErr {
		t.Fatalf("no failure reported: %d bad, state %v", bad, f.dcis[0].State())
	}
	// The DCI recovers through RESET like an RC QP and reaches the other DCT.
	if err := f.dcis[0].Modify(&qp.QPAttr{State: qp.StateReset}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qptest.BringUpDCI(f.dcis[0], p, 5); err != nil {
		t.Fatal(err)
	}
	if wc := f.sendOne(f.dcis[0], f.dcts[0].QP.QPN(), dcKey, qp.WRRDMAWrite); wc.Status != qp.WCRemAccessErr {
		// RKey 1 is no region: the DCT answers, which is what matters here.
		t.Fatalf("after reset: %v", wc.Status)
	}
}

// One DCT, many DCIs, a bound of 8 initiators: the DCT reclaims idle
// initiators and refuses (RNR) when all are busy, and everything completes.
func TestDCTBoundedInitiators(t *testing.T) {
	imp := impairment{"loss", faultnet.Config{Seed: 51, Loss: 0.05, Delay: time.Microsecond},
		faultnet.Config{Seed: 52, Loss: 0.05, Delay: time.Microsecond}}
	p := qptest.DefaultRC
	p.MinRNRTimer = 1
	f := newDCFix(t, imp, p, 40, 1, 8, 8)
	w := f.workload(10)
	w.run(time.Hour)
	if n := f.dcts[0].QP.DCTInitiators(); n > 8 {
		t.Fatalf("%d initiators held, bound 8", n)
	}
	s := f.net.B.E.Stats().DC
	if s.Reclaimed == 0 && s.NoResources == 0 && s.DisconnectsRcvd == 0 {
		t.Fatalf("bound never reached? %+v", s)
	}
}

// Hand-made bad packets: counters and NAKs, no panic, bounded state.
func TestDCBadInput(t *testing.T) {
	f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 8, 4)
	eb := f.net.B.E
	dct := f.dcts[0].QP.QPN()
	src := &qp.Source{SGID: f.net.A.GID, DGID: f.net.B.GID}
	pkt := func(op ib.Opcode, dest uint32, srcQP uint32, key uint64, flags uint8, payload int) *ib.Packet {
		info := ib.DCInfo(op)
		b := make([]byte, info.HeaderLen+payload+(-payload&3)+ib.ICRCSize)
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: dest, PSN: 100, PadCount: uint8(-payload & 3)})
		dcHeaders(b, key, srcQP, flags)
		var p ib.Packet
		if err := ib.ParseDCIB(b, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	// A request from an initiator that never connected.
	if err := eb.Receive(pkt(ib.DCSendOnly, dct, 0x99, dcKey, 0, 8), src); err == nil || eb.Stats().DC.UnknownInitiator != 1 {
		t.Fatalf("unknown initiator: %v %+v", err, eb.Stats().DC)
	}
	// A CONNECT without a target, and one with the wrong key: NAKed.
	if err := eb.Receive(pkt(ib.DCConnect, 0x4242, 0x99, dcKey, 0, 0), src); err == nil {
		t.Fatal("connect to nothing accepted")
	}
	if err := eb.Receive(pkt(ib.DCConnect, dct, 0x99, 1, 0, 0), src); err != qp.ErrBadDCKey {
		t.Fatalf("wrong key: %v", err)
	}
	// A DC packet decoded as RD (no DCETH) is a malformed header.
	b := make([]byte, 40)
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: ib.DCSendOnly, PKey: 0xFFFF, DestQP: dct})
	var rd ib.Packet
	if err := ib.ParseIB(b, &rd); err != nil {
		t.Fatal(err)
	}
	if err := eb.Receive(&rd, src); err != qp.ErrBadHeader || eb.Stats().DC.BadHeader != 1 {
		t.Fatalf("RD-decoded DC packet: %v", err)
	}
	// A flood of CONNECTs from distinct initiators with the right key: the
	// state stays within the bound, the rest is refused.
	for i := 0; i < 1000; i++ {
		_ = eb.Receive(pkt(ib.DCConnect, dct, uint32(0x1000+i), dcKey, 0, 0), src)
	}
	if n := f.dcts[0].QP.DCTInitiators(); n != 4 {
		t.Fatalf("%d initiators", n)
	}
	// A flood of CONNECTs to nothing: the NAK queue is bounded.
	for i := 0; i < 1000; i++ {
		_ = eb.Receive(pkt(ib.DCConnect, 0x4343, uint32(i), dcKey, 0, 0), src)
	}
	if s := eb.Stats().DC; s.NAKsDropped == 0 {
		t.Fatalf("%+v", s)
	}
	// A request with the wrong key from a connected initiator (one of the
	// flood's).
	if err := eb.Receive(pkt(ib.DCSendOnly, dct, 0x1000, dcKey^1, 0, 4), src); err != qp.ErrBadDCKey {
		t.Fatalf("request with a wrong key: %v", err)
	}
	// Responses and requests at the wrong end.
	ea := f.net.A.E
	dci := f.dcis[0].QPN()
	_ = ea.Receive(pkt(ib.DCSendOnly, dci, dct, 0, 0, 4), src)
	_ = eb.Receive(pkt(ib.DCAck, dct, dci, 0, 0, 0), src)
	// NAK flood at a DCI that sent nothing: dropped.
	for i := 0; i < 1000; i++ {
		p := pkt(ib.DCAck, dci, dct, 0, 0, 0)
		ib.AETH(p.AETH).Encode(&ib.AETHFields{Syndrome: ib.NAKSyndrome(ib.NAKPSNSequenceError)})
		_ = ea.Receive(p, src)
	}
	if f.dcis[0].State() != qp.StateRTS {
		t.Fatalf("DCI state %v", f.dcis[0].State())
	}
	// The engines still work.
	f.net.Run(func() bool { return !f.net.Step() }, time.Second)
	w := f.workload(7)
	w.run(time.Hour)
}

// DISCONNECTs without the DC key, or with a wrong one, naming a working
// DCI and each of its likely connection numbers, from its own address:
// the DCT drops and counts them, and the DCI's requests all find their
// initiator state (before the fix each released it between requests).
func TestDCKeylessDisconnectIgnored(t *testing.T) {
	f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 16, 0)
	eb := f.net.B.E
	dct, dci := f.dcts[0].QP.QPN(), f.dcis[0].QPN()
	src := &qp.Source{SGID: f.net.A.GID, DGID: f.net.B.GID}
	disconnect := func(key uint64, conn uint32) *ib.Packet {
		info := ib.DCInfo(ib.DCConnect)
		b := make([]byte, info.HeaderLen+ib.ICRCSize)
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: ib.DCConnect, PKey: 0xFFFF, DestQP: dct, PSN: 1})
		dcHeaders(b, key, dci, ib.DCCDisconnect)
		ib.DCCETH(b[info.Offset(ib.HdrDCCETH):]).Encode(&ib.DCCETHFields{Flags: ib.DCCDisconnect, DCI: dci, Conn: conn})
		var p ib.Packet
		if err := ib.ParseDCIB(b, &p); err != nil {
			t.Fatal(err)
		}
		return &p
	}
	sent := 0
	w := f.workload(60)
	w.step = func() {
		for conn := uint32(0); conn < 4; conn++ {
			for _, key := range []uint64{0, dcKey ^ 1} {
				if err := eb.Receive(disconnect(key, conn), src); err != qp.ErrBadDCKey {
					t.Fatalf("DISCONNECT with key %#x: %v", key, err)
				}
				sent++
			}
		}
	}
	w.run(time.Hour)
	s := eb.Stats().DC
	if s.BadKey != uint64(sent) || s.UnknownInitiator != 0 || s.NAKsSent != 0 {
		t.Fatalf("%d forged DISCONNECTs: %+v", sent, s)
	}
	t.Logf("%d forged DISCONNECTs dropped; DCT stats %+v", sent, s)
}

// A DCI flooded with sequence NAKs for its own work: bounded retries, and
// the work completes.
func TestDCINAKFlood(t *testing.T) {
	f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 16, 0)
	ea := f.net.A.E
	dci := f.dcis[0]
	flood := 0
	f.net.Tap = func(from string, b []byte) {
		if from != "B" || flood > 2000 {
			return
		}
		var p ib.Packet
		if ib.ParseDCIB(b, &p) != nil || p.BTH.Opcode() != ib.DCAck {
			return
		}
		c := append([]byte(nil), b...)
		var q ib.Packet
		_ = ib.ParseDCIB(c, &q)
		ib.AETH(q.AETH).Encode(&ib.AETHFields{Syndrome: ib.NAKSyndrome(ib.NAKPSNSequenceError), MSN: 0})
		for i := 0; i < 20; i++ {
			flood++
			src := qp.Source{SGID: f.net.B.GID, DGID: f.net.A.GID}
			_ = ea.Receive(&q, &src)
		}
	}
	f.workload(30).run(time.Hour)
	if dci.State() != qp.StateRTS {
		t.Fatal(dci.State())
	}
	_ = fmt.Sprint()
}

// dcHeaders fills the DC headers of the DC packet b (opcode already in its
// BTH): the key, the sender QPN (a DCI's; a DCT number on responses) and
// connection number 1.
func dcHeaders(b []byte, key uint64, srcQP uint32, flags uint8) {
	info := ib.DCInfo(ib.BTH(b).Opcode())
	if info.IsRequest {
		ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{Key: key})
	} else {
		ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{DCTN: srcQP})
	}
	if o := info.Offset(ib.HdrDCCETH); o > 0 {
		ib.DCCETH(b[o:]).Encode(&ib.DCCETHFields{Flags: flags, DCI: srcQP, Conn: 1})
	}
	if o := info.Offset(ib.HdrRDETH); o > 0 {
		ib.RDETH(b[o:]).Encode(&ib.RDETHFields{EEC: 1})
	}
	if o := info.Offset(ib.HdrDETH); o > 0 {
		ib.DETH(b[o:]).Encode(&ib.DETHFields{SrcQP: srcQP})
	}
}

// A retry the last ACK overtook (the timer fired, then the ACK came before
// the resend left) must not outlive what it was for. Before the fix it
// took the DCI's next request out under the current connection: after the
// idle DCI's DISCONNECT, under the old connection number with no CONNECT,
// to a DCT that had dropped the initiator, resent for ever (retry_cnt 7);
// or, when the next request was for another DCT, to the old one.
func TestDCIRetryOvertakenByACK(t *testing.T) {
	for _, c := range []struct {
		name   string
		linger bool // the DCI disconnects before the next request
		next   int  // the DCT of the next request
	}{{"then disconnect", true, 0}, {"then another target", false, 1}} {
		t.Run(c.name, func(t *testing.T) {
			f := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 2, 8, 0)
			dci := f.dcis[0]
			mr, err := f.pd.RegMR([]byte("retried"), 0x9000, qp.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			var dst [2][]byte
			var rkey [2]uint32
			for i := range dst {
				dst[i] = make([]byte, 8)
				m, err := f.dcts[i].PD.RegMR(dst[i], 0x5000, qp.AccessLocalWrite|qp.AccessRemoteWrite)
				if err != nil {
					t.Fatal(err)
				}
				rkey[i] = m.RKey()
			}
			post := func(id uint64, to int) {
				t.Helper()
				wr := qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0x9000, Length: 7, LKey: mr.LKey()}},
					AH: f.ah, RemoteQPN: f.dcts[to].QP.QPN(), DCKey: dcKey, RemoteAddr: 0x5000, RKey: rkey[to]}
				if err := dci.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
			// Hold the DCT's ACK of the first WRITE.
			var ack []byte
			f.net.Drop = func(from string, b []byte) bool {
				if from == "B" && ack == nil {
					ack = append([]byte(nil), b...)
					return true
				}
				return false
			}
			post(1, 0)
			if err := f.net.Run(func() bool { return ack != nil }, time.Second); err != nil {
				t.Fatal(err)
			}
			// The retransmit timer fires; the ACK arrives before the resend leaves.
			f.net.Clock.T += time.Second
			f.net.A.E.Advance(f.net.Clock.T)
			var pkt ib.Packet
			if err := ib.ParseDCIB(ack, &pkt); err != nil {
				t.Fatal(err)
			}
			if err := f.net.A.E.Receive(&pkt, &qp.Source{SGID: f.net.B.GID, DGID: f.net.A.GID}); err != nil {
				t.Fatal(err)
			}
			var got []qp.WorkCompletion
			if got = pollAll(f.scq, got); len(got) != 1 || got[0].Status != qp.WCSuccess {
				t.Fatalf("first WRITE: %+v", got)
			}
			if c.linger {
				// Idle past its linger, the DCI decides to disconnect; the
				// next request comes before the DISCONNECT leaves.
				f.net.Clock.T += 2 * qp.DCILinger
				f.net.A.E.Advance(f.net.Clock.T)
			}
			clear(dst[c.next])
			post(2, c.next)
			if err := f.net.Run(func() bool { got = pollAll(f.scq, got); return len(got) == 2 }, 10*time.Second); err != nil {
				t.Fatalf("second WRITE: %v; DCT side %+v", err, f.net.B.E.Stats().DC)
			}
			if got[1].Status != qp.WCSuccess || string(dst[c.next][:7]) != "retried" {
				t.Fatalf("second WRITE: %v, DCT %d holds %q", got[1].Status, c.next, dst[c.next])
			}
			if s := f.net.B.E.Stats().DC; s.UnknownInitiator != 0 || s.Stale != 0 {
				t.Errorf("DCT side saw requests of an initiator it had dropped or of an old connection: %+v", s)
			}
		})
	}
}
