package qp_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// One engine holds a million idle connected RC QPs with rc_pingpong-like
// queues (128/128 WRs) in under 2 GiB: their rings and responder
// resources are made on first use. Then a few of them carry a message
// each way, and Close destroys them all.
func TestMillionIdleQPs(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000,000 QPs: seconds and about 1 GiB")
	}
	const n = 1_000_000
	clock := &qptest.Clock{}
	e, err := qp.New(qp.Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := e.AllocPD()
	cq, _ := e.CreateCQ(1024)
	sgid, dgid := ib.GID{15: 1}, ib.GID{15: 2}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	start := time.Now()
	var first, last *qp.QP
	for i := 0; i < n; i++ {
		q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq,
			Cap: qp.QPCap{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatalf("QP %d: %v", i, err)
		}
		if err := qptest.BringUp(q, uint32(0x800000+i), qptest.DefaultRC, 1, 2, sgid, dgid); err != nil {
			t.Fatalf("QP %d: %v", i, err)
		}
		if i == 0 {
			first = q
		}
		last = q
	}
	made := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	held := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	t.Logf("%d idle RC QPs (128/128 WRs): %v to create and connect, %.0f MiB held (%.0f bytes per QP), %.0f MiB from the OS",
		n, made.Round(time.Millisecond), float64(held)/(1<<20), float64(held)/n, float64(m1.Sys)/(1<<20))
	if held >= 2<<30 {
		t.Errorf("%d idle QPs hold %d bytes, want under 2 GiB", n, held)
	}
	// A ceiling, not a speed measurement: several times what a loaded
	// two-core machine takes.
	if made > 2*time.Minute {
		t.Errorf("creating %d QPs took %v, want under 2 minutes", n, made)
	}
	// The first and the last still work: their queues are made on demand.
	for _, q := range []*qp.QP{first, last} {
		if err := q.PostRecv(&qp.RecvWR{ID: 1}); err != nil {
			t.Fatal(err)
		}
		if err := q.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRRDMAWrite}); err != nil {
			t.Fatal(err)
		}
	}
	slots := make([]qp.TxPacket, 4)
	for i := range slots {
		slots[i].Buf, slots[i].Headroom = make([]byte, 4096+256), 64
	}
	sent := 0
	for e.HasWork() {
		k := e.Transmit(slots)
		if k == 0 {
			break
		}
		sent += k
	}
	if sent != 2 {
		t.Errorf("%d packets sent, want one WRITE from each of two QPs", sent)
	}
	start = time.Now()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close: %v", time.Since(start).Round(time.Millisecond))
}
