package qp_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// dcWire joins DCIs on engine A to DCTs on engine B directly (no
// impairment), to measure engine cost. The DCTs share one PD, CQ and SRQ, as
// a server with many targets would.
type dcWire struct {
	n       *qptest.Net
	a, b    *qp.Engine
	apd     *qp.PD
	bpd     *qp.PD
	scq     *qp.CQ
	rcq     *qp.CQ
	srq     *qp.SRQ
	ah      *qp.AH
	dcis    []*qp.QP
	dcts    []*qp.QP
	slots   []qp.TxPacket
	pkt     ib.Packet
	srcA    qp.Source
	srcB    qp.Source
	wcs     [64]qp.WorkCompletion
	aMR     *qp.MR
	bMR     *qp.MR
	sendWR  qp.SendWR
	recvWR  qp.RecvWR
	sendSGE [1]qp.SGE
	recvSGE [1]qp.SGE
	packets int
	next    int
}

func newDCWire(tb testing.TB, nDCI, nDCT, maxInit int) *dcWire {
	n, err := qptest.NewNet(qptest.Options{PortMTU: ib.MTU4096})
	if err != nil {
		tb.Fatal(err)
	}
	w := &dcWire{n: n, a: n.A.E, b: n.B.E,
		srcA: qp.Source{SGID: n.A.GID, DGID: n.B.GID}, srcB: qp.Source{SGID: n.B.GID, DGID: n.A.GID}}
	w.apd, _ = w.a.AllocPD()
	w.bpd, _ = w.b.AllocPD()
	w.scq, _ = w.a.CreateCQ(qp.MaxCQE)
	w.rcq, _ = w.b.CreateCQ(qp.MaxCQE)
	w.srq, _ = w.bpd.CreateSRQ(qp.SRQAttr{MaxWR: 1024, MaxSGE: 1})
	w.ah, _ = w.apd.CreateAH(qp.AddressVector{DGID: n.B.GID, SGID: n.A.GID, HopLimit: 64})
	prm := qptest.DefaultRC
	prm.MTU = ib.MTU4096
	for i := 0; i < nDCI; i++ {
		q, err := w.apd.CreateQP(&qp.QPInitAttr{Type: qp.DCI, SendCQ: w.scq, RecvCQ: w.scq,
			Cap: qp.QPCap{MaxSendWR: 128, MaxSendSGE: 1}})
		if err != nil {
			tb.Fatal(err)
		}
		if err := qptest.BringUpDCI(q, prm, uint32(i)); err != nil {
			tb.Fatal(err)
		}
		w.dcis = append(w.dcis, q)
	}
	for i := 0; i < nDCT; i++ {
		q, err := w.bpd.CreateQP(&qp.QPInitAttr{Type: qp.DCT, SendCQ: w.rcq, RecvCQ: w.rcq, SRQ: w.srq,
			DC: qp.DCInitAttr{Key: dcKey, MaxInitiators: maxInit}})
		if err != nil {
			tb.Fatal(err)
		}
		if err := qptest.BringUpDCT(q, prm); err != nil {
			tb.Fatal(err)
		}
		w.dcts = append(w.dcts, q)
	}
	w.aMR, _ = w.apd.RegMR(make([]byte, 1<<20), 0x10000, qp.AccessLocalWrite)
	w.bMR, _ = w.bpd.RegMR(make([]byte, 1<<20), 0x10000, allAccess)
	w.slots = make([]qp.TxPacket, 16)
	for i := range w.slots {
		w.slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
	}
	return w
}

func (w *dcWire) setOp(op qp.WROpcode, size int) {
	w.sendSGE[0] = qp.SGE{Addr: 0x10000, Length: uint32(size), LKey: w.aMR.LKey()}
	w.recvSGE[0] = qp.SGE{Addr: 0x10000, Length: uint32(size), LKey: w.bMR.LKey()}
	w.sendWR = qp.SendWR{Opcode: op, Flags: qp.SendSignaled, SGL: w.sendSGE[:], RemoteAddr: 0x10000, RKey: w.bMR.RKey(),
		AH: w.ah, DCKey: dcKey}
	w.recvWR = qp.RecvWR{SGL: w.recvSGE[:]}
}

func (w *dcWire) move(from, to *qp.Engine, src *qp.Source) int {
	total := 0
	for {
		n := from.Transmit(w.slots)
		for i := 0; i < n; i++ {
			if err := ib.ParseDCIB(w.slots[i].Payload(), &w.pkt); err != nil {
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

// one sends one message from DCI i to DCT j and waits for its completion.
func (w *dcWire) one(tb testing.TB, i, j int) {
	if w.sendWR.Opcode == qp.WRSend {
		if err := w.srq.PostRecv(&w.recvWR); err != nil {
			tb.Fatal(err)
		}
	}
	w.sendWR.RemoteQPN = w.dcts[j].QPN()
	if err := w.dcis[i].PostSend(&w.sendWR); err != nil {
		tb.Fatal(err)
	}
	for {
		m := w.move(w.a, w.b, &w.srcA)
		m += w.move(w.b, w.a, &w.srcB)
		w.packets += m
		if m == 0 {
			break
		}
	}
	if n := w.scq.Poll(w.wcs[:1]); n != 1 || w.wcs[0].Status != qp.WCSuccess {
		tb.Fatalf("completion %d %+v (%s)", n, w.wcs[0], qp.DebugDC(w.dcis[i]))
	}
	w.rcq.Poll(w.wcs[:])
}

func benchDC(b *testing.B, op qp.WROpcode, size, nDCT int) {
	w := newDCWire(b, 1, nDCT, 0)
	w.setOp(op, size)
	for i := 0; i < 100; i++ {
		w.one(b, 0, i%nDCT)
	}
	w.packets = 0
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.one(b, 0, i%nDCT)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(w.packets), "ns/pkt")
	b.ReportMetric(float64(w.packets)/float64(b.N), "pkts/op")
}

// RC and DC side by side: the same engine work with and without a target
// switch per message (DCSwitch: two DCTs alternating, so every message pays
// DISCONNECT, CONNECT and new initiator state at the DCT).
func BenchmarkRCSend8(b *testing.B)         { benchOp(b, qp.WRSend, 8) }
func BenchmarkDCSend8(b *testing.B)         { benchDC(b, qp.WRSend, 8, 1) }
func BenchmarkDCSend8Switch(b *testing.B)   { benchDC(b, qp.WRSend, 8, 2) }
func BenchmarkDCWrite64K(b *testing.B)      { benchDC(b, qp.WRRDMAWrite, 64<<10, 1) }
func BenchmarkDCWrite64Switch(b *testing.B) { benchDC(b, qp.WRRDMAWrite, 64, 2) }
func BenchmarkDCRead64K(b *testing.B)       { benchDC(b, qp.WRRDMARead, 64<<10, 1) }

// The DC data path allocates nothing per message, with or without target
// switches once the DCT has initiator state to reuse.
func TestDCSteadyStateAllocs(t *testing.T) {
	for _, c := range []struct {
		op         qp.WROpcode
		size, dcts int
	}{{qp.WRSend, 64, 1}, {qp.WRSend, 20000, 1}, {qp.WRRDMAWrite, 20000, 1}, {qp.WRRDMARead, 20000, 1},
		{qp.WRAtomicFetchAndAdd, 8, 1}, {qp.WRRDMAWrite, 64, 3}} {
		w := newDCWire(t, 1, c.dcts, 0)
		w.setOp(c.op, c.size)
		k := 0
		for i := 0; i < 30; i++ {
			w.one(t, 0, k%c.dcts)
			k++
		}
		if a := testing.AllocsPerRun(200, func() { w.one(t, 0, k%c.dcts); k++ }); a != 0 {
			t.Errorf("op %d size %d over %d DCTs: %v allocations per message", c.op, c.size, c.dcts, a)
		}
	}
}

// heapDelta runs f and returns the heap it left allocated.
func heapDelta(f func()) float64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	return float64(int64(m1.HeapAlloc) - int64(m0.HeapAlloc))
}

// One DCT serving 1,000 DCIs at once: every DCI holds a connection, the DCT
// holds state for each; then all disconnect and the state goes.
func TestDCTServes1000DCIs(t *testing.T) {
	const n = 1000
	w := newDCWire(t, n, 1, n)
	w.setOp(qp.WRRDMAWrite, 64)
	var perInit float64
	perInit = heapDelta(func() {
		for i := 0; i < n; i++ {
			w.sendWR.RemoteQPN = w.dcts[0].QPN()
			if err := w.dcis[i].PostSend(&w.sendWR); err != nil {
				t.Fatal(err)
			}
		}
		for k := 0; k < 8; k++ {
			w.move(w.a, w.b, &w.srcA)
			w.move(w.b, w.a, &w.srcB)
		}
	}) / n
	got := 0
	for {
		m := w.scq.Poll(w.wcs[:])
		for _, c := range w.wcs[:m] {
			if c.Status != qp.WCSuccess {
				t.Fatalf("%v", c.Status)
			}
		}
		got += m
		if m == 0 {
			break
		}
	}
	if got != n || w.dcts[0].DCTInitiators() != n {
		t.Fatalf("%d completions, %d initiators", got, w.dcts[0].DCTInitiators())
	}
	t.Logf("one DCT, %d DCIs connected: %.0f bytes of DCT state per initiator", n, perInit)
	// Idle DCIs disconnect; the DCT drops every initiator.
	w.n.Clock.T += 2 * qp.DCILinger
	w.a.Advance(w.n.Clock.T)
	w.move(w.a, w.b, &w.srcA)
	if k := w.dcts[0].DCTInitiators(); k != 0 {
		t.Fatalf("%d initiators after the DCIs went idle", k)
	}
}

// A pool of 128 DCIs reaching 10,000 DCTs round robin, as a cuObject server
// reaches its clients: every WRITE lands, and the DCTs hold no state once the
// DCIs go idle.
func TestDCIPoolReaches10000DCTs(t *testing.T) {
	nDCT := 10000
	if testing.Short() {
		nDCT = 1000
	}
	const nDCI = 128
	w := newDCWire(t, nDCI, nDCT, 0)
	w.setOp(qp.WRRDMAWrite, 64)
	start := time.Now()
	posted, done := 0, 0
	for posted < nDCT || done < posted {
		for i := 0; i < nDCI && posted < nDCT; i++ {
			// Two WRs per DCI per round, to different DCTs: the second waits
			// for the first to complete before the DCI switches.
			for k := 0; k < 2 && posted < nDCT; k++ {
				w.sendWR.RemoteQPN = w.dcts[posted].QPN()
				w.sendWR.ID = uint64(posted)
				w.sendWR.RemoteAddr = 0x10000 + uint64(posted%1000)*64
				if err := w.dcis[i].PostSend(&w.sendWR); err != nil {
					t.Fatal(err)
				}
				posted++
			}
		}
		for k := 0; k < 4; k++ {
			w.move(w.a, w.b, &w.srcA)
			w.move(w.b, w.a, &w.srcB)
		}
		for {
			m := w.scq.Poll(w.wcs[:])
			for _, c := range w.wcs[:m] {
				if c.Status != qp.WCSuccess {
					t.Fatalf("WR %d: %v", c.WRID, c.Status)
				}
			}
			done += m
			if m == 0 {
				break
			}
		}
	}
	el := time.Since(start)
	s := w.a.Stats().DC
	t.Logf("%d DCIs → %d DCTs: %d WRITEs in %v (%.0f/s), %d target switches, %d CONNECTs, %d DISCONNECTs",
		nDCI, nDCT, done, el, float64(done)/el.Seconds(), s.TargetSwitches, s.ConnectsSent, s.DisconnectsSent)
	if s.TargetSwitches < uint64(nDCT)-nDCI {
		t.Fatalf("%+v", s)
	}
	w.n.Clock.T += 2 * qp.DCILinger
	w.a.Advance(w.n.Clock.T)
	w.move(w.a, w.b, &w.srcA)
	held := 0
	for _, d := range w.dcts {
		held += d.DCTInitiators()
	}
	if held != 0 {
		t.Fatalf("%d initiators still held", held)
	}
}

// Memory per DCI and per DCT, against RC for the same fan-out.
func TestDCMemory(t *testing.T) {
	n, err := qptest.NewNet(qptest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pd, _ := n.A.E.AllocPD()
	cq, _ := n.A.E.CreateCQ(1024)
	srq, _ := pd.CreateSRQ(qp.SRQAttr{MaxWR: 16, MaxSGE: 1})
	const count = 500
	var keep []*qp.QP
	dci := heapDelta(func() {
		for i := 0; i < count; i++ {
			q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.DCI, SendCQ: cq, RecvCQ: cq,
				Cap: qp.QPCap{MaxSendWR: 128, MaxSendSGE: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if err := qptest.BringUpDCI(q, qptest.DefaultRC, 1); err != nil {
				t.Fatal(err)
			}
			keep = append(keep, q)
		}
	}) / count
	dct := heapDelta(func() {
		for i := 0; i < count; i++ {
			q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.DCT, SendCQ: cq, RecvCQ: cq, SRQ: srq, DC: qp.DCInitAttr{Key: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if err := qptest.BringUpDCT(q, qptest.DefaultRC); err != nil {
				t.Fatal(err)
			}
			keep = append(keep, q)
		}
	}) / count
	rc, rcUsed := idleQPBytes(t), usedQPBytes(t)
	// Per-initiator state at a DCT, from a DCT serving 1,000 DCIs. The
	// posts come first: they make the DCIs' send queues, which are not
	// the DCT's.
	w := newDCWire(t, 1000, 1, 1000)
	w.setOp(qp.WRRDMAWrite, 64)
	for i := range w.dcis {
		w.sendWR.RemoteQPN = w.dcts[0].QPN()
		_ = w.dcis[i].PostSend(&w.sendWR)
	}
	perInit := heapDelta(func() {
		for k := 0; k < 8; k++ {
			w.move(w.a, w.b, &w.srcA)
			w.move(w.b, w.a, &w.srcB)
		}
	}) / 1000
	runtime.KeepAlive(keep)
	runtime.KeepAlive(w)
	t.Logf("idle DCI (128 WRs, 1 SGE): %.0f bytes; idle DCT: %.0f bytes; DCT state per connected initiator: %.0f bytes; idle RC QP (128/128 WRs): %.0f bytes, %.0f once its rings are made",
		dci, dct, perInit, rc, rcUsed)
	t.Logf("fan-out to 10,000 peers, 128 initiators, all in use: RC needs 10,000 QPs per side ≈ %.1f MB; DC needs 128 DCIs, at most %.1f MB at the initiator and one DCT per peer (%.0f bytes + %.0f per connected initiator)",
		10000*rcUsed/1e6, 128*rcUsed/1e6, dct, perInit)
	// Queues are made on first use, so an idle RC QP is smaller than an
	// idle DCI (which also holds its DC state); a DCI's saving is in
	// their number. Per initiator, a DCT holds less than an RC QP in use.
	if dci > rcUsed || perInit > rcUsed {
		t.Fatalf("DC state larger than an RC QP in use")
	}
}
