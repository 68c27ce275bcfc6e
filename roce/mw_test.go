package roce

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// mwConn is an RC connection over memlink whose B side has a region that
// grants no remote access itself, with a window allocated on it.
type mwConn struct {
	da, db *Device
	a, b   *endpoint
	region *MR
	mem    []byte
	mw     *MW
}

const (
	mwOff = 256
	mwLen = 1024
)

func newMWConn(t *testing.T, typ MWType) *mwConn {
	t.Helper()
	c := &mwConn{}
	c.da, c.db = memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	c.a = newEndpoint(t, c.da, RC, 4096)
	c.b = newEndpoint(t, c.db, RC, 4096)
	connect(t, c.a, c.b, addrA, addrB, ConnectAttr{})
	c.mem = make([]byte, 4096)
	var err error
	if c.region, err = c.b.pd.RegisterMR(c.mem, AccessLocalWrite|AccessMWBind); err != nil {
		t.Fatal(err)
	}
	if c.mw, err = c.b.pd.AllocMW(typ); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *mwConn) winAddr() uint64 { return c.region.Addr() + mwOff }

// bind2 binds the type 2 window through q and returns its new R_Key.
func (c *mwConn) bind2(t *testing.T, q *QP, cq *CQ, acc Access) uint32 {
	t.Helper()
	old := c.mw.RKey()
	key := old&^0xFF | (old+1)&0xFF
	if err := q.PostSend(&SendWR{ID: 7, Opcode: WRBindMW, Flags: SendSignaled, MW: c.mw, RKey: key,
		Bind: MWBindInfo{MR: c.region, Addr: c.winAddr(), Length: mwLen, Access: acc}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, cq, 5*time.Second), WCBindMW)
	if c.mw.RKey() != key || !c.mw.Bound() {
		t.Fatalf("window key %#x bound %v, want %#x", c.mw.RKey(), c.mw.Bound(), key)
	}
	return key
}

// rdma runs one READ or WRITE of n bytes at addr from A.
func (c *mwConn) rdma(t *testing.T, op WROpcode, addr uint64, n int, key uint32) WorkCompletion {
	t.Helper()
	if err := c.a.qp.PostSend(&SendWR{ID: 9, Opcode: op, Flags: SendSignaled, SGL: []SGE{c.a.mr.SGE(0, n)},
		RemoteAddr: addr, RKey: key}); err != nil {
		t.Fatal(err)
	}
	return waitWC(t, c.a.scq, 5*time.Second)
}

// refused checks a remote access error that B counted.
func (c *mwConn) refused(t *testing.T, wc WorkCompletion) {
	t.Helper()
	if wc.Status != WCRemAccessErr {
		t.Fatalf("completion %+v: status %v, want %v", wc, wc.Status, WCRemAccessErr)
	}
	if n := c.db.Counters().RKeyViolation; n != 1 {
		t.Fatalf("B rkey_violation %d, want 1", n)
	}
}

func TestMemlinkMWType2InRange(t *testing.T) {
	c := newMWConn(t, MWType2)
	key := c.bind2(t, c.b.qp, c.b.scq, AccessRemoteRead|AccessRemoteWrite)
	fill(c.a.buf[:mwLen], 3)
	wantOK(t, c.rdma(t, WRRDMAWrite, c.winAddr(), mwLen, key), WCRDMAWrite)
	c.region.Sync()
	if !bytes.Equal(c.mem[mwOff:mwOff+mwLen], c.a.buf[:mwLen]) || c.mem[mwOff-1] != 0 || c.mem[mwOff+mwLen] != 0 {
		t.Fatal("WRITE through the window landed wrong")
	}
	clear(c.a.buf)
	wantOK(t, c.rdma(t, WRRDMARead, c.winAddr()+100, 100, key), WCRDMARead)
	if !bytes.Equal(c.a.buf[:100], c.mem[mwOff+100:mwOff+200]) {
		t.Fatal("READ through the window returned wrong data")
	}
	if n := c.db.Counters().RKeyViolation; n != 0 {
		t.Fatalf("rkey_violation %d", n)
	}
}

func TestMemlinkMWRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *mwConn, key uint32) WorkCompletion
	}{
		{"out-of-range", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			return c.rdma(t, WRRDMAWrite, c.winAddr()+mwLen-4, 8, key)
		}},
		{"region-outside-window", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			return c.rdma(t, WRRDMARead, c.region.Addr(), 8, key)
		}},
		{"after-local-invalidate", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			if err := c.b.qp.PostSend(&SendWR{ID: 5, Opcode: WRLocalInv, Flags: SendSignaled, InvalidateRKey: key}); err != nil {
				t.Fatal(err)
			}
			wantOK(t, waitWC(t, c.b.scq, 5*time.Second), WCLocalInv)
			return c.rdma(t, WRRDMARead, c.winAddr(), 8, key)
		}},
		{"after-send-with-invalidate", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			if err := c.b.qp.PostRecv(&RecvWR{ID: 3, SGL: []SGE{c.b.mr.SGE(0, 64)}}); err != nil {
				t.Fatal(err)
			}
			if err := c.a.qp.PostSend(&SendWR{ID: 4, Opcode: WRSendWithInv, InvalidateRKey: key, SGL: []SGE{c.a.mr.SGE(0, 16)}}); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, c.b.rcq, 5*time.Second)
			wantOK(t, wc, WCRecv)
			if wc.Flags&WCWithInv == 0 || wc.InvalidatedRKey != key {
				t.Fatalf("receive completion %+v: want WCWithInv and key %#x", wc, key)
			}
			return c.rdma(t, WRRDMARead, c.winAddr(), 8, key)
		}},
		{"after-dealloc", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			if err := c.region.Close(); !errors.Is(err, ErrBusy) {
				t.Fatalf("region Close with a bound window: %v, want ErrBusy", err)
			}
			if err := c.mw.Close(); err != nil {
				t.Fatal(err)
			}
			return c.rdma(t, WRRDMARead, c.winAddr(), 8, key)
		}},
		{"access-not-granted", func(t *testing.T, c *mwConn, key uint32) WorkCompletion {
			return c.rdma(t, WRAtomicFetchAndAdd, c.winAddr(), 8, key)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newMWConn(t, MWType2)
			key := c.bind2(t, c.b.qp, c.b.scq, AccessRemoteRead|AccessRemoteWrite)
			c.refused(t, tc.run(t, c, key))
		})
	}
}

// TestMemlinkMWType2OtherQP: a type 2 window is usable only through the QP
// that bound it.
func TestMemlinkMWType2OtherQP(t *testing.T) {
	c := newMWConn(t, MWType2)
	a2 := newEndpoint(t, c.da, RC, 4096)
	b2 := &endpoint{d: c.db, pd: c.b.pd, scq: c.b.scq, rcq: c.b.rcq}
	var err error
	if b2.qp, err = c.b.pd.CreateQP(&QPInitAttr{Type: RC, SendCQ: c.b.scq, RecvCQ: c.b.rcq}); err != nil {
		t.Fatal(err)
	}
	connect(t, a2, b2, addrA, addrB, ConnectAttr{})
	key := c.bind2(t, b2.qp, c.b.scq, AccessRemoteRead)
	if err := a2.qp.PostSend(&SendWR{ID: 1, Opcode: WRRDMARead, Flags: SendSignaled, SGL: []SGE{a2.mr.SGE(0, 8)},
		RemoteAddr: c.winAddr(), RKey: key}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a2.scq, 5*time.Second), WCRDMARead)
	c.refused(t, c.rdma(t, WRRDMARead, c.winAddr(), 8, key))
}

func TestMemlinkMWBindWithoutBindAccess(t *testing.T) {
	c := newMWConn(t, MWType2)
	// b.mr grants remote access but not binding.
	err := c.b.qp.PostSend(&SendWR{ID: 8, Opcode: WRBindMW, Flags: SendSignaled, MW: c.mw, RKey: c.mw.RKey() + 1,
		Bind: MWBindInfo{MR: c.b.mr, Addr: c.b.mr.Addr(), Length: 64, Access: AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, c.b.scq, 5*time.Second); wc.Status != WCMWBindErr || wc.WRID != 8 {
		t.Fatalf("bind completion %+v: status %v, want %v", wc, wc.Status, WCMWBindErr)
	}
	if c.mw.Bound() {
		t.Fatal("refused bind left the window bound")
	}
}

func TestMemlinkMWType1(t *testing.T) {
	c := newMWConn(t, MWType1)
	if r := c.db.Resources(); r.MW != 1 {
		t.Fatalf("resources %+v, want one MW", r)
	}
	key, err := c.b.qp.BindMW(c.mw, &MWBind{ID: 2, Flags: SendSignaled,
		Info: MWBindInfo{MR: c.region, Addr: c.winAddr(), Length: mwLen, Access: AccessRemoteRead}})
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, c.b.scq, 5*time.Second), WCBindMW)
	if c.mw.RKey() != key || c.mw.Type() != MWType1 {
		t.Fatalf("key %#x type %v, want %#x type 1", c.mw.RKey(), c.mw.Type(), key)
	}
	fill(c.mem, 9)
	c.region.Sync()
	wantOK(t, c.rdma(t, WRRDMARead, c.winAddr(), 64, key), WCRDMARead)
	if !bytes.Equal(c.a.buf[:64], c.mem[mwOff:mwOff+64]) {
		t.Fatal("READ through the type 1 window returned wrong data")
	}
	if _, err := c.b.qp.BindMW(c.mw, nil); err == nil {
		t.Fatal("BindMW without a request accepted")
	}
	other, _ := c.a.pd.AllocMW(MWType1)
	if _, err := c.b.qp.BindMW(other, &MWBind{}); !errors.Is(err, ErrWrongDevice) {
		t.Fatalf("BindMW of another device's window: %v", err)
	}
	if err := c.mw.Close(); err != nil {
		t.Fatal(err)
	}
	if r := c.db.Resources(); r.MW != 0 {
		t.Fatalf("resources %+v after Close, want no MW", r)
	}
	c.refused(t, c.rdma(t, WRRDMARead, c.winAddr(), 8, key))
}

// Access through a window, and binding and invalidating one, allocate
// nothing.
func TestAllocsMW(t *testing.T) {
	c := newMWConn(t, MWType2)
	c.bind2(t, c.b.qp, c.b.scq, AccessRemoteRead|AccessRemoteWrite)
	ctx := context.Background()
	var wc [1]WorkCompletion
	wait := func(cq *CQ) {
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if wc[0].Status != WCSuccess {
			t.Fatal(wc[0].Status)
		}
	}
	write := SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{c.a.mr.SGE(0, mwLen)}, RemoteAddr: c.winAddr()}
	read := SendWR{ID: 2, Opcode: WRRDMARead, Flags: SendSignaled, SGL: []SGE{c.a.mr.SGE(0, mwLen)}, RemoteAddr: c.winAddr()}
	access := func() {
		write.RKey = c.mw.RKey()
		read.RKey = write.RKey
		for _, wr := range []*SendWR{&write, &read} {
			if err := c.a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			wait(c.a.scq)
		}
	}
	inv := SendWR{ID: 3, Opcode: WRLocalInv, Flags: SendSignaled}
	bind := SendWR{ID: 4, Opcode: WRBindMW, Flags: SendSignaled, MW: c.mw,
		Bind: MWBindInfo{MR: c.region, Addr: c.winAddr(), Length: mwLen, Access: AccessRemoteRead | AccessRemoteWrite}}
	rebind := func() {
		inv.InvalidateRKey = c.mw.RKey()
		bind.RKey = inv.InvalidateRKey + 1
		for _, wr := range []*SendWR{&inv, &bind} {
			if err := c.b.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			wait(c.b.scq)
		}
	}
	for i := 0; i < 50; i++ {
		access()
		rebind()
	}
	if a := testing.AllocsPerRun(200, access); a > 0.5 {
		t.Fatalf("%.2f allocations per WRITE and READ through a window, want 0", a)
	}
	if a := testing.AllocsPerRun(200, rebind); a > 0.5 {
		t.Fatalf("%.2f allocations per LOCAL_INV and BIND_MW, want 0", a)
	}
}
