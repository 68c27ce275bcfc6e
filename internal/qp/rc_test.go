package qp_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

// impairment is one network condition of the matrix.
type impairment struct {
	name string
	ab   faultnet.Config // requests
	ba   faultnet.Config // responses
}

func impairments() []impairment {
	d := 2 * time.Microsecond
	return []impairment{
		{"clean", faultnet.Config{Delay: d}, faultnet.Config{Delay: d}},
		{"loss1", faultnet.Config{Seed: 1, Loss: 0.01, Delay: d}, faultnet.Config{Seed: 2, Loss: 0.01, Delay: d}},
		{"loss10", faultnet.Config{Seed: 3, Loss: 0.10, Delay: d}, faultnet.Config{Seed: 4, Loss: 0.10, Delay: d}},
		{"reorder", faultnet.Config{Seed: 5, Reorder: 0.05, ReorderDepth: 3, Delay: d, Jitter: d},
			faultnet.Config{Seed: 6, Reorder: 0.05, ReorderDepth: 2, Delay: d}},
		{"dup", faultnet.Config{Seed: 7, Duplicate: 0.05, Delay: d}, faultnet.Config{Seed: 8, Duplicate: 0.05, Delay: d}},
		{"ackloss", faultnet.Config{Delay: d}, faultnet.Config{Seed: 9, Loss: 0.3, Delay: d}},
		// The round trip (100 ms) exceeds the 67 ms ACK timeout: spurious
		// retransmissions everywhere, which must stay harmless.
		{"slow", faultnet.Config{Delay: 50 * time.Millisecond}, faultnet.Config{Delay: 50 * time.Millisecond}},
		{"mixed", faultnet.Config{Seed: 10, Loss: 0.03, Duplicate: 0.02, Reorder: 0.03, Corrupt: 0.01, Delay: d, Jitter: d},
			faultnet.Config{Seed: 11, Loss: 0.03, Duplicate: 0.02, Reorder: 0.03, Delay: d}},
	}
}

// pair is a connected RC (or UC/UD) QP pair on a qptest.Net.
type pair struct {
	t    testing.TB
	net  *qptest.Net
	a, b *qptest.Endpoint
}

func newPair(t testing.TB, typ qp.QPType, imp impairment, p qptest.RCParams, depth int) *pair {
	t.Helper()
	n, err := qptest.NewNet(qptest.Options{AtoB: imp.ab, BtoA: imp.ba, PortMTU: ib.MTU4096})
	if err != nil {
		t.Fatal(err)
	}
	a, err := qptest.NewEndpoint(n.A.E, typ, depth)
	if err != nil {
		t.Fatal(err)
	}
	b, err := qptest.NewEndpoint(n.B.E, typ, depth)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Connect(a.QP, b.QP, p); err != nil {
		t.Fatal(err)
	}
	return &pair{t: t, net: n, a: a, b: b}
}

func (p *pair) regMR(ep *qptest.Endpoint, buf []byte, iova uint64, acc qp.Access) *qp.MR {
	p.t.Helper()
	mr, err := ep.PD.RegMR(buf, iova, acc)
	if err != nil {
		p.t.Fatal(err)
	}
	return mr
}

// pollAll drains a CQ into a slice.
func pollAll(cq *qp.CQ, into []qp.WorkCompletion) []qp.WorkCompletion {
	var wc [16]qp.WorkCompletion
	for {
		n := cq.Poll(wc[:])
		into = append(into, wc[:n]...)
		if n < len(wc) {
			return into
		}
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

const allAccess = qp.AccessLocalWrite | qp.AccessRemoteWrite | qp.AccessRemoteRead | qp.AccessRemoteAtomic

type opCase struct {
	name string
	op   qp.WROpcode
}

var rcOps = []opCase{
	{"send", qp.WRSend}, {"send_imm", qp.WRSendWithImm}, {"send_inv", qp.WRSendWithInv}, {"write", qp.WRRDMAWrite},
	{"write_imm", qp.WRRDMAWriteWithImm}, {"read", qp.WRRDMARead},
}

// runMessages posts msgs messages of the given sizes from A to B (or reads from
// B) and checks data, completions and their order.
func runMessages(t *testing.T, p *pair, op qp.WROpcode, sizes []int, limit time.Duration) {
	t.Helper()
	total := 0
	for _, s := range sizes {
		total += s
	}
	srcBuf := make([]byte, total+1)
	dstBuf := make([]byte, total+1)
	// Data lives where the operation reads it.
	fill(srcBuf, uint64(total)*31+uint64(op))
	var aMR, bMR *qp.MR
	if op == qp.WRRDMARead {
		aMR = p.regMR(p.a, dstBuf, 0x1000, qp.AccessLocalWrite)
		bMR = p.regMR(p.b, srcBuf, 0x7000_0000, allAccess)
	} else {
		aMR = p.regMR(p.a, srcBuf, 0x1000, qp.AccessLocalWrite)
		bMR = p.regMR(p.b, dstBuf, 0x7000_0000, allAccess)
	}
	needRecv := op == qp.WRSend || op == qp.WRSendWithImm || op == qp.WRSendWithInv || op == qp.WRRDMAWriteWithImm
	// SEND_WITH_INV: every message invalidates its own region at B.
	var invMRs []*qp.MR
	if op == qp.WRSendWithInv {
		for range sizes {
			invMRs = append(invMRs, p.regMR(p.b, make([]byte, 8), 0x100, allAccess))
		}
	}
	off := 0
	posted := 0
	next := 0
	var aWC, bWC []qp.WorkCompletion
	post := func() {
		for next < len(sizes) {
			s := sizes[next]
			o := 0
			for _, x := range sizes[:next] {
				o += x
			}
			if needRecv {
				rwr := qp.RecvWR{ID: uint64(1000 + next), SGL: []qp.SGE{{Addr: 0x7000_0000 + uint64(o), Length: uint32(s), LKey: bMR.LKey()}}}
				if err := p.b.QP.PostRecv(&rwr); err != nil {
					return
				}
			}
			wr := qp.SendWR{ID: uint64(next), Opcode: op, Flags: qp.SendSignaled, Imm: uint32(0xA0000000 + next),
				SGL:        []qp.SGE{{Addr: 0x1000 + uint64(o), Length: uint32(s), LKey: aMR.LKey()}},
				RemoteAddr: 0x7000_0000 + uint64(o), RKey: bMR.RKey()}
			if op == qp.WRSend || op == qp.WRSendWithImm || op == qp.WRSendWithInv {
				wr.RemoteAddr, wr.RKey = 0, 0
			}
			if op == qp.WRSendWithInv {
				wr.InvalidateRKey = invMRs[next].RKey()
			}
			if err := p.a.QP.PostSend(&wr); err != nil {
				if needRecv {
					t.Fatalf("recv posted but send refused: %v", err)
				}
				return
			}
			next++
			posted++
		}
	}
	_ = off
	done := func() bool {
		aWC = pollAll(p.a.SCQ, aWC)
		bWC = pollAll(p.b.RCQ, bWC)
		post()
		return len(aWC) == len(sizes) && (!needRecv || len(bWC) == len(sizes))
	}
	if err := p.net.Run(done, limit); err != nil {
		t.Fatalf("%v (A completions %d/%d, B %d; A stats %+v; B stats %+v)", err, len(aWC), len(sizes), len(bWC),
			p.net.A.E.Stats(), p.net.B.E.Stats())
	}
	for i, wc := range aWC {
		if wc.WRID != uint64(i) || wc.Status != qp.WCSuccess {
			t.Fatalf("A completion %d: %+v (status %v)", i, wc, wc.Status)
		}
		if wc.ByteLen != uint32(sizes[i]) {
			t.Fatalf("A completion %d ByteLen %d want %d", i, wc.ByteLen, sizes[i])
		}
	}
	if needRecv {
		for i, wc := range bWC {
			if wc.WRID != uint64(1000+i) || wc.Status != qp.WCSuccess {
				t.Fatalf("B completion %d: %+v (status %v)", i, wc, wc.Status)
			}
			if wc.ByteLen != uint32(sizes[i]) {
				t.Fatalf("B completion %d ByteLen %d want %d", i, wc.ByteLen, sizes[i])
			}
			wantOp := qp.WCRecv
			if op == qp.WRRDMAWriteWithImm {
				wantOp = qp.WCRecvRDMAWithImm
			}
			if wc.Opcode != wantOp {
				t.Fatalf("B completion %d opcode %v", i, wc.Opcode)
			}
			if (op == qp.WRSendWithImm || op == qp.WRRDMAWriteWithImm) && (wc.Flags&qp.WCWithImm == 0 || wc.Imm != uint32(0xA0000000+i)) {
				t.Fatalf("B completion %d imm %#x flags %v", i, wc.Imm, wc.Flags)
			}
			if op == qp.WRSendWithInv && (wc.Flags&qp.WCWithInv == 0 || wc.InvalidatedRKey != invMRs[i].RKey() || invMRs[i].Valid()) {
				t.Fatalf("B completion %d: invalidated key %#x flags %v", i, wc.InvalidatedRKey, wc.Flags)
			}
		}
	}
	if !bytes.Equal(srcBuf[:total], dstBuf[:total]) {
		for i := range total {
			if srcBuf[i] != dstBuf[i] {
				t.Fatalf("data differs at byte %d of %d", i, total)
			}
		}
	}
	if dstBuf[total] != 0 {
		t.Fatal("byte after the last message was written")
	}
	// Nothing left over.
	if n := p.a.SCQ.Len() + p.b.RCQ.Len(); n != 0 {
		t.Fatalf("%d extra completions", n)
	}
	sa, sb := p.net.A.E.Stats(), p.net.B.E.Stats()
	ab, ba := p.net.Pipes()
	t.Logf("fake time %v; A: %+v; B: %+v; A→B %+v; B→A %+v", p.net.Clock.T, sa, sb, ab.Stats(), ba.Stats())
	if ab.Stats().Dropped+ba.Stats().Dropped > 0 && sa.Retransmits == 0 {
		t.Fatal("packets were lost but the requester never retransmitted")
	}
}

func TestRCOperationsMatrix(t *testing.T) {
	small := []int{0, 1, 3, 255, 1024, 1025, 4096, 12289}
	big := []int{1 << 20, 3<<20 + 5}
	for _, imp := range impairments() {
		for _, oc := range rcOps {
			for _, mtu := range []ib.MTU{ib.MTU1024, ib.MTU4096} {
				name := fmt.Sprintf("%s/%s/mtu%d", imp.name, oc.name, mtu.Bytes())
				t.Run(name, func(t *testing.T) {
					prm := qptest.DefaultRC
					prm.MTU = mtu
					// Start near the top of the PSN space so every run wraps.
					prm.PSNA, prm.PSNB = 0xFFFFF0, 0xFFFF80
					p := newPair(t, qp.RC, imp, prm, 64)
					// Every message size under every impairment; -short keeps
					// the multi-MiB messages for the clean network only.
					sizes := append(append([]int{}, small...), big...)
					if testing.Short() && imp.name != "clean" {
						sizes = small
					}
					runMessages(t, p, oc.op, sizes, 10*time.Minute)
				})
			}
		}
	}
}

// TestRCAtomicsExactlyOnce checks that a FETCH_ADD counter ends at exactly the
// sum of the adds and that each returned original value is the running sum,
// under every impairment: an atomic must never run twice.
func TestRCAtomicsExactlyOnce(t *testing.T) {
	for _, imp := range impairments() {
		t.Run(imp.name, func(t *testing.T) {
			prm := qptest.DefaultRC
			prm.PSNA, prm.PSNB = 0xFFFFFA, 0x10
			p := newPair(t, qp.RC, imp, prm, 64)
			counter := make([]byte, 24)
			results := make([]byte, 8*200)
			bMR := p.regMR(p.b, counter, 0x4000, allAccess)
			aMR := p.regMR(p.a, results, 0x9000, qp.AccessLocalWrite)
			const n = 200
			next := 0
			var wcs []qp.WorkCompletion
			done := func() bool {
				wcs = pollAll(p.a.SCQ, wcs)
				for next < n {
					wr := qp.SendWR{ID: uint64(next), Opcode: qp.WRAtomicFetchAndAdd, Flags: qp.SendSignaled,
						SGL:        []qp.SGE{{Addr: 0x9000 + uint64(8*next), Length: 8, LKey: aMR.LKey()}},
						RemoteAddr: 0x4008, RKey: bMR.RKey(), CompareAdd: uint64(next + 1)}
					if next%2 == 1 {
						// Compare-and-swap that always succeeds: the expected value is known.
						wr.Opcode = qp.WRAtomicCmpAndSwp
						sum := uint64(next) * uint64(next+1) / 2
						wr.CompareAdd, wr.Swap = sum, sum+uint64(next+1)
					}
					if p.a.QP.PostSend(&wr) != nil {
						break
					}
					next++
				}
				return len(wcs) == n
			}
			if err := p.net.Run(done, 10*time.Minute); err != nil {
				t.Fatalf("%v after %d completions", err, len(wcs))
			}
			var sum uint64
			for i, wc := range wcs {
				if wc.Status != qp.WCSuccess || wc.WRID != uint64(i) {
					t.Fatalf("completion %d: %+v", i, wc)
				}
				if got := binary.NativeEndian.Uint64(results[8*i:]); got != sum {
					t.Fatalf("op %d returned original %d, want %d", i, got, sum)
				}
				sum += uint64(i + 1)
			}
			if got := binary.NativeEndian.Uint64(counter[8:]); got != sum {
				t.Fatalf("counter %d, want %d", got, sum)
			}
			if binary.NativeEndian.Uint64(counter[0:]) != 0 || binary.NativeEndian.Uint64(counter[16:]) != 0 {
				t.Fatal("atomic touched a neighbouring word")
			}
		})
	}
}

// TestRCAtomicWrite runs ATOMIC_WRITE under every impairment: each 8-byte
// value lands in its slot, answered by an empty READ_RESPONSE_ONLY.
func TestRCAtomicWrite(t *testing.T) {
	for _, imp := range impairments() {
		t.Run(imp.name, func(t *testing.T) {
			prm := qptest.DefaultRC
			prm.RdAtomic = 4
			p := newPair(t, qp.RC, imp, prm, 32)
			const n = 100
			remote := make([]byte, 8*n+8)
			local := make([]byte, 8*n)
			for i := 0; i < n; i++ {
				binary.BigEndian.PutUint64(local[8*i:], uint64(i)*0x0101010101010101+7)
			}
			bMR := p.regMR(p.b, remote, 0x8000, allAccess)
			aMR := p.regMR(p.a, local, 0, qp.AccessLocalWrite)
			next := 0
			var wcs []qp.WorkCompletion
			done := func() bool {
				wcs = pollAll(p.a.SCQ, wcs)
				for next < n {
					wr := qp.SendWR{ID: uint64(next), Opcode: qp.WRAtomicWrite, Flags: qp.SendSignaled,
						SGL: []qp.SGE{{Addr: uint64(8 * next), Length: 8, LKey: aMR.LKey()}}, RemoteAddr: 0x8000 + uint64(8*next), RKey: bMR.RKey()}
					if next%3 == 0 {
						wr.Flags |= qp.SendInline
						wr.Inline = local[8*next : 8*next+8]
					}
					if p.a.QP.PostSend(&wr) != nil {
						break
					}
					next++
				}
				return len(wcs) == n
			}
			if err := p.net.Run(done, time.Minute); err != nil {
				t.Fatal(err)
			}
			for i, wc := range wcs {
				if wc.Status != qp.WCSuccess || wc.WRID != uint64(i) || wc.Opcode != qp.WCAtomicWrite {
					t.Fatalf("completion %d: %+v", i, wc)
				}
			}
			if !bytes.Equal(remote[:8*n], local) || binary.BigEndian.Uint64(remote[8*n:]) != 0 {
				t.Fatal("ATOMIC_WRITE data differs")
			}
		})
	}
}

func TestRCFlush(t *testing.T) {
	for _, imp := range []impairment{cleanNet, impairments()[2]} {
		t.Run(imp.name, func(t *testing.T) {
			p := newPair(t, qp.RC, imp, qptest.DefaultRC, 16)
			bMR := p.regMR(p.b, make([]byte, 4096), 0x9000, qp.AccessLocalWrite|qp.AccessRemoteWrite|qp.AccessFlushGlobal)
			for i := 0; i < 10; i++ {
				wr := qp.SendWR{ID: uint64(i), Opcode: qp.WRFlush, Flags: qp.SendSignaled, RemoteAddr: 0x9000 + uint64(i*100), RKey: bMR.RKey(),
					FlushLen: 100, FlushPlacement: 1, FlushLevel: uint8(i % 2)}
				if err := p.a.QP.PostSend(&wr); err != nil {
					t.Fatal(err)
				}
			}
			wcs := waitWC(t, p, p.a.SCQ, 10, time.Minute)
			for i, wc := range wcs {
				if wc.Status != qp.WCSuccess || wc.WRID != uint64(i) || wc.Opcode != qp.WCFlush {
					t.Fatalf("completion %d: %+v", i, wc)
				}
			}
			// Persistence is never granted.
			wr := qp.SendWR{ID: 99, Opcode: qp.WRFlush, Flags: qp.SendSignaled, RemoteAddr: 0x9000, RKey: bMR.RKey(), FlushLen: 8, FlushPlacement: 2}
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			expectStatus(t, waitWC(t, p, p.a.SCQ, 1, time.Minute)[0], 99, qp.WCRemAccessErr)
		})
	}
}
