package qp_test

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

// workload drives random operations from one endpoint to its peer and checks
// every result.
type workload struct {
	t            *testing.T
	rng          *rand.Rand
	me, peer     *qptest.Endpoint
	n            int // operations to run
	posted, done int

	// Local memory: per-op slots for outgoing data and READ/atomic results.
	local   []byte
	localMR *qp.MR
	// Peer memory: write targets (per-op slots), a read-only source, a counter,
	// and receive buffers.
	peerWrite   []byte
	peerWriteMR *qp.MR
	peerSrc     []byte
	peerSrcMR   *qp.MR
	counter     []byte
	counterMR   *qp.MR
	recvBuf     []byte
	recvMR      *qp.MR

	ops       []soakOp
	recvDone  int
	sumAdds   uint64
	recvWC    []qp.WorkCompletion
	sendWC    []qp.WorkCompletion
	recvsPost int
}

type soakOp struct {
	op     qp.WROpcode
	size   int
	srcOff int // READ: offset into peerSrc
	add    uint64
	recv   int // index of the receive it consumes, -1 if none
}

const (
	soakSlot = 32 << 10
	soakOps  = 250
)

func newWorkload(t *testing.T, seed uint64, me, peer *qptest.Endpoint, n int) *workload {
	w := &workload{t: t, rng: rand.New(rand.NewPCG(seed, 7)), me: me, peer: peer, n: n}
	var err error
	w.local = make([]byte, n*soakSlot)
	fill(w.local, seed)
	if w.localMR, err = me.PD.RegMR(w.local, 0x10_0000_0000, qp.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	w.peerWrite = make([]byte, n*soakSlot)
	w.peerWriteMR, _ = peer.PD.RegMR(w.peerWrite, 0x20_0000_0000, allAccess|qp.AccessFlushGlobal)
	w.peerSrc = make([]byte, 1<<20)
	fill(w.peerSrc, seed+1)
	w.peerSrcMR, _ = peer.PD.RegMR(w.peerSrc, 0x30_0000_0000, qp.AccessRemoteRead)
	w.counter = make([]byte, 8)
	w.counterMR, _ = peer.PD.RegMR(w.counter, 0x40_0000_0000, allAccess)
	w.recvBuf = make([]byte, n*soakSlot)
	w.recvMR, _ = peer.PD.RegMR(w.recvBuf, 0x50_0000_0000, qp.AccessLocalWrite)
	return w
}

func (w *workload) next() soakOp {
	o := soakOp{recv: -1}
	size := func() int {
		switch w.rng.IntN(4) {
		case 0:
			return w.rng.IntN(64)
		case 1:
			return w.rng.IntN(5000)
		default:
			return w.rng.IntN(soakSlot)
		}
	}
	switch w.rng.IntN(9) {
	case 8:
		o.op, o.size = qp.WRFlush, 0
	case 7:
		o.op, o.size = qp.WRAtomicWrite, 8
	case 0:
		o.op, o.size = qp.WRSend, size()
	case 1:
		o.op, o.size = qp.WRSendWithImm, size()
	case 2:
		o.op, o.size = qp.WRRDMAWrite, size()
	case 3:
		o.op, o.size = qp.WRRDMAWriteWithImm, size()
	case 4:
		o.op, o.size = qp.WRRDMARead, size()
		o.srcOff = w.rng.IntN(len(w.peerSrc) - o.size)
	default:
		o.op, o.size, o.add = qp.WRAtomicFetchAndAdd, 8, uint64(w.rng.IntN(1000)+1)
	}
	return o
}

// post posts as many operations as the queues take.
func (w *workload) post() {
	for w.posted < w.n {
		i := w.posted
		if len(w.ops) == i {
			w.ops = append(w.ops, w.next())
		}
		o := &w.ops[i]
		slot := uint64(i * soakSlot)
		if o.op == qp.WRSend || o.op == qp.WRSendWithImm || o.op == qp.WRRDMAWriteWithImm {
			if o.recv < 0 {
				rwr := qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x50_0000_0000 + slot, Length: soakSlot, LKey: w.recvMR.LKey()}}}
				if err := w.peer.QP.PostRecv(&rwr); err != nil {
					return
				}
				o.recv = w.recvsPost
				w.recvsPost++
			}
		}
		wr := qp.SendWR{ID: uint64(i), Opcode: o.op, Flags: qp.SendSignaled, Imm: uint32(i),
			SGL: []qp.SGE{{Addr: 0x10_0000_0000 + slot, Length: uint32(o.size), LKey: w.localMR.LKey()}}}
		if o.op == qp.WRFlush {
			wr.SGL = nil
			wr.RemoteAddr, wr.RKey = 0x20_0000_0000+slot, w.peerWriteMR.RKey()
			wr.FlushLen, wr.FlushPlacement, wr.FlushLevel = soakSlot, 1, uint8(i%2)
		}
		switch o.op {
		case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm, qp.WRAtomicWrite:
			wr.RemoteAddr, wr.RKey = 0x20_0000_0000+slot, w.peerWriteMR.RKey()
		case qp.WRRDMARead:
			wr.RemoteAddr, wr.RKey = 0x30_0000_0000+uint64(o.srcOff), w.peerSrcMR.RKey()
		case qp.WRAtomicFetchAndAdd:
			wr.RemoteAddr, wr.RKey, wr.CompareAdd = 0x40_0000_0000, w.counterMR.RKey(), o.add
		}
		if err := w.me.QP.PostSend(&wr); err != nil {
			return
		}
		w.posted++
	}
}

func (w *workload) finished() bool {
	w.sendWC = pollAll(w.me.SCQ, w.sendWC)
	w.recvWC = pollAll(w.peer.RCQ, w.recvWC)
	w.post()
	return len(w.sendWC) == w.n && len(w.recvWC) == w.recvsPost
}

func (w *workload) check() {
	t := w.t
	for i, wc := range w.sendWC {
		if wc.WRID != uint64(i) || wc.Status != qp.WCSuccess {
			t.Fatalf("send completion %d: %+v (%v)", i, wc, wc.Status)
		}
	}
	var sum uint64
	for i, o := range w.ops {
		slot := i * soakSlot
		mine := w.local[slot : slot+o.size]
		switch o.op {
		case qp.WRRDMAWrite, qp.WRRDMAWriteWithImm, qp.WRAtomicWrite:
			if !bytes.Equal(w.peerWrite[slot:slot+o.size], mine) {
				t.Fatalf("op %d WRITE of %d bytes: data differs", i, o.size)
			}
		case qp.WRRDMARead:
			if !bytes.Equal(mine, w.peerSrc[o.srcOff:o.srcOff+o.size]) {
				t.Fatalf("op %d READ of %d bytes: data differs", i, o.size)
			}
		case qp.WRAtomicFetchAndAdd:
			if got := binary.NativeEndian.Uint64(mine); got != sum {
				t.Fatalf("op %d FETCH_ADD returned %d, want %d", i, got, sum)
			}
			sum += o.add
		}
		if o.recv >= 0 {
			wc := w.recvWC[o.recv]
			if wc.Status != qp.WCSuccess || wc.WRID != uint64(i) {
				t.Fatalf("op %d: receive completion %+v", i, wc)
			}
			if o.op == qp.WRRDMAWriteWithImm {
				if wc.Opcode != qp.WCRecvRDMAWithImm || wc.Imm != uint32(i) || wc.ByteLen != uint32(o.size) {
					t.Fatalf("op %d WRITE_IMM completion %+v", i, wc)
				}
			} else {
				if wc.Opcode != qp.WCRecv || wc.ByteLen != uint32(o.size) || !bytes.Equal(w.recvBuf[slot:slot+o.size], mine) {
					t.Fatalf("op %d SEND completion %+v, data equal %v", i, wc, bytes.Equal(w.recvBuf[slot:slot+o.size], mine))
				}
				if (o.op == qp.WRSendWithImm) != (wc.Flags&qp.WCWithImm != 0) {
					t.Fatalf("op %d imm flag", i)
				}
			}
		}
	}
	if got := binary.NativeEndian.Uint64(w.counter); got != sum {
		t.Fatalf("counter %d, want %d", got, sum)
	}
}

var (
	soakSeeds  = flag.Int("qp.soakseeds", 0, "extra random-seed rounds for TestRCSoak (each with fresh impairment seeds)")
	soakOpsArg = flag.Int("qp.soakops", soakOps, "operations per direction and QP pair in TestRCSoak")
)

// checkWire watches every packet and checks two invariants the transport
// must keep whatever the network does: a requester never sends two different
// requests with the same PSN, and a responder only answers a PSN with the kind
// of response its request calls for.
func checkWire(t *testing.T, n *qptest.Net, loads []*workload, mtu ib.MTU) {
	type key struct {
		from string
		qpn  uint32
		psn  ib.PSN
	}
	type req struct {
		op  ib.Opcode
		npk uint32
	}
	seen := map[key]req{}
	peerOf := map[uint32]uint32{}
	for _, l := range loads {
		peerOf[l.me.QP.QPN()] = l.peer.QP.QPN()
	}
	var p ib.Packet
	n.Tap = func(from string, b []byte) {
		if ib.ParseIB(b, &p) != nil {
			return
		}
		op := p.BTH.Opcode()
		low := uint8(op) & 0x1F
		if low < 0x0D || low > 0x12 {
			r := req{op: op, npk: 1}
			if op == ib.RCReadRequest {
				m := uint32(mtu.Bytes())
				r.npk = max(1, (p.RETH.DMALen()+m-1)/m)
			}
			k := key{from, p.BTH.DestQP(), p.BTH.PSN()}
			if prev, ok := seen[k]; ok && prev.op != op {
				t.Fatalf("%s to QP %#x: PSN %#x sent as %v and as %v", from, k.qpn, k.psn, prev.op, op)
			}
			seen[k] = r
			return
		}
		if low == 0x11 {
			return // ACK/NAK: any PSN
		}
		other := "A"
		if from == "A" {
			other = "B"
		}
		qpn := peerOf[p.BTH.DestQP()]
		psn := p.BTH.PSN()
		at, ok := seen[key{other, qpn, psn}]
		switch {
		case low == 0x12:
			if ok && at.op != ib.RCFetchAdd && at.op != ib.RCCompareSwap {
				t.Fatalf("%s answered %v at PSN %#x with an atomic ACK", from, at.op, psn)
			}
		case ok && (at.op == ib.RCAtomicWrite || at.op == ib.RCFlush || at.op == ib.RCReadRequest):
		default:
			// A READ response must fall inside an earlier READ request's range.
			for d := uint32(1); d < 2048; d++ {
				if r, ok := seen[key{other, qpn, psn.Add(ib.PSNMask + 1 - d)}]; ok && r.op == ib.RCReadRequest && d < r.npk {
					return
				}
			}
			t.Fatalf("%s sent %v at PSN %#x, which no READ covers (request there: %v)", from, op, psn, at.op)
		}
	}
}

// TestRCSoak runs random mixes of every RC operation in both directions at
// once, on two QP pairs sharing the engines, over impaired links.
func TestRCSoak(t *testing.T) {
	d := time.Microsecond
	type netCase struct {
		name   string
		seed   uint64
		ab, ba faultnet.Config
	}
	cases := []netCase{
		{"clean", 0, faultnet.Config{Delay: d}, faultnet.Config{Delay: d}},
		{"loss5", 0, faultnet.Config{Seed: 31, Loss: 0.05, Delay: d, Jitter: d}, faultnet.Config{Seed: 32, Loss: 0.05, Delay: d}},
		{"everything", 0, faultnet.Config{Seed: 33, Loss: 0.03, Duplicate: 0.03, Reorder: 0.03, ReorderDepth: 4, Corrupt: 0.01, Delay: d, Jitter: 3 * d},
			faultnet.Config{Seed: 34, Loss: 0.03, Duplicate: 0.03, Reorder: 0.03, Corrupt: 0.01, Delay: d}},
	}
	// Found by -qp.soakseeds: a recycled responder resource whose replayed
	// response was still queued answered a later PSN.
	cases = append(cases, netCase{"recycled-resource", 1006,
		faultnet.Config{Seed: 1006, Loss: 0.04, Duplicate: 0.02, Reorder: 0.04, ReorderDepth: 4, Corrupt: 0.01, Delay: d, Jitter: 2 * d},
		faultnet.Config{Seed: 1007, Loss: 0.04, Duplicate: 0.02, Reorder: 0.02, Corrupt: 0.01, Delay: d}})
	for i := 1; i <= *soakSeeds; i++ {
		s := uint64(1000 + 2*i)
		cases = append(cases, netCase{fmt.Sprintf("seed%d", i), s,
			faultnet.Config{Seed: s, Loss: 0.04, Duplicate: 0.02, Reorder: 0.04, ReorderDepth: 1 + i%5, Corrupt: 0.01, Delay: d, Jitter: 2 * d},
			faultnet.Config{Seed: s + 1, Loss: 0.04, Duplicate: 0.02, Reorder: 0.02, Corrupt: 0.01, Delay: d}})
	}
	for _, c := range cases {
		for _, mtu := range []ib.MTU{ib.MTU256, ib.MTU1024, ib.MTU4096} {
			t.Run(fmt.Sprintf("%s/mtu%d", c.name, mtu.Bytes()), func(t *testing.T) {
				n, err := qptest.NewNet(qptest.Options{AtoB: c.ab, BtoA: c.ba, PortMTU: ib.MTU4096})
				if err != nil {
					t.Fatal(err)
				}
				ops := *soakOpsArg
				if testing.Short() {
					ops = 40
				}
				var loads []*workload
				for k := 0; k < 2; k++ {
					a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 32)
					b, _ := qptest.NewEndpoint(n.B.E, qp.RC, 32)
					prm := qptest.DefaultRC
					prm.MTU = mtu
					prm.RdAtomic = 4
					prm.MinRNRTimer = 1
					prm.PSNA, prm.PSNB = 0xFFFF00+uint32(k), 0xFFFFFF-uint32(k)
					if err := n.Connect(a.QP, b.QP, prm); err != nil {
						t.Fatal(err)
					}
					loads = append(loads, newWorkload(t, c.seed+uint64(10*k+1), a, b, ops), newWorkload(t, c.seed+uint64(10*k+2), b, a, ops))
				}
				checkWire(t, n, loads, mtu)
				err = n.Run(func() bool {
					all := true
					for _, l := range loads {
						if !l.finished() {
							all = false
						}
					}
					return all
				}, time.Hour)
				if err != nil {
					for i, l := range loads {
						t.Logf("load %d: %d/%d sends, %d/%d recvs, QP state %v", i, len(l.sendWC), l.n, len(l.recvWC), l.recvsPost, l.me.QP.State())
						for k, wc := range l.sendWC {
							if wc.Status != qp.WCSuccess {
								t.Logf("  first failed send completion #%d: %+v (%v), op %v size %d", k, wc, wc.Status, l.ops[wc.WRID].op, l.ops[wc.WRID].size)
								break
							}
						}
						for k, wc := range l.recvWC {
							if wc.Status != qp.WCSuccess {
								t.Logf("  first failed recv completion #%d: %+v (%v)", k, wc, wc.Status)
								break
							}
						}
					}
					t.Fatal(err)
				}
				for _, l := range loads {
					l.check()
				}
				t.Logf("fake time %v, A %+v", n.Clock.T, n.A.E.Stats())
			})
		}
	}
}
