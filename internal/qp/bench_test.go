package qp_test

import (
	"runtime"
	"testing"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// newWire joins two engines directly (no impairment) to measure engine cost.
func newWire(tb testing.TB, op qp.WROpcode, size int) *qptest.Wire {
	w, err := qptest.NewWire(op, size)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

// one runs one message on w.
func one(tb testing.TB, w *qptest.Wire) {
	if err := w.One(); err != nil {
		tb.Fatal(err)
	}
}

func benchOp(b *testing.B, op qp.WROpcode, size int) {
	w := newWire(b, op, size)
	for i := 0; i < 100; i++ {
		one(b, w)
	}
	w.Packets = 0
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		one(b, w)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(w.Packets), "ns/pkt")
	b.ReportMetric(float64(w.Packets)/float64(b.N), "pkts/op")
}

func BenchmarkRCSend64(b *testing.B)   { benchOp(b, qp.WRSend, 64) }
func BenchmarkRCSend4K(b *testing.B)   { benchOp(b, qp.WRSend, 4096) }
func BenchmarkRCSend64K(b *testing.B)  { benchOp(b, qp.WRSend, 64<<10) }
func BenchmarkRCWrite64(b *testing.B)  { benchOp(b, qp.WRRDMAWrite, 64) }
func BenchmarkRCWrite4K(b *testing.B)  { benchOp(b, qp.WRRDMAWrite, 4096) }
func BenchmarkRCWrite64K(b *testing.B) { benchOp(b, qp.WRRDMAWrite, 64<<10) }
func BenchmarkRCRead64K(b *testing.B)  { benchOp(b, qp.WRRDMARead, 64<<10) }

// TestSteadyStateAllocs guards the zero-allocation data path: posting,
// segmenting, responding, acknowledging and completing allocate nothing.
func TestSteadyStateAllocs(t *testing.T) {
	for _, c := range []struct {
		op   qp.WROpcode
		size int
	}{{qp.WRSend, 64}, {qp.WRSend, 20000}, {qp.WRRDMAWrite, 20000}, {qp.WRRDMARead, 20000}, {qp.WRAtomicFetchAndAdd, 8}} {
		w := newWire(t, c.op, c.size)
		for i := 0; i < 10; i++ {
			one(t, w)
		}
		if a := testing.AllocsPerRun(200, func() { one(t, w) }); a != 0 {
			t.Errorf("op %d size %d: %v allocations per message", c.op, c.size, a)
		}
	}
}

// idleQPBytes measures the heap held by one idle, connected RC QP with
// rc_pingpong-like queue sizes (send and receive depth 128, one SGE, 16
// responder resources).
func idleQPBytes(tb testing.TB) float64 { return qpBytes(tb, false) }

// usedQPBytes is idleQPBytes for QPs that have posted a send and a
// receive, so their work request rings are made.
func usedQPBytes(tb testing.TB) float64 { return qpBytes(tb, true) }

func qpBytes(tb testing.TB, used bool) float64 {
	n, err := qptest.NewNet(qptest.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	pd, _ := n.A.E.AllocPD()
	cq, _ := n.A.E.CreateCQ(1024)
	peer, _ := qptest.NewEndpoint(n.B.E, qp.RC, 4)
	const count = 500
	qps := make([]*qp.QP, 0, count)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for i := 0; i < count; i++ {
		q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq,
			Cap: qp.QPCap{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			tb.Fatal(err)
		}
		if err := qptest.BringUp(q, peer.QP.QPN(), qptest.DefaultRC, 1, 2, n.A.GID, n.B.GID); err != nil {
			tb.Fatal(err)
		}
		if used {
			if err := q.PostRecv(&qp.RecvWR{ID: 1}); err != nil {
				tb.Fatal(err)
			}
			if err := q.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRRDMAWrite}); err != nil {
				tb.Fatal(err)
			}
		}
		qps = append(qps, q)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	// The net and the peer stay reachable: what they free would count against the QPs.
	runtime.KeepAlive(qps)
	runtime.KeepAlive(n)
	runtime.KeepAlive(peer)
	return float64(m1.HeapAlloc-m0.HeapAlloc) / count
}

func BenchmarkIdleQPMemory(b *testing.B) {
	var v float64
	for i := 0; i < b.N; i++ {
		v = idleQPBytes(b)
	}
	b.ReportMetric(v, "bytes/QP")
}

func TestIdleQPMemory(t *testing.T) {
	v := idleQPBytes(t)
	t.Logf("idle RC QP (128/128 WRs, 1 SGE, 16 responder resources): %.0f bytes", v)
	// Work request rings and responder resources are made on first use.
	if v > 2<<10 {
		t.Fatalf("idle QP holds %.0f bytes, want at most 2 KiB", v)
	}
}
