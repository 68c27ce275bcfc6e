package qp_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

func TestWCStatusStrings(t *testing.T) {
	want := map[qp.WCStatus]string{
		qp.WCSuccess:          "success",
		qp.WCLocLenErr:        "local length error",
		qp.WCLocProtErr:       "local protection error",
		qp.WCWRFlushErr:       "Work Request Flushed Error",
		qp.WCRemInvReqErr:     "remote invalid request error",
		qp.WCRemAccessErr:     "remote access error",
		qp.WCRemOpErr:         "remote operation error",
		qp.WCRetryExcErr:      "transport retry counter exceeded",
		qp.WCRNRRetryExcErr:   "RNR retry counter exceeded",
		qp.WCTMRndvIncomplete: "TM software rendezvous",
		qp.WCStatus(99):       "unknown",
	}
	for s, w := range want {
		if s.String() != w {
			t.Errorf("%d: %q, want %q", s, s.String(), w)
		}
	}
	if qp.WCRemAccessErr != 10 || qp.WCRetryExcErr != 12 || qp.WCRNRRetryExcErr != 13 || qp.WCWRFlushErr != 5 {
		t.Fatal("WCStatus values differ from ibv_wc_status")
	}
	if qp.WCRecv != 128 || qp.WCRecvRDMAWithImm != 129 || qp.WCFetchAdd != 4 {
		t.Fatal("WCOpcode values differ from ibv_wc_opcode")
	}
}

func newQP(t *testing.T, typ qp.QPType) *qp.QP {
	t.Helper()
	e, err := qp.New(qp.Config{Clock: &qptest.Clock{}})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := qptest.NewEndpoint(e, typ, 8)
	if err != nil {
		t.Fatal(err)
	}
	return ep.QP
}

func TestModifyValidation(t *testing.T) {
	initMask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags
	rtrMask := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRdAtomic | qp.AttrMinRNRTimer
	rtsMask := qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRdAtomic
	good := func() qp.QPAttr {
		return qp.QPAttr{Port: 1, PathMTU: ib.MTU1024, DestQPN: 0x20, RQPSN: 5, MaxDestRdAtomic: 4,
			MinRNRTimer: 12, SQPSN: 7, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}
	}
	step := func(q *qp.QP, s qp.QPState, mask qp.AttrMask, mod func(*qp.QPAttr)) error {
		a := good()
		a.State = s
		if mod != nil {
			mod(&a)
		}
		return q.Modify(&a, mask)
	}
	// A valid bring-up.
	q := newQP(t, qp.RC)
	for _, s := range []struct {
		st   qp.QPState
		mask qp.AttrMask
	}{{qp.StateInit, initMask}, {qp.StateRTR, rtrMask}, {qp.StateRTS, rtsMask}} {
		if err := step(q, s.st, s.mask, nil); err != nil {
			t.Fatalf("→%v: %v", s.st, err)
		}
	}
	if q.State() != qp.StateRTS || q.Attr().SQPSN != 7 || q.Attr().PathMTU != ib.MTU1024 {
		t.Fatalf("attr after bring-up %+v", q.Attr())
	}

	type bad struct {
		name string
		from []qp.QPState // path to the starting state
		to   qp.QPState
		mask qp.AttrMask
		mod  func(*qp.QPAttr)
		attr qp.AttrMask // the attribute the error must name
	}
	toInit := []qp.QPState{qp.StateInit}
	toRTR := []qp.QPState{qp.StateInit, qp.StateRTR}
	cases := []bad{
		{"reset-to-rtr", nil, qp.StateRTR, rtrMask, nil, qp.AttrState},
		{"init-missing-access", nil, qp.StateInit, initMask &^ qp.AttrAccessFlags, nil, qp.AttrAccessFlags},
		{"init-extra-qkey", nil, qp.StateInit, initMask | qp.AttrQKey, nil, qp.AttrQKey},
		{"pkey-index", nil, qp.StateInit, initMask, func(a *qp.QPAttr) { a.PKeyIndex = 1 }, qp.AttrPKeyIndex},
		{"port", nil, qp.StateInit, initMask, func(a *qp.QPAttr) { a.Port = 2 }, qp.AttrPort},
		{"mtu-0", toInit, qp.StateRTR, rtrMask, func(a *qp.QPAttr) { a.PathMTU = 0 }, qp.AttrPathMTU},
		{"mtu-6", toInit, qp.StateRTR, rtrMask, func(a *qp.QPAttr) { a.PathMTU = 6 }, qp.AttrPathMTU},
		{"rq-psn", toInit, qp.StateRTR, rtrMask, func(a *qp.QPAttr) { a.RQPSN = 1 << 24 }, qp.AttrRQPSN},
		{"min-rnr", toInit, qp.StateRTR, rtrMask, func(a *qp.QPAttr) { a.MinRNRTimer = 32 }, qp.AttrMinRNRTimer},
		{"dest-rd-atomic", toInit, qp.StateRTR, rtrMask, func(a *qp.QPAttr) { a.MaxDestRdAtomic = 200 }, qp.AttrMaxDestRdAtomic},
		{"rtr-missing-dest-qpn", toInit, qp.StateRTR, rtrMask &^ qp.AttrDestQPN, nil, qp.AttrDestQPN},
		{"rtr-extra-sq-psn", toInit, qp.StateRTR, rtrMask | qp.AttrSQPSN, nil, qp.AttrSQPSN},
		{"timeout-32", toRTR, qp.StateRTS, rtsMask, func(a *qp.QPAttr) { a.Timeout = 32 }, qp.AttrTimeout},
		{"retry-8", toRTR, qp.StateRTS, rtsMask, func(a *qp.QPAttr) { a.RetryCnt = 8 }, qp.AttrRetryCnt},
		{"rnr-retry-8", toRTR, qp.StateRTS, rtsMask, func(a *qp.QPAttr) { a.RNRRetry = 8 }, qp.AttrRNRRetry},
		{"sq-psn", toRTR, qp.StateRTS, rtsMask, func(a *qp.QPAttr) { a.SQPSN = 1 << 24 }, qp.AttrSQPSN},
		{"rd-atomic", toRTR, qp.StateRTS, rtsMask, func(a *qp.QPAttr) { a.MaxRdAtomic = 129 }, qp.AttrMaxQPRdAtomic},
		{"rts-missing-timeout", toRTR, qp.StateRTS, rtsMask &^ qp.AttrTimeout, nil, qp.AttrTimeout},
		{"cur-state-mismatch", toRTR, qp.StateRTS, rtsMask | qp.AttrCurState, func(a *qp.QPAttr) { a.CurState = qp.StateInit }, qp.AttrCurState},
	}
	masks := map[qp.QPState]qp.AttrMask{qp.StateInit: initMask, qp.StateRTR: rtrMask}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := newQP(t, qp.RC)
			for _, s := range c.from {
				if err := step(q, s, masks[s], nil); err != nil {
					t.Fatal(err)
				}
			}
			before := q.Attr()
			err := step(q, c.to, c.mask, c.mod)
			var ae *qp.AttrError
			if !errors.As(err, &ae) || !errors.Is(err, qp.ErrInvalidAttr) {
				t.Fatalf("got %v, want an *AttrError", err)
			}
			if ae.Attr&c.attr == 0 {
				t.Fatalf("error names %v, want %v: %v", ae.Attr, c.attr, err)
			}
			if q.Attr() != before {
				t.Fatal("a rejected Modify changed the QP")
			}
		})
	}
	// RTS→RTS may not change the timeout (not in the optional mask) but may
	// change min_rnr_timer; any state → ERR → RESET is always allowed.
	if err := step(q, qp.StateRTS, qp.AttrState|qp.AttrTimeout, nil); err == nil {
		t.Fatal("RTS→RTS with TIMEOUT accepted")
	}
	if err := step(q, qp.StateRTS, qp.AttrState|qp.AttrMinRNRTimer, func(a *qp.QPAttr) { a.MinRNRTimer = 3 }); err != nil {
		t.Fatal(err)
	}
	if err := step(q, qp.StateErr, qp.AttrState, nil); err != nil || q.State() != qp.StateErr {
		t.Fatal(err)
	}
	if err := step(q, qp.StateReset, qp.AttrState, nil); err != nil || q.State() != qp.StateReset {
		t.Fatal(err)
	}
	// UD needs a Q_Key for RESET→INIT and takes no access flags.
	u := newQP(t, qp.UD)
	if err := step(u, qp.StateInit, initMask, nil); err == nil {
		t.Fatal("UD RESET→INIT with ACCESS_FLAGS accepted")
	}
	if err := step(u, qp.StateInit, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey, nil); err != nil {
		t.Fatal(err)
	}
}

func TestUD(t *testing.T) {
	p := newPair(t, qp.UD, cleanNet, qptest.DefaultRC, 32)
	src := make([]byte, 8192)
	fill(src, 3)
	dst := make([]byte, 64*(4096+40))
	aMR := p.regMR(p.a, src, 0x1000, qp.AccessLocalWrite)
	bMR := p.regMR(p.b, dst, 0x100000, qp.AccessLocalWrite)
	ah, err := p.a.PD.CreateAH(qp.AddressVector{DGID: p.net.B.GID, SGID: p.net.A.GID, HopLimit: 64})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 100, 4095, 4096, 4097 /* too big: dropped, success */, 7}
	slot := 4096 + 40
	for i := range sizes {
		if err := p.b.QP.PostRecv(&qp.RecvWR{ID: uint64(100 + i), SGL: []qp.SGE{{Addr: 0x100000 + uint64(i*slot), Length: uint32(slot), LKey: bMR.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range sizes {
		wr := qp.SendWR{ID: uint64(i), Opcode: qp.WRSendWithImm, Imm: uint32(i), Flags: qp.SendSignaled, AH: ah,
			RemoteQPN: p.b.QP.QPN(), RemoteQKey: qptest.UDQKey, SGL: []qp.SGE{{Addr: 0x1000, Length: uint32(n), LKey: aMR.LKey()}}}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	// A wrong Q_Key is dropped at the receiver.
	bad := qp.SendWR{ID: 99, Opcode: qp.WRSend, Flags: qp.SendSignaled, AH: ah, RemoteQPN: p.b.QP.QPN(), RemoteQKey: 1}
	if err := p.a.QP.PostSend(&bad); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, p, p.a.SCQ, len(sizes)+1, time.Second)
	for i, wc := range wcs {
		if wc.Status != qp.WCSuccess {
			t.Fatalf("send completion %d: %+v", i, wc)
		}
	}
	var r []qp.WorkCompletion
	_ = p.net.Run(func() bool { r = pollAll(p.b.RCQ, r); return false }, time.Millisecond)
	if len(r) != len(sizes)-1 {
		t.Fatalf("%d receive completions, want %d: %+v", len(r), len(sizes)-1, r)
	}
	if got := p.net.RxErrors[qp.ErrBadQKey]; got != 1 {
		t.Fatalf("%d Q_Key drops, want 1", got)
	}
	j := 0
	for i, n := range sizes {
		if n > 4096 {
			continue
		}
		wc := r[j]
		if wc.WRID != uint64(100+j) || wc.ByteLen != uint32(40+n) || wc.SrcQP != p.a.QP.QPN() || wc.Imm != uint32(i) ||
			wc.Flags&(qp.WCWithGRH|qp.WCWithImm) != qp.WCWithGRH|qp.WCWithImm || wc.Opcode != qp.WCRecv {
			t.Fatalf("receive %d: %+v", j, wc)
		}
		b := dst[j*slot:]
		if !bytes.Equal(b[40:40+n], src[:n]) {
			t.Fatalf("receive %d: payload differs", j)
		}
		// GRH area: 20 zero bytes, then the IPv4 header with the sender's address.
		if !bytes.Equal(b[:20], make([]byte, 20)) || b[20] != 0x45 || !bytes.Equal(b[32:36], []byte{10, 0, 0, 1}) {
			t.Fatalf("receive %d: GRH area % x", j, b[:40])
		}
		j++
	}
}

func TestUC(t *testing.T) {
	for _, imp := range []impairment{cleanNet,
		{"loss10", faultnet.Config{Seed: 21, Loss: 0.1, Delay: time.Microsecond}, faultnet.Config{Delay: time.Microsecond}},
		{"reorder", faultnet.Config{Seed: 22, Reorder: 0.1, Delay: time.Microsecond}, faultnet.Config{Delay: time.Microsecond}},
	} {
		t.Run(imp.name, func(t *testing.T) {
			prm := qptest.DefaultRC
			prm.PSNA = 0xFFFFF0
			p := newPair(t, qp.UC, imp, prm, 64)
			const n = 40
			size := func(i int) int { return 1 + i*397 }
			src := make([]byte, 64*20000)
			fill(src, 9)
			dst := make([]byte, 64*20000)
			aMR := p.regMR(p.a, src, 0, qp.AccessLocalWrite)
			bMR := p.regMR(p.b, dst, 0, qp.AccessLocalWrite|qp.AccessRemoteWrite)
			for i := 0; i < n; i++ {
				if err := p.b.QP.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: uint64(i * 20000), Length: 20000, LKey: bMR.LKey()}}}); err != nil {
					t.Fatal(err)
				}
				wr := qp.SendWR{ID: uint64(i), Opcode: qp.WRSendWithImm, Imm: uint32(i), Flags: qp.SendSignaled,
					SGL: []qp.SGE{{Addr: uint64(i * 20000), Length: uint32(size(i)), LKey: aMR.LKey()}}}
				if err := p.a.QP.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
			wcs := waitWC(t, p, p.a.SCQ, n, time.Second)
			for i, wc := range wcs {
				expectStatus(t, wc, uint64(i), qp.WCSuccess)
			}
			var r []qp.WorkCompletion
			_ = p.net.Run(func() bool { r = pollAll(p.b.RCQ, r); return false }, time.Millisecond)
			if imp.name == "clean" && len(r) != n {
				t.Fatalf("%d of %d messages arrived on a clean link", len(r), n)
			}
			if imp.name == "loss10" && len(r) == n {
				t.Fatal("every message arrived despite 10% loss")
			}
			last := -1
			for k, wc := range r {
				m := int(wc.Imm)
				if wc.Status != qp.WCSuccess || m <= last || wc.ByteLen != uint32(size(m)) {
					t.Fatalf("receive %d: %+v", k, wc)
				}
				last = m
				buf := dst[int(wc.WRID)*20000:]
				if !bytes.Equal(buf[:size(m)], src[m*20000:m*20000+size(m)]) {
					t.Fatalf("message %d corrupted", m)
				}
			}
			t.Logf("%d of %d UC messages delivered", len(r), n)
		})
	}
}

func TestEngineClose(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 4)
	if err := p.net.A.E.Close(); err != nil {
		t.Fatal(err)
	}
	if p.net.A.E.QP(p.a.QP.QPN()) != nil || p.a.QP.PostSend(&qp.SendWR{Opcode: qp.WRSend}) == nil {
		t.Fatal("QP still usable after Close")
	}
	var pkt ib.Packet
	if err := p.net.A.E.Receive(&pkt, nil); !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("Receive after Close: %v", err)
	}
	if err := p.net.A.E.Close(); !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

func TestCQOverflowErrorsQP(t *testing.T) {
	n, _ := qptest.NewNet(qptest.Options{})
	a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 8)
	pd, _ := n.B.E.AllocPD()
	small, _ := n.B.E.CreateCQ(1)
	bq, _ := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: small, RecvCQ: small, Cap: qp.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err := n.Connect(a.QP, bq, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		bq.PostRecv(&qp.RecvWR{ID: uint64(i)})
		a.QP.PostSend(&qp.SendWR{ID: uint64(i), Opcode: qp.WRSend})
	}
	_ = n.Run(func() bool { return bq.State() == qp.StateErr }, time.Second)
	if bq.State() != qp.StateErr || small.Overflows() == 0 {
		t.Fatalf("state %v, overflows %d", bq.State(), small.Overflows())
	}
}

func TestObjectLifecycle(t *testing.T) {
	e, _ := qp.New(qp.Config{Clock: &qptest.Clock{}})
	pd, _ := e.AllocPD()
	cq, _ := e.CreateCQ(4)
	srq, _ := pd.CreateSRQ(qp.SRQAttr{MaxWR: 4, MaxSGE: 1})
	mr, _ := pd.RegMR(make([]byte, 16), 0x1000, qp.AccessLocalWrite)
	ah, _ := pd.CreateAH(qp.AddressVector{})
	q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: qp.QPCap{MaxSendWR: 2}})
	if err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"PD": pd.Close(), "CQ": cq.Close(), "SRQ": srq.Close()} {
		if !errors.Is(err, qp.ErrBusy) {
			t.Errorf("%s.Close while in use: %v", name, err)
		}
	}
	if _, err := pd.RegMR(make([]byte, 8), 0, qp.AccessRemoteWrite); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Errorf("remote write without local write accepted: %v", err)
	}
	if _, err := pd.RegMR(make([]byte, 16), ^uint64(0)-8, qp.AccessLocalWrite); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Errorf("MR wrapping the address space accepted: %v", err)
	}
	if _, err := e.CreateCQ(0); err == nil {
		t.Error("CQ of size 0 created")
	}
	if mr.IOVA() != 0x1000 || mr.Len() != 16 || mr.LKey() != mr.RKey() {
		t.Error("MR accessors")
	}
	// RESET QPs take no receives; an SRQ QP takes none at all.
	if err := q.PostRecv(&qp.RecvWR{}); err == nil {
		t.Error("PostRecv on an SRQ QP accepted")
	}
	if err := q.PostSend(&qp.SendWR{Opcode: qp.WRSend}); !errors.Is(err, qp.ErrInvalidState) {
		t.Errorf("PostSend in RESET: %v", err)
	}
	// Tear down in order.
	for _, step := range []func() error{q.Destroy, ah.Destroy, mr.Dereg, srq.Close, cq.Close, pd.Close} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Destroy(); !errors.Is(err, qp.ErrClosed) {
		t.Errorf("second Destroy: %v", err)
	}
	// Receives posted in ERR are flushed at once.
	ep, _ := qptest.NewEndpoint(e, qp.RC, 4)
	ep.QP.Modify(&qp.QPAttr{State: qp.StateErr}, qp.AttrState)
	if err := ep.QP.PostRecv(&qp.RecvWR{ID: 3}); err != nil {
		t.Fatal(err)
	}
	var wc [2]qp.WorkCompletion
	if n := ep.RCQ.Poll(wc[:]); n != 1 || wc[0].WRID != 3 || wc[0].Status != qp.WCWRFlushErr {
		t.Fatalf("flushed receive: %d %+v", n, wc[0])
	}
}
