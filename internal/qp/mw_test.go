package qp_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// The window tests bind at B a window over part of a region that itself
// grants no remote access, and reach it from A.
const (
	mwBase   = 0x4000_0000 // B's region
	mwSize   = 4096
	mwOff    = 512 // the window: [mwBase+mwOff, mwBase+mwOff+mwLen)
	mwLen    = 1024
	mwAccess = qp.AccessRemoteRead | qp.AccessRemoteWrite | qp.AccessRemoteAtomic
)

type mwFixture struct {
	*pair
	aBuf, bBuf []byte
	aMR, bMR   *qp.MR
	mw         *qp.MW
}

// newMWFixture connects A and B and registers the regions; the window is
// allocated but not bound.
func newMWFixture(t *testing.T, typ qp.MWType) *mwFixture {
	t.Helper()
	f := &mwFixture{pair: newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 8)}
	f.aBuf, f.bBuf = make([]byte, mwSize), make([]byte, mwSize)
	f.aMR = f.regMR(f.a, f.aBuf, 0x1000, qp.AccessLocalWrite)
	f.bMR = f.regMR(f.b, f.bBuf, mwBase, qp.AccessLocalWrite|qp.AccessMWBind)
	mw, err := f.b.PD.AllocMW(typ)
	if err != nil {
		t.Fatal(err)
	}
	f.mw = mw
	return f
}

// bind2 binds the type 2 window through B's QP and returns the new R_Key.
func (f *mwFixture) bind2(t *testing.T, q *qp.QP, cq *qp.CQ, addr, length uint64, acc qp.Access) uint32 {
	t.Helper()
	key := f.mw.RKey()&^0xFF | (f.mw.RKey()+1)&0xFF
	wr := qp.SendWR{ID: 77, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, MW: f.mw, RKey: key,
		Bind: qp.MWBindInfo{MR: f.bMR, Addr: addr, Length: length, Access: acc}}
	if err := q.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, f.pair, cq, 1, time.Second)[0]
	expectStatus(t, wc, 77, qp.WCSuccess)
	if wc.Opcode != qp.WCBindMW {
		t.Fatalf("bind completion opcode %v", wc.Opcode)
	}
	if f.mw.RKey() != key || !f.mw.Bound() {
		t.Fatalf("window key %#x bound %v after bind, want %#x", f.mw.RKey(), f.mw.Bound(), key)
	}
	return key
}

// access runs one READ or WRITE of n bytes at addr from A and returns its
// completion.
func (f *mwFixture) access(t *testing.T, op qp.WROpcode, addr uint64, n uint32, rkey uint32) qp.WorkCompletion {
	t.Helper()
	wr := qp.SendWR{ID: 9, Opcode: op, Flags: qp.SendSignaled, RemoteAddr: addr, RKey: rkey,
		SGL: []qp.SGE{{Addr: 0x1000, Length: n, LKey: f.aMR.LKey()}}}
	if err := f.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	return waitWC(t, f.pair, f.a.SCQ, 1, time.Second)[0]
}

// refused checks that an access was answered with a remote access error
// and counted at B.
func (f *mwFixture) refused(t *testing.T, wc qp.WorkCompletion, before uint64) {
	t.Helper()
	expectStatus(t, wc, 9, qp.WCRemAccessErr)
	if got := f.net.B.E.Stats().RKeyViolations; got != before+1 {
		t.Fatalf("B RKeyViolations %d, want %d", got, before+1)
	}
}

func TestMWType2ReadWriteInRange(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	fill(f.aBuf, 1)
	want := append([]byte(nil), f.aBuf[:mwLen]...)
	expectStatus(t, f.access(t, qp.WRRDMAWrite, mwBase+mwOff, mwLen, key), 9, qp.WCSuccess)
	if !bytes.Equal(f.bBuf[mwOff:mwOff+mwLen], want) {
		t.Fatal("WRITE through the window did not land in its range")
	}
	if f.bBuf[mwOff-1] != 0 || f.bBuf[mwOff+mwLen] != 0 {
		t.Fatal("WRITE through the window touched bytes outside it")
	}
	fill(f.bBuf, 2)
	clear(f.aBuf)
	expectStatus(t, f.access(t, qp.WRRDMARead, mwBase+mwOff+100, 200, key), 9, qp.WCSuccess)
	if !bytes.Equal(f.aBuf[:200], f.bBuf[mwOff+100:mwOff+300]) {
		t.Fatal("READ through the window returned wrong data")
	}
	if n := f.net.B.E.Stats().RKeyViolations; n != 0 {
		t.Fatalf("RKeyViolations %d", n)
	}
	// The region's own key grants nothing remote.
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, f.bMR.RKey()), 0)
}

func TestMWOutOfRange(t *testing.T) {
	for _, c := range []struct {
		name string
		op   qp.WROpcode
		addr uint64
		n    uint32
	}{
		{"write-past-end", qp.WRRDMAWrite, mwBase + mwOff + mwLen - 8, 16},
		{"write-before-start", qp.WRRDMAWrite, mwBase + mwOff - 1, 8},
		{"read-past-end", qp.WRRDMARead, mwBase + mwOff + 1, mwLen},
		{"read-in-region-outside-window", qp.WRRDMARead, mwBase, 8},
		{"read-wrapping", qp.WRRDMARead, ^uint64(0) - 3, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newMWFixture(t, qp.MWType2)
			key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
			f.refused(t, f.access(t, c.op, c.addr, c.n, key), 0)
		})
	}
	t.Run("access-not-granted", func(t *testing.T) {
		f := newMWFixture(t, qp.MWType2)
		key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, qp.AccessRemoteRead)
		f.refused(t, f.access(t, qp.WRRDMAWrite, mwBase+mwOff, 8, key), 0)
	})
	t.Run("stale-consumer-key", func(t *testing.T) {
		f := newMWFixture(t, qp.MWType2)
		key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
		f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key^1), 0)
	})
}

func TestMWLocalInvalidate(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	expectStatus(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key), 9, qp.WCSuccess)
	if err := f.b.QP.PostSend(&qp.SendWR{ID: 5, Opcode: qp.WRLocalInv, Flags: qp.SendSignaled, InvalidateRKey: key}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0]
	expectStatus(t, wc, 5, qp.WCSuccess)
	if wc.Opcode != qp.WCLocalInv || f.mw.Bound() {
		t.Fatalf("LOCAL_INV completion %+v, window bound %v", wc, f.mw.Bound())
	}
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key), 0)
}

// TestMWRebindAfterInvalidate: an invalidated type 2 window is free again
// and can be bound elsewhere under a new key; the old key stays dead.
func TestMWRebindAfterInvalidate(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	old := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	// A bound type 2 window cannot be bound again before it is invalidated.
	wr := qp.SendWR{ID: 6, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, MW: f.mw, RKey: old + 1,
		Bind: qp.MWBindInfo{MR: f.bMR, Addr: mwBase, Length: 8, Access: mwAccess}}
	if err := f.b.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 6, qp.WCMWBindErr)

	f = newMWFixture(t, qp.MWType2)
	old = f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	if err := f.b.QP.PostSend(&qp.SendWR{ID: 5, Opcode: qp.WRLocalInv, InvalidateRKey: old}); err != nil {
		t.Fatal(err)
	}
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase, 64, qp.AccessRemoteRead)
	if key == old {
		t.Fatal("rebind kept the old key")
	}
	expectStatus(t, f.access(t, qp.WRRDMARead, mwBase, 64, key), 9, qp.WCSuccess)
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, old), 0)
}

func TestMWSendWithInvalidate(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	if err := f.b.QP.PostRecv(&qp.RecvWR{ID: 3, SGL: []qp.SGE{{Addr: mwBase, Length: 64, LKey: f.bMR.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.a.QP.PostSend(&qp.SendWR{ID: 4, Opcode: qp.WRSendWithInv, InvalidateRKey: key,
		SGL: []qp.SGE{{Addr: 0x1000, Length: 16, LKey: f.aMR.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, f.pair, f.b.RCQ, 1, time.Second)[0]
	expectStatus(t, wc, 3, qp.WCSuccess)
	if wc.Flags&qp.WCWithInv == 0 || wc.InvalidatedRKey != key {
		t.Fatalf("receive completion %+v: want WCWithInv and key %#x", wc, key)
	}
	if f.mw.Bound() {
		t.Fatal("window still bound after SEND_WITH_INV")
	}
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key), 0)
}

func TestMWDealloc(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	// The region cannot go while a window is bound to it.
	if err := f.bMR.Dereg(); !errors.Is(err, qp.ErrBusy) {
		t.Fatalf("Dereg with a bound window: %v, want ErrBusy", err)
	}
	if err := f.mw.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := f.mw.Dealloc(); !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("second Dealloc: %v", err)
	}
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key), 0)
	if err := f.bMR.Dereg(); err != nil {
		t.Fatalf("Dereg after Dealloc: %v", err)
	}
}

// TestMWType2OtherQP: a type 2 window is usable only through the QP that
// bound it, even by a QP of the same PD.
func TestMWType2OtherQP(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	// A second connection between the engines, B's end in the same PD.
	a2, err := qptest.NewEndpoint(f.net.A.E, qp.RC, 8)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := f.b.PD.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: f.b.SCQ, RecvCQ: f.b.RCQ,
		Cap: qp.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.net.Connect(a2.QP, b2, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	key := f.bind2(t, b2, f.b.SCQ, mwBase+mwOff, mwLen, mwAccess)
	// Through the binding QP's peer: granted.
	aMR2 := f.regMR(a2, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	if err := a2.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled, RemoteAddr: mwBase + mwOff,
		RKey: key, SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: aMR2.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, a2.SCQ, 1, time.Second)[0], 1, qp.WCSuccess)
	// Through the other QP: refused.
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 8, key), 0)
}

func TestMWBindNeedsBindAccess(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	noBind := f.regMR(f.b, make([]byte, 256), 0x9000, qp.AccessLocalWrite|qp.AccessRemoteRead)
	wr := qp.SendWR{ID: 8, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, MW: f.mw, RKey: f.mw.RKey() + 1,
		Bind: qp.MWBindInfo{MR: noBind, Addr: 0x9000, Length: 64, Access: qp.AccessRemoteRead}}
	if err := f.b.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 8, qp.WCMWBindErr)
	if f.mw.Bound() {
		t.Fatal("refused bind left the window bound")
	}
	if f.b.QP.State() != qp.StateErr {
		t.Fatalf("QP state %v after a failed bind, want ERR (rxe)", f.b.QP.State())
	}
}

func TestMWBindChecks(t *testing.T) {
	for _, c := range []struct {
		name   string
		mrAcc  qp.Access
		addr   uint64
		length uint64
		acc    qp.Access
	}{
		{"past-region", qp.AccessLocalWrite | qp.AccessMWBind, mwBase + mwSize - 8, 16, qp.AccessRemoteRead},
		{"before-region", qp.AccessLocalWrite | qp.AccessMWBind, mwBase - 1, 8, qp.AccessRemoteRead},
		{"zero-length-type2", qp.AccessLocalWrite | qp.AccessMWBind, mwBase, 0, qp.AccessRemoteRead},
		{"writable-without-local-write", qp.AccessMWBind, mwBase, 8, qp.AccessRemoteWrite},
		{"unknown-access", qp.AccessLocalWrite | qp.AccessMWBind, mwBase, 8, 1 << 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newMWFixture(t, qp.MWType2)
			mr := f.regMR(f.b, make([]byte, mwSize), mwBase, c.mrAcc)
			var bmr *qp.MR
			if c.length > 0 {
				bmr = mr
			}
			wr := qp.SendWR{ID: 8, Opcode: qp.WRBindMW, Flags: qp.SendSignaled, MW: f.mw, RKey: f.mw.RKey() + 1,
				Bind: qp.MWBindInfo{MR: bmr, Addr: c.addr, Length: c.length, Access: c.acc}}
			if c.length == 0 {
				wr.Bind.Addr = 0
			}
			if err := f.b.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 8, qp.WCMWBindErr)
		})
	}
}

func TestMWType1(t *testing.T) {
	f := newMWFixture(t, qp.MWType1)
	if f.mw.Bound() {
		t.Fatal("fresh type 1 window is bound")
	}
	key, err := f.b.QP.BindMW(f.mw, &qp.MWBind{ID: 2, Flags: qp.SendSignaled,
		Info: qp.MWBindInfo{MR: f.bMR, Addr: mwBase + mwOff, Length: mwLen, Access: qp.AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0]
	expectStatus(t, wc, 2, qp.WCSuccess)
	if wc.Opcode != qp.WCBindMW || f.mw.RKey() != key {
		t.Fatalf("bind completion %+v, key %#x want %#x", wc, f.mw.RKey(), key)
	}
	expectStatus(t, f.access(t, qp.WRRDMARead, mwBase+mwOff, 64, key), 9, qp.WCSuccess)
	// Type 1 windows are not bound by a QP: another QP's peer may use it.
	// A rebind moves it; the old key dies.
	key2, err := f.b.QP.BindMW(f.mw, &qp.MWBind{ID: 3, Flags: qp.SendSignaled,
		Info: qp.MWBindInfo{MR: f.bMR, Addr: mwBase, Length: 128, Access: qp.AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 3, qp.WCSuccess)
	if key2 == key || key2>>8 != key>>8 {
		t.Fatalf("rebind key %#x after %#x: want the same index and another consumer key", key2, key)
	}
	expectStatus(t, f.access(t, qp.WRRDMARead, mwBase, 128, key2), 9, qp.WCSuccess)
	// Unbinding (zero length) leaves the window valid but granting nothing.
	key3, err := f.b.QP.BindMW(f.mw, &qp.MWBind{ID: 4, Flags: qp.SendSignaled})
	if err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 4, qp.WCSuccess)
	f.refused(t, f.access(t, qp.WRRDMARead, mwBase, 8, key3), 0)
}

func TestMWType1NotInvalidated(t *testing.T) {
	f := newMWFixture(t, qp.MWType1)
	key, err := f.b.QP.BindMW(f.mw, &qp.MWBind{ID: 2, Info: qp.MWBindInfo{MR: f.bMR, Addr: mwBase, Length: 64, Access: qp.AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	// o10-37.2.26: LOCAL_INV of a type 1 window fails.
	if err := f.b.QP.PostSend(&qp.SendWR{ID: 5, Opcode: qp.WRLocalInv, InvalidateRKey: key}); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.SCQ, 1, time.Second)[0], 5, qp.WCLocQPOpErr)
	if !f.mw.Bound() {
		t.Fatal("type 1 window unbound by LOCAL_INV")
	}
}

func TestMWPostChecks(t *testing.T) {
	f := newMWFixture(t, qp.MWType2)
	if _, err := f.b.QP.BindMW(f.mw, &qp.MWBind{}); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("BindMW of a type 2 window: %v", err)
	}
	mw1, err := f.b.PD.AllocMW(qp.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.QP.BindMW(mw1, &qp.MWBind{Info: qp.MWBindInfo{Addr: mwBase, Length: 8}}); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("BindMW with a length and no MR: %v", err)
	}
	otherPD, _ := f.net.B.E.AllocPD()
	mr, err := otherPD.RegMR(make([]byte, 64), 0, qp.AccessLocalWrite|qp.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.QP.BindMW(mw1, &qp.MWBind{Info: qp.MWBindInfo{MR: mr, Length: 8}}); !errors.Is(err, qp.ErrWrongPD) {
		t.Fatalf("BindMW with another PD's MR: %v", err)
	}
	if _, err := f.b.PD.AllocMW(3); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("AllocMW(3): %v", err)
	}
	if err := f.b.PD.Close(); !errors.Is(err, qp.ErrBusy) {
		t.Fatalf("PD.Close with windows: %v", err)
	}
	// Windows need a UC or RC QP.
	ud, err := qptest.NewEndpoint(f.net.B.E, qp.UD, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := ud.QP.PostSend(&qp.SendWR{Opcode: qp.WRBindMW, MW: f.mw}); err == nil {
		t.Fatal("BIND_MW accepted on a UD QP")
	}
}

// TestMWUC: UC QPs bind windows too; a WRITE outside the window is dropped
// and counted, as UC answers nothing.
func TestMWUC(t *testing.T) {
	f := &mwFixture{pair: newPair(t, qp.UC, cleanNet, qptest.DefaultRC, 8)}
	f.aBuf, f.bBuf = make([]byte, mwSize), make([]byte, mwSize)
	f.aMR = f.regMR(f.a, f.aBuf, 0x1000, qp.AccessLocalWrite)
	f.bMR = f.regMR(f.b, f.bBuf, mwBase, qp.AccessLocalWrite|qp.AccessMWBind)
	mw, err := f.b.PD.AllocMW(qp.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	f.mw = mw
	key := f.bind2(t, f.b.QP, f.b.SCQ, mwBase+mwOff, mwLen, qp.AccessRemoteWrite)
	fill(f.aBuf, 5)
	expectStatus(t, f.access(t, qp.WRRDMAWrite, mwBase+mwOff, 64, key), 9, qp.WCSuccess)
	_ = f.net.Run(func() bool { return bytes.Equal(f.bBuf[mwOff:mwOff+64], f.aBuf[:64]) }, time.Second)
	if !bytes.Equal(f.bBuf[mwOff:mwOff+64], f.aBuf[:64]) {
		t.Fatal("UC WRITE through the window did not land")
	}
	clear(f.bBuf)
	expectStatus(t, f.access(t, qp.WRRDMAWrite, mwBase, 64, key), 9, qp.WCSuccess) // UC: sent is done
	_ = f.net.Run(func() bool { return f.net.B.E.Stats().RKeyViolations > 0 }, time.Second)
	if n := f.net.B.E.Stats().RKeyViolations; n != 1 {
		t.Fatalf("RKeyViolations %d, want 1", n)
	}
	for _, b := range f.bBuf {
		if b != 0 {
			t.Fatal("UC WRITE outside the window changed the region")
		}
	}
}

// TestMWSendWithInvalidateRefused: a SEND_WITH_INV naming a window the
// responder may not invalidate (here a type 1 window) completes the receive
// with a remote invalid request error and fails the responder's QP, but is
// acknowledged, as rxe does (class J): the sender's WR succeeds.
func TestMWSendWithInvalidateRefused(t *testing.T) {
	f := newMWFixture(t, qp.MWType1)
	key, err := f.b.QP.BindMW(f.mw, &qp.MWBind{ID: 2, Info: qp.MWBindInfo{MR: f.bMR, Addr: mwBase, Length: 64, Access: qp.AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.b.QP.PostRecv(&qp.RecvWR{ID: 3, SGL: []qp.SGE{{Addr: mwBase, Length: 64, LKey: f.bMR.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.a.QP.PostSend(&qp.SendWR{ID: 4, Opcode: qp.WRSendWithInv, Flags: qp.SendSignaled, InvalidateRKey: key,
		SGL: []qp.SGE{{Addr: 0x1000, Length: 16, LKey: f.aMR.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, f.pair, f.b.RCQ, 1, time.Second)[0], 3, qp.WCRemInvReqErr)
	expectStatus(t, waitWC(t, f.pair, f.a.SCQ, 1, time.Second)[0], 4, qp.WCSuccess)
	if f.b.QP.State() != qp.StateErr || !f.mw.Bound() {
		t.Fatalf("responder state %v, window bound %v: want ERR and still bound", f.b.QP.State(), f.mw.Bound())
	}
}
