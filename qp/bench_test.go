package qp_test

import (
	"runtime"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/qp/qptest"
)

// wire connects two engines directly (no impairment) to measure engine cost.
type wire struct {
	a, b     *qp.Engine
	ea, eb   *qptest.Endpoint
	slots    []qp.TxPacket
	pkt      ib.Packet
	srcA     qp.Source // what B sees as the source of A's packets
	srcB     qp.Source
	wcs      [8]qp.WorkCompletion
	aMR, bMR *qp.MR
	sendWR   qp.SendWR
	recvWR   qp.RecvWR
	sendSGE  [1]qp.SGE
	recvSGE  [1]qp.SGE
	packets  int
}

func newWire(tb testing.TB, op qp.WROpcode, size int) *wire {
	n, err := qptest.NewNet(qptest.Options{PortMTU: ib.MTU4096})
	if err != nil {
		tb.Fatal(err)
	}
	w := &wire{a: n.A.E, b: n.B.E,
		srcA: qp.Source{SGID: n.A.GID, DGID: n.B.GID}, srcB: qp.Source{SGID: n.B.GID, DGID: n.A.GID}}
	w.ea, _ = qptest.NewEndpoint(w.a, qp.RC, 64)
	w.eb, _ = qptest.NewEndpoint(w.b, qp.RC, 64)
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU4096
	if err := n.Connect(w.ea.QP, w.eb.QP, prm); err != nil {
		tb.Fatal(err)
	}
	w.aMR, _ = w.ea.PD.RegMR(make([]byte, 1<<20), 0x10000, qp.AccessLocalWrite)
	w.bMR, _ = w.eb.PD.RegMR(make([]byte, 1<<20), 0x10000, allAccess)
	w.slots = make([]qp.TxPacket, 16)
	for i := range w.slots {
		w.slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
	}
	w.sendSGE[0] = qp.SGE{Addr: 0x10000, Length: uint32(size), LKey: w.aMR.LKey()}
	w.recvSGE[0] = qp.SGE{Addr: 0x10000, Length: uint32(size), LKey: w.bMR.LKey()}
	w.sendWR = qp.SendWR{Opcode: op, Flags: qp.SendSignaled, SGL: w.sendSGE[:], RemoteAddr: 0x10000, RKey: w.bMR.RKey()}
	w.recvWR = qp.RecvWR{SGL: w.recvSGE[:]}
	return w
}

func (w *wire) move(from, to *qp.Engine, src *qp.Source) int {
	total := 0
	for {
		n := from.Transmit(w.slots)
		for i := 0; i < n; i++ {
			if err := ib.ParseIB(w.slots[i].Payload(), &w.pkt); err != nil {
				panic(err)
			}
			to.Receive(&w.pkt, src)
		}
		total += n
		if n < len(w.slots) {
			return total
		}
	}
}

// one runs one message: post, requests A→B, responses B→A, completions.
func (w *wire) one(tb testing.TB) {
	if w.sendWR.Opcode == qp.WRSend {
		if err := w.eb.QP.PostRecv(&w.recvWR); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.ea.QP.PostSend(&w.sendWR); err != nil {
		tb.Fatal(err)
	}
	w.packets += w.move(w.a, w.b, &w.srcA)
	w.packets += w.move(w.b, w.a, &w.srcB)
	if n := w.ea.SCQ.Poll(w.wcs[:]); n != 1 || w.wcs[0].Status != qp.WCSuccess {
		tb.Fatalf("completion %d %+v", n, w.wcs[0])
	}
	w.eb.RCQ.Poll(w.wcs[:])
}

func benchOp(b *testing.B, op qp.WROpcode, size int) {
	w := newWire(b, op, size)
	for i := 0; i < 100; i++ {
		w.one(b)
	}
	w.packets = 0
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.one(b)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(w.packets), "ns/pkt")
	b.ReportMetric(float64(w.packets)/float64(b.N), "pkts/op")
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
			w.one(t)
		}
		if a := testing.AllocsPerRun(200, func() { w.one(t) }); a != 0 {
			t.Errorf("op %d size %d: %v allocations per message", c.op, c.size, a)
		}
	}
}

// idleQPBytes measures the heap held by one idle, connected RC QP with
// rc_pingpong-like queue sizes (send and receive depth 128, one SGE, 16
// responder resources).
func idleQPBytes(tb testing.TB) float64 {
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
		qps = append(qps, q)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	runtime.KeepAlive(qps)
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
	if v > 64<<10 {
		t.Fatalf("idle QP holds %.0f bytes", v)
	}
}
