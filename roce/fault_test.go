package roce

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
)

// A peer QP that disappears mid-transfer ends the sender's work with
// RETRY_EXC_ERR, and the device keeps serving its other QPs.
func TestPeerDisappears(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 1<<20)
	b := newEndpoint(t, db, RC, 1<<20)
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 10, RetryCnt: 2, NoDefaults: true, RNRRetry: 7, MinRNRTimer: 1})
	a2 := newEndpoint(t, da, RC, 8192)
	b2 := newEndpoint(t, db, RC, 8192)
	connect(t, a2, b2, addrA, addrB, ConnectAttr{})

	if err := b.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 1<<20)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 10*time.Second)
	if wc.Status != WCRetryExcErr {
		t.Fatalf("write to a vanished QP completed with %v, want %v", wc.Status, WCRetryExcErr)
	}
	if s := a.qp.State(); s != StateErr {
		t.Fatalf("QP state %v after retry exhaustion, want ERR", s)
	}
	if c := da.Counters(); c.RetryExceededErr != 1 || c.Timeouts == 0 {
		t.Fatalf("counters after retry exhaustion: %+v", c)
	}
	t.Logf("A %v", da.Counters().Map())
	if c := db.Counters(); c.UnknownQP == 0 {
		t.Fatalf("peer counted no packets for an unknown QP: %+v", c)
	}
	if err := pingPong(a2, b2, 2000, 5); err != nil {
		t.Fatalf("other QP after the failure: %v", err)
	}
}

// A whole peer device closing gives the same result.
func TestPeerDeviceCloses(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 1<<16)
	b := newEndpoint(t, db, RC, 1<<16)
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 10, RetryCnt: 1, NoDefaults: true, RNRRetry: 1, MinRNRTimer: 1})
	db.Close()
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 10*time.Second); wc.Status != WCRetryExcErr {
		t.Fatalf("send to a closed peer: %v", wc.Status)
	}
	// Posting on the errored QP flushes.
	if err := a.qp.PostSend(&SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 5*time.Second); wc.Status != WCWRFlushErr {
		t.Fatalf("send on an errored QP: %v", wc.Status)
	}
}

func TestMTUMismatch(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 1<<16)
	b := newEndpoint(t, db, RC, 1<<16)
	ctx := context.Background()
	err := a.qp.Connect(ctx, &ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: addrB, PathMTU: ib.MTU4096})
	if !errors.Is(err, ErrMTU) {
		t.Fatalf("path MTU 4096 on a 1500-byte link: %v, want ErrMTU", err)
	}
	t.Log(err)
	// 1024 works.
	connect(t, a, b, addrA, addrB, ConnectAttr{PathMTU: ib.MTU1024})
	if err := pingPong(a, b, 5000, 2); err != nil {
		t.Fatal(err)
	}
}

func TestBadInput(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// No neighbour entry and no interface to ask: a clear error at once.
	err := a.qp.Connect(ctx, &ConnectAttr{RemoteQPN: 99, RemoteAddr: netip.MustParseAddr("10.0.0.77")})
	if !errors.Is(err, ErrNoNeighbour) {
		t.Fatalf("connect to an unknown neighbour: %v", err)
	}
	// A source GID that is not ours.
	var attr QPAttr
	attr.State = StateRTR
	attr.AV = AddressVector{DGID: ib.GIDFromAddr(addrB), SGID: ib.GIDFromAddr(netip.MustParseAddr("10.9.9.9"))}
	if err := a.qp.Modify(ctx, &attr, AttrState|AttrAV); !errors.Is(err, ErrNoGID) {
		t.Fatalf("foreign SGID: %v", err)
	}
	// Family mismatch: no IPv6 address on this device beyond the link-local default.
	if _, err := da.GID(7); !errors.Is(err, ErrNoGID) {
		t.Fatalf("GID 7: %v", err)
	}
	// Engine errors come through wrapped.
	if err := a.qp.PostSend(&SendWR{Opcode: WRSend}); !errors.Is(err, qp.ErrInvalidState) {
		t.Fatalf("post on a RESET QP: %v", err)
	}
	if err := a.qp.PostSend(nil); err == nil {
		t.Fatal("nil WR accepted")
	}
	if _, err := a.pd.CreateQP(&QPInitAttr{Type: RC}); err == nil {
		t.Fatal("QP without CQs accepted")
	}
	cqB, _ := db.CreateCQ(4)
	if _, err := a.pd.CreateQP(&QPInitAttr{Type: RC, SendCQ: cqB, RecvCQ: cqB}); !errors.Is(err, ErrWrongDevice) {
		t.Fatalf("CQ of another device: %v", err)
	}
	if _, err := da.CreateCQ(0); err == nil {
		t.Fatal("zero-entry CQ accepted")
	}
	if err := a.pd.Close(); !errors.Is(err, qp.ErrBusy) {
		t.Fatalf("closing a PD in use: %v", err)
	}
}

// A work request goes to the engine as the caller built it, so the device
// checks the objects it names first: another device's AH, MW or MR, a nil
// or zero one, or a type that merely embeds one is refused with an error,
// never handed on; the QP's own AH still works after them.
func TestPostSendForeignObjects(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, UD, 4096)
	b := newEndpoint(t, db, UD, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ahA, err := a.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
	if err != nil {
		t.Fatal(err)
	}
	ahB, err := b.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrA)})
	if err != nil {
		t.Fatal(err)
	}
	mwB, err := b.pd.AllocMW(MWType2)
	if err != nil {
		t.Fatal(err)
	}
	send := func(ah AHRef) *SendWR {
		return &SendWR{ID: 7, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 100)},
			AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1234}
	}
	var nilAH *AH
	for _, c := range []struct {
		name string
		wr   *SendWR
		want error
	}{
		{"AH of another device", send(ahB), ErrWrongDevice},
		{"nil *AH", send(nilAH), ErrInvalidArgument},
		{"zero AH", send(&AH{}), ErrInvalidArgument},
		{"type embedding an AH", send(struct{ *AH }{ahA}), ErrInvalidArgument},
		{"MW of another device", &SendWR{Opcode: WRBindMW, MW: mwB, AH: ahA}, ErrWrongDevice},
		{"MR of another device", &SendWR{Opcode: WRBindMW, AH: ahA,
			Bind: MWBindInfo{MR: b.mr, Length: 8}}, ErrWrongDevice},
	} {
		if err := a.qp.PostSend(c.wr); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := a.qp.PostSendBatch([]SendWR{*send(ahA), *send(ahB)}); !errors.Is(err, ErrWrongDevice) {
		t.Errorf("batch with another device's AH: %v", err)
	}
	wantOK(t, waitWC(t, a.scq, 5*time.Second), WCSend) // the batch's first
	if err := a.qp.PostSend(send(ahA)); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, 5*time.Second), WCSend)
}

// A SEND that finds no receive posted is RNR NAKed and retried by the timer
// until the receive appears.
func TestRNRRetry(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{MinRNRTimer: 4}) // 0.06 ms
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := b.qp.PostRecv(&RecvWR{ID: 2, SGL: []SGE{b.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, 5*time.Second), WCSend)
	wantOK(t, waitWC(t, b.rcq, 5*time.Second), WCRecv)
	if ca, cb := da.Counters(), db.Counters(); ca.RcvdRNRErr == 0 || cb.SendRNRErr == 0 {
		t.Fatalf("RNR counters did not move: A %v B %v", ca.Map(), cb.Map())
	}
}

// Two QPs of one device talk through the device itself (rxe_loopback): the
// frames never reach the link, and RC and UD work byte for byte.
func TestLoopback(t *testing.T) {
	var capture bytes.Buffer
	la, _ := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	d, err := OpenLink(la, Options{Addrs: []netip.Addr{addrA}, Capture: &capture})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a := newEndpoint(t, d, RC, 4*20000+64)
	b := newEndpoint(t, d, RC, 4*20000+64)
	connect(t, a, b, addrA, addrA, ConnectAttr{})
	exerciseRC(t, a, b, 20000)
	ua := newEndpoint(t, d, UD, 4096)
	ub := newEndpoint(t, d, UD, 4096)
	connect(t, ua, ub, addrA, addrA, ConnectAttr{})
	exerciseUD(t, ua, ub, ib.GIDFromAddr(addrA), 500, 5)
	if st := la.TxStats(); st.Pushed != 0 {
		t.Fatalf("%d loopback frames went to the link", st.Pushed)
	}
	if c := d.Counters(); c.SentPkts == 0 || c.SentPkts != c.RcvdPkts {
		t.Fatalf("loopback counters %v", c.Map())
	}
	if err := d.FlushCapture(); err != nil || capture.Len() < 1000 {
		t.Fatalf("capture of loopback traffic: %d bytes, %v", capture.Len(), err)
	}
}
