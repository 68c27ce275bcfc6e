package roce

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// exerciseRC runs SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ and both
// atomics between a and b and checks every byte.
func exerciseRC(t testing.TB, a, b *endpoint, msg int) {
	t.Helper()
	const to = 20 * time.Second
	// SEND a → b.
	src := a.buf[:msg]
	fill(src, 1)
	if err := b.qp.PostRecv(&RecvWR{ID: 7, SGL: []SGE{b.mr.SGE(0, msg)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, msg)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCSend)
	wc := waitWC(t, b.rcq, to)
	wantOK(t, wc, WCRecv)
	if wc.WRID != 7 || int(wc.ByteLen) != msg || !bytes.Equal(b.buf[:msg], src) {
		t.Fatalf("SEND: wc %+v, data equal %v", wc, bytes.Equal(b.buf[:msg], src))
	}

	// WRITE a → b at offset msg.
	fill(src, 2)
	if err := a.qp.PostSend(&SendWR{ID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, msg)},
		RemoteAddr: b.mr.Addr() + uint64(msg), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCRDMAWrite)
	b.mr.Sync() // nothing on b's side reported the WRITE
	if !bytes.Equal(b.buf[msg:2*msg], src) {
		t.Fatal("WRITE: data differs")
	}

	// WRITE_WITH_IMM consumes a receive.
	fill(src, 3)
	if err := b.qp.PostRecv(&RecvWR{ID: 8}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 3, Opcode: WRRDMAWriteWithImm, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, msg)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey(), Imm: 0xdeadbeef}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCRDMAWrite)
	wc = waitWC(t, b.rcq, to)
	wantOK(t, wc, WCRecvRDMAWithImm)
	if wc.Flags&WCWithImm == 0 || wc.Imm != 0xdeadbeef || int(wc.ByteLen) != msg || !bytes.Equal(b.buf[:msg], src) {
		t.Fatalf("WRITE_WITH_IMM: %+v", wc)
	}

	// READ b → a: a reads b's region into a.buf[msg:].
	fill(b.buf[:msg], 4)
	b.mr.Sync() // publish to b's device before the READ fetches it
	if err := a.qp.PostSend(&SendWR{ID: 4, Opcode: WRRDMARead, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(msg, msg)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc = waitWC(t, a.scq, to)
	wantOK(t, wc, WCRDMARead)
	if !bytes.Equal(a.buf[msg:2*msg], b.buf[:msg]) {
		t.Fatal("READ: data differs")
	}

	// Atomics on b.buf[2*msg:] (8-byte aligned).
	off := (2*msg + 7) &^ 7
	binary.LittleEndian.PutUint64(b.buf[off:], 0)
	b.mr.Sync()
	if err := a.qp.PostSend(&SendWR{ID: 5, Opcode: WRAtomicFetchAndAdd, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(off, 8)},
		RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey(), CompareAdd: 5}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCFetchAdd)
	if err := a.qp.PostSend(&SendWR{ID: 6, Opcode: WRAtomicCmpAndSwp, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(off+8, 8)},
		RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey(), CompareAdd: 5, Swap: 42}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCCompSwap)
	b.mr.Sync()
	orig1, orig2 := atomicVal(a.buf[off:]), atomicVal(a.buf[off+8:])
	if orig1 != 0 || orig2 != 5 || atomicVal(b.buf[off:]) != 42 {
		t.Fatalf("atomics: fetch-add returned %d (want 0), cmp-swap returned %d (want 5), target %d (want 42)",
			orig1, orig2, atomicVal(b.buf[off:]))
	}
}

// atomicVal reads an atomic operand as the engine stores it (host order).
func atomicVal(b []byte) uint64 { return binary.NativeEndian.Uint64(b) }

func TestMemlinkRC(t *testing.T) {
	for _, size := range []int{1, 1000, 1024, 5000, 100000} {
		da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
		a := newEndpoint(t, da, RC, 4*size+64)
		b := newEndpoint(t, db, RC, 4*size+64)
		connect(t, a, b, addrA, addrB, ConnectAttr{})
		exerciseRC(t, a, b, size)
	}
}

func TestMemlinkRCLossy(t *testing.T) {
	cfg := faultnet.Config{Seed: 3, Loss: 0.05, Duplicate: 0.02, Reorder: 0.05, Corrupt: 0.02}
	cfg2 := cfg
	cfg2.Seed = 4
	da, db := memPair(t, cfg, cfg2, nil)
	a := newEndpoint(t, da, RC, 4*50000+64)
	b := newEndpoint(t, db, RC, 4*50000+64)
	// A short ACK timeout keeps the retransmissions quick.
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 8})
	exerciseRC(t, a, b, 50000)
	c := da.Counters()
	cb := db.Counters()
	if c.CompleterRetryErr+cb.CompleterRetryErr+c.Timeouts == 0 {
		t.Errorf("no retransmission counted under 5%% loss: %+v", c)
	}
	if c.ICRCErr+cb.ICRCErr == 0 {
		t.Errorf("no ICRC error counted under corruption: A %+v B %+v", c, cb)
	}
	t.Logf("A: %v", c.Map())
}
