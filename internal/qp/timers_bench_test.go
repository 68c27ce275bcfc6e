package qp_test

import (
	"fmt"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// timerEngine is one engine with n connected RC QPs, each with one WRITE
// sent and never acknowledged: n retransmit timers, armed 1 ns apart so
// that each timer event fires one of them.
type timerEngine struct {
	clock *qptest.Clock
	e     *qp.Engine
	qps   []*qp.QP
	slots []qp.TxPacket
}

func newTimerEngine(tb testing.TB, n int) *timerEngine {
	tb.Helper()
	te := &timerEngine{clock: &qptest.Clock{}}
	e, err := qp.New(qp.Config{Clock: te.clock})
	if err != nil {
		tb.Fatal(err)
	}
	te.e = e
	pd, err := e.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	cq, err := e.CreateCQ(64)
	if err != nil {
		tb.Fatal(err)
	}
	te.slots = make([]qp.TxPacket, 4)
	for i := range te.slots {
		te.slots[i].Buf, te.slots[i].Headroom = make([]byte, 4096+256), 64
	}
	sgid, dgid := ib.GID{15: 1}, ib.GID{15: 2}
	for i := 0; i < n; i++ {
		q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq,
			Cap: qp.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			tb.Fatal(err)
		}
		if err := qptest.BringUp(q, uint32(0x100000+i), qptest.DefaultRC, 1, 2, sgid, dgid); err != nil {
			tb.Fatal(err)
		}
		if err := q.PostSend(&qp.SendWR{ID: uint64(i), Opcode: qp.WRRDMAWrite}); err != nil {
			tb.Fatal(err)
		}
		te.drain()
		te.clock.T++
		te.qps = append(te.qps, q)
	}
	return te
}

// drain transmits (and drops) everything the engine has to send.
func (te *timerEngine) drain() int {
	total := 0
	for te.e.HasWork() {
		n := te.e.Transmit(te.slots)
		if n == 0 {
			break
		}
		total += n
	}
	return total
}

// event moves the clock to the next deadline, runs the timers due and
// transmits what they produced: one retransmission.
func (te *timerEngine) event(tb testing.TB) int {
	at, ok := te.e.NextDeadline()
	if !ok {
		tb.Fatal("no timer pending")
	}
	te.clock.T = at
	te.e.Advance(at)
	return te.drain()
}

// BenchmarkTimerEvent measures one timer event (NextDeadline, Advance, and
// the retransmission it causes) on an engine whose n QPs each have a
// retransmit timer running: the cost must not grow with n.
func BenchmarkTimerEvent(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			te := newTimerEngine(b, n)
			for range 2 * n / 1000 { // warm up
				te.event(b)
			}
			sent := 0
			b.ReportAllocs()
			for b.Loop() {
				sent += te.event(b)
			}
			if sent == 0 {
				b.Fatal("timer events sent nothing")
			}
		})
	}
}
