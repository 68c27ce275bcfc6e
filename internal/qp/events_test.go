package qp_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// record collects the events of an engine.
func record(e *qp.Engine) *[]qp.Event {
	var evs []qp.Event
	e.SetEventHandler(func(ev qp.Event) { evs = append(evs, ev) })
	return &evs
}

// Each way an RC QP fails raises one error event with the failing
// completion's status, on the side that failed, and sets Err until reset.
func TestFailureEvents(t *testing.T) {
	cases := []struct {
		name         string
		params       func(*qptest.RCParams)
		setup        func(p *pair, wr *qp.SendWR, remote *qp.MR)
		status       qp.WCStatus
		respType     qp.EventType // event on B, 0 = none
		requesterErr bool         // A fails too
	}{
		{"retry exhausted", func(r *qptest.RCParams) { r.Timeout, r.RetryCnt = 8, 1 },
			func(p *pair, wr *qp.SendWR, _ *qp.MR) { p.b.QP.Destroy() }, qp.WCRetryExcErr, 0, true},
		{"RNR retry exhausted", func(r *qptest.RCParams) { r.RNRRetry, r.MinRNRTimer = 1, 1 },
			func(p *pair, wr *qp.SendWR, _ *qp.MR) { wr.Opcode = qp.WRSend }, qp.WCRNRRetryExcErr, 0, true},
		{"remote access", nil,
			func(p *pair, wr *qp.SendWR, _ *qp.MR) { wr.RKey ^= 0x100 }, qp.WCRemAccessErr, qp.EventQPAccessErr, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rp := qptest.DefaultRC
			if c.params != nil {
				c.params(&rp)
			}
			p := newPair(t, qp.RC, cleanNet, rp, 16)
			evA, evB := record(p.net.A.E), record(p.net.B.E)
			aMR := p.regMR(p.a, make([]byte, 4096), 0x1000, qp.AccessLocalWrite)
			bMR := p.regMR(p.b, make([]byte, 4096), 0x8000, allAccess)
			wr := qp.SendWR{ID: 7, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: aMR.LKey()}}, RemoteAddr: 0x8000, RKey: bMR.RKey()}
			c.setup(p, &wr, bMR)
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			wcs := waitWC(t, p, p.a.SCQ, 1, time.Minute)
			expectStatus(t, wcs[0], 7, c.status)
			if len(*evA) != 1 || (*evA)[0].Type != qp.EventQPFatal || (*evA)[0].QP != p.a.QP {
				t.Fatalf("A's events %+v, want one QP fatal", *evA)
			}
			qe := p.a.QP.Err()
			if qe == nil || qe != (*evA)[0].Err || qe.Status != c.status || qe.QPN != p.a.QP.QPN() || !errors.Is(qe, qp.ErrQPFailed) {
				t.Fatalf("A's Err %+v", qe)
			}
			if c.respType != 0 {
				if len(*evB) != 1 || (*evB)[0].Type != c.respType || (*evB)[0].Err.Status != c.status {
					t.Fatalf("B's events %+v, want %v", *evB, c.respType)
				}
			} else if len(*evB) != 0 {
				t.Fatalf("B's events %+v, want none", *evB)
			}
			if err := p.a.QP.Modify(&qp.QPAttr{State: qp.StateReset}, qp.AttrState); err != nil {
				t.Fatal(err)
			}
			if p.a.QP.Err() != nil {
				t.Fatal("Err survived a reset")
			}
		})
	}
}

// The SRQ limit fires once, when a take leaves fewer than the limit posted;
// an attached QP moved to the error state raises LAST_WQE_REACHED.
func TestSRQLimitEvent(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
	evs := record(p.net.B.E)
	srq, err := p.b.PD.CreateSRQ(qp.SRQAttr{MaxWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.b.PD.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: p.b.SCQ, RecvCQ: p.b.RCQ, SRQ: srq,
		Cap: qp.QPCap{MaxSendWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := qptest.NewEndpoint(p.net.A.E, qp.RC, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.net.Connect(a2.QP, q, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	mr := p.regMR(p.b, make([]byte, 4096), 0x8000, qp.AccessLocalWrite)
	for i := 0; i < 4; i++ {
		if err := srq.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x8000, Length: 64, LKey: mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.ArmLimit(9); !errors.Is(err, qp.ErrInvalidArgument) {
		t.Fatalf("ArmLimit above the size: %v", err)
	}
	if err := srq.ArmLimit(3); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := a2.QP.PostSend(&qp.SendWR{Opcode: qp.WRSend, Flags: qp.SendInline, Inline: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		waitWC(t, p, p.b.RCQ, 1, time.Second)
		want := 0
		if i >= 1 { // 4 posted: the second take leaves 2 < 3
			want = 1
		}
		if len(*evs) != want {
			t.Fatalf("after %d receives: events %+v", i+1, *evs)
		}
	}
	if ev := (*evs)[0]; ev.Type != qp.EventSRQLimitReached || ev.SRQ != srq || srq.Limit() != 0 {
		t.Fatalf("event %+v, limit %d", ev, srq.Limit())
	}
	if err := q.Modify(&qp.QPAttr{State: qp.StateErr}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	if ev := (*evs)[len(*evs)-1]; len(*evs) != 2 || ev.Type != qp.EventQPLastWQEReached || ev.QP != q || ev.SRQ != srq {
		t.Fatalf("events after the error transition: %+v", *evs)
	}
	if q.Err() != nil {
		t.Fatal("a caller's error transition set Err")
	}
}
