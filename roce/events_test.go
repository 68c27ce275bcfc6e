package roce

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// nextEvent returns the next event of type want from sub, skipping others.
func nextEvent(t *testing.T, sub *EventSub, want EventType, timeout time.Duration) AsyncEvent {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-sub.C():
			if !ok {
				t.Fatalf("subscription closed waiting for %v", want)
			}
			if ev.Type == want {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %v event within %v", want, timeout)
		}
	}
}

// A QP whose peer vanishes (the peer QP destroyed, every packet lost, or the
// peer device closed) raises QP_FATAL with RETRY_EXC_ERR, sets Err and closes
// Failed within its retry timeout; a reset clears them.
func TestQPFailsWhenPeerVanishes(t *testing.T) {
	cases := []struct {
		name   string
		ab     faultnet.Config
		vanish func(b *endpoint)
	}{
		{"peer QP destroyed", faultnet.Config{}, func(b *endpoint) { b.qp.Close() }},
		{"all packets lost", faultnet.Config{Loss: 1}, func(*endpoint) {}},
		{"peer device closed", faultnet.Config{}, func(b *endpoint) { b.d.Close() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			da, db := memPair(t, c.ab, faultnet.Config{}, nil)
			a := newEndpoint(t, da, RC, 4096)
			b := newEndpoint(t, db, RC, 4096)
			// ~4 ms timeout, 2 retries: dead within ~12 ms (timers are coarse).
			connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 10, RetryCnt: 2, RNRRetry: 7, NoDefaults: true, MinRNRTimer: 1})
			sub, err := da.SubscribeEvents(8)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			failed := a.qp.Failed()
			if a.qp.Err() != nil {
				t.Fatalf("healthy QP has error %v", a.qp.Err())
			}
			c.vanish(b)
			if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			select {
			case <-failed:
			case <-time.After(10 * time.Second):
				t.Fatal("Failed not closed")
			}
			t.Logf("failed after %v", time.Since(start))
			var qe *QPError
			err = a.qp.Err()
			if !errors.As(err, &qe) || qe.Status != WCRetryExcErr || qe.QPN != a.qp.QPN() || qe.Type != EventQPFatal ||
				!errors.Is(err, ErrQPFailed) {
				t.Fatalf("Err = %v (%+v)", err, qe)
			}
			ev := nextEvent(t, sub, EventQPFatal, time.Second)
			if ev.QP != a.qp || ev.Err != err {
				t.Fatalf("event %v: QP %p Err %v, want %p %v", ev, ev.QP, ev.Err, a.qp, err)
			}
			if wc := waitWC(t, a.scq, time.Second); wc.Status != WCRetryExcErr {
				t.Fatalf("completion %v", wc.Status)
			}
			// A reset QP is healthy again, with a fresh Failed channel.
			if err := a.qp.Modify(t.Context(), &QPAttr{State: StateReset}, AttrState); err != nil {
				t.Fatal(err)
			}
			if a.qp.Err() != nil {
				t.Fatalf("Err after reset: %v", a.qp.Err())
			}
			select {
			case <-a.qp.Failed():
				t.Fatal("Failed closed after reset")
			default:
			}
		})
	}
}

// A caller's move to the error state is not a failure: no Err, no event
// (but LAST_WQE_REACHED for an SRQ-attached QP).
func TestQPModifyErrIsNoFailure(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	sub, err := da.SubscribeEvents(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Modify(t.Context(), &QPAttr{State: StateErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.qp.Failed():
		t.Fatal("Failed closed by Modify")
	default:
	}
	if a.qp.Err() != nil {
		t.Fatalf("Err after Modify: %v", a.qp.Err())
	}
	select {
	case ev := <-sub.C():
		t.Fatalf("event %v after Modify", ev)
	default:
	}
}

// A WRITE with a bad R_Key: the responder raises QP_ACCESS_ERR, the
// requester QP_FATAL with REM_ACCESS_ERR.
func TestQPAccessErrorEvents(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	subA, _ := da.SubscribeEvents(8)
	subB, _ := db.SubscribeEvents(8)
	if err := a.qp.PostSend(&SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() ^ 0x100}); err != nil {
		t.Fatal(err)
	}
	evB := nextEvent(t, subB, EventQPAccessErr, 5*time.Second)
	if evB.QP != b.qp || evB.Err.(*QPError).Status != WCRemAccessErr {
		t.Fatalf("responder event %v", evB)
	}
	<-b.qp.Failed()
	evA := nextEvent(t, subA, EventQPFatal, 5*time.Second)
	if evA.QP != a.qp || evA.Err.(*QPError).Status != WCRemAccessErr {
		t.Fatalf("requester event %v", evA)
	}
	<-a.qp.Failed()
}

// A completion that does not fit its CQ raises CQ_ERR and fails the QP with
// CQOverflow.
func TestCQOverflowEvents(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	pd, _ := da.AllocPD()
	cq, err := da.CreateCQ(1)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&QPInitAttr{Type: RC, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	mr, _ := pd.RegisterMR(make([]byte, 64), AccessLocalWrite)
	a := &endpoint{d: da, pd: pd, scq: cq, rcq: cq, qp: q, mr: mr}
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	sub, _ := da.SubscribeEvents(8)
	for i := 0; i < 2; i++ {
		if err := q.PostSend(&SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{mr.SGE(0, 8)},
			RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	if ev := nextEvent(t, sub, EventCQErr, 5*time.Second); ev.CQ != cq {
		t.Fatalf("CQ event %v", ev)
	}
	ev := nextEvent(t, sub, EventQPFatal, 5*time.Second)
	if qe := ev.Err.(*QPError); !qe.CQOverflow || ev.QP != q {
		t.Fatalf("QP event %v", ev)
	}
}

// The SRQ limit fires once when the posted receives drop below it, then
// stays disarmed; an SRQ-attached QP entering the error state raises
// LAST_WQE_REACHED.
func TestSRQLimitAndLastWQE(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 4096)
	pd, _ := db.AllocPD()
	cq, _ := db.CreateCQ(64)
	srq, err := pd.CreateSRQ(SRQAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&QPInitAttr{Type: RC, SendCQ: cq, RecvCQ: cq, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	mr, _ := pd.RegisterMR(make([]byte, 4096), AccessLocalWrite)
	b := &endpoint{d: db, pd: pd, scq: cq, rcq: cq, qp: q, mr: mr}
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	sub, _ := db.SubscribeEvents(16)
	if err := srq.ArmLimit(17); err == nil {
		t.Fatal("ArmLimit above the SRQ size accepted")
	}
	wrs := make([]RecvWR, 10)
	for i := range wrs {
		wrs[i] = RecvWR{ID: uint64(i), SGL: []SGE{mr.SGE(i*64, 64)}}
	}
	if _, err := srq.PostRecvBatch(wrs); err != nil {
		t.Fatal(err)
	}
	if err := srq.ArmLimit(5); err != nil {
		t.Fatal(err)
	}
	send := func(n int) {
		for i := 0; i < n; i++ {
			if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			waitWC(t, cq, 5*time.Second)
		}
	}
	send(5) // 5 left: not below the limit
	select {
	case <-srq.LimitReached():
		t.Fatal("limit fired with 5 receives posted, limit 5")
	default:
	}
	send(1) // 4 left
	select {
	case <-srq.LimitReached():
	case <-time.After(5 * time.Second):
		t.Fatal("limit did not fire")
	}
	if ev := nextEvent(t, sub, EventSRQLimitReached, time.Second); ev.SRQ != srq {
		t.Fatalf("event %v", ev)
	}
	if n := srq.Limit(); n != 0 {
		t.Fatalf("limit %d after firing, want 0 (disarmed)", n)
	}
	send(3) // 1 left: disarmed, nothing more
	select {
	case <-srq.LimitReached():
		t.Fatal("limit fired twice")
	default:
	}
	if err := q.Modify(t.Context(), &QPAttr{State: StateErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, sub, EventQPLastWQEReached, time.Second)
	if ev.QP != q || ev.SRQ != srq {
		t.Fatalf("event %v", ev)
	}
	select {
	case ev := <-sub.C():
		t.Fatalf("extra event %v", ev)
	default:
	}
}

// Many subscribers each get every event; one with a full buffer loses
// events and counts them, without slowing the others. Raising an event
// allocates nothing.
func TestEventSubscribers(t *testing.T) {
	da, _ := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	small, err := da.SubscribeEvents(1)
	if err != nil {
		t.Fatal(err)
	}
	big, _ := da.SubscribeEvents(16)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := da.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	da.linkChanged(0, false)
	da.linkChanged(0, false) // no change: no event
	da.linkChanged(0, true)
	da.linkChanged(0, false)
	want := []EventType{EventPortErr, EventPortActive, EventPortErr}
	for i, w := range want {
		if ev := <-big.C(); ev.Type != w {
			t.Fatalf("event %d: %v, want %v", i, ev, w)
		}
		if ev := <-ch; ev.Type != w {
			t.Fatalf("Events event %d: %v, want %v", i, ev, w)
		}
	}
	if ev := <-small.C(); ev.Type != EventPortErr || small.Lost() != 2 {
		t.Fatalf("small subscriber: %v, lost %d (want 2)", ev, small.Lost())
	}
	cancel()
	for range ch { // closed when ctx ends
	}
	if allocs := testing.AllocsPerRun(100, func() {
		da.linkChanged(0, true)
		da.linkChanged(0, false)
	}); allocs > 0 {
		t.Fatalf("%.1f allocations per two events", allocs)
	}
	if err := small.Close(); err != nil {
		t.Fatal(err)
	}
	if err := small.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	da.Close()
	for range big.C() { // closed with the device
	}
	select {
	case <-da.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
}
