package qp_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

var cleanNet = impairment{"clean", faultnet.Config{Delay: time.Microsecond}, faultnet.Config{Delay: time.Microsecond}}

// waitWC runs the network until cq holds n completions and returns them.
func waitWC(t *testing.T, p *pair, cq *qp.CQ, n int, limit time.Duration) []qp.WorkCompletion {
	t.Helper()
	var wcs []qp.WorkCompletion
	err := p.net.Run(func() bool {
		wcs = pollAll(cq, wcs)
		return len(wcs) >= n
	}, limit)
	if err != nil {
		t.Fatalf("%v: have %d of %d completions: %+v", err, len(wcs), n, wcs)
	}
	return wcs
}

func expectStatus(t *testing.T, wc qp.WorkCompletion, id uint64, st qp.WCStatus) {
	t.Helper()
	if wc.WRID != id || wc.Status != st {
		t.Fatalf("completion %+v: want WRID %d status %q, got status %q", wc, id, st, wc.Status)
	}
}

func TestRemoteAccessErrors(t *testing.T) {
	cases := []struct {
		name string
		op   qp.WROpcode
		mod  func(addr *uint64, rkey *uint32, length *uint32)
	}{
		{"write-bad-rkey", qp.WRRDMAWrite, func(a *uint64, k *uint32, l *uint32) { *k ^= 0x100 }},
		{"write-past-end", qp.WRRDMAWrite, func(a *uint64, k *uint32, l *uint32) { *a += 4096 - 10 }},
		{"write-before-start", qp.WRRDMAWrite, func(a *uint64, k *uint32, l *uint32) { *a -= 1 }},
		{"write-wrapping-va", qp.WRRDMAWrite, func(a *uint64, k *uint32, l *uint32) { *a = ^uint64(0) - 5 }},
		{"read-past-end", qp.WRRDMARead, func(a *uint64, k *uint32, l *uint32) { *a += 4000 }},
		{"read-bad-rkey", qp.WRRDMARead, func(a *uint64, k *uint32, l *uint32) { *k = 0 }},
		{"atomic-past-end", qp.WRAtomicFetchAndAdd, func(a *uint64, k *uint32, l *uint32) { *a += 4096; *l = 8 }},
		{"write-no-access", qp.WRRDMAWrite, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
			local := make([]byte, 4096)
			remote := make([]byte, 4096+16)
			acc := allAccess
			if c.mod == nil {
				acc = qp.AccessLocalWrite | qp.AccessRemoteRead // no remote write on the MR
			}
			aMR := p.regMR(p.a, local, 0x1000, qp.AccessLocalWrite)
			bMR := p.regMR(p.b, remote[8:4096+8], 0x20000, acc)
			addr, rkey, length := uint64(0x20000), bMR.RKey(), uint32(100)
			if c.mod != nil {
				c.mod(&addr, &rkey, &length)
			}
			wr := qp.SendWR{ID: 1, Opcode: c.op, Flags: qp.SendSignaled, RemoteAddr: addr, RKey: rkey,
				SGL: []qp.SGE{{Addr: 0x1000, Length: length, LKey: aMR.LKey()}}, CompareAdd: 1}
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			wr.ID = 2
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			wcs := waitWC(t, p, p.a.SCQ, 2, time.Second)
			expectStatus(t, wcs[0], 1, qp.WCRemAccessErr)
			expectStatus(t, wcs[1], 2, qp.WCWRFlushErr)
			if p.a.QP.State() != qp.StateErr || p.b.QP.State() != qp.StateErr {
				t.Fatalf("states %v / %v, want ERR / ERR", p.a.QP.State(), p.b.QP.State())
			}
			// Guard bytes around the remote MR are untouched.
			for i := 0; i < 8; i++ {
				if remote[i] != 0 || remote[4096+8+i] != 0 {
					t.Fatal("write outside the MR")
				}
			}
			// After the error state, new WRs are flushed.
			wr.ID = 3
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			wcs = pollAll(p.a.SCQ, nil)
			if len(wcs) != 1 {
				t.Fatalf("got %d completions after posting in ERR", len(wcs))
			}
			expectStatus(t, wcs[0], 3, qp.WCWRFlushErr)
		})
	}
}

func TestStaleRKeyAfterDereg(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
	local := make([]byte, 64)
	aMR := p.regMR(p.a, local, 0x1000, qp.AccessLocalWrite)
	old := p.regMR(p.b, make([]byte, 64), 0x5000, allAccess)
	oldKey := old.RKey()
	if err := old.Dereg(); err != nil {
		t.Fatal(err)
	}
	// Churn registrations so slots get reused; no new key may equal the old one.
	for i := 0; i < 3000; i++ {
		mr := p.regMR(p.b, make([]byte, 64), 0x5000, allAccess)
		if mr.RKey() == oldKey {
			t.Fatalf("key %#x reissued after %d registrations", oldKey, i)
		}
		if i%2 == 0 {
			mr.Dereg()
		}
	}
	wr := qp.SendWR{ID: 7, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RemoteAddr: 0x5000, RKey: oldKey,
		SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR.LKey()}}}
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
	expectStatus(t, wcs[0], 7, qp.WCRemAccessErr)
}

func TestRNRRetryExceeded(t *testing.T) {
	prm := qptest.DefaultRC
	prm.RNRRetry = 2
	prm.MinRNRTimer = 1 // 10 µs
	p := newPair(t, qp.RC, cleanNet, prm, 16)
	aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	wr := qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0x1000, Length: 16, LKey: aMR.LKey()}}}
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
	expectStatus(t, wcs[0], 1, qp.WCRNRRetryExcErr)
	if got := p.net.A.E.Stats().RNRNAKsRcvd; got != 3 {
		t.Fatalf("%d RNR NAKs, want 3 (initial + 2 retries)", got)
	}
	if p.a.QP.State() != qp.StateErr {
		t.Fatalf("requester state %v", p.a.QP.State())
	}
}

func TestRNRRecovers(t *testing.T) {
	for _, op := range []qp.WROpcode{qp.WRSend, qp.WRRDMAWriteWithImm} {
		t.Run(op.String(), func(t *testing.T) {
			prm := qptest.DefaultRC
			prm.RNRRetry = 7 // infinite
			p := newPair(t, qp.RC, cleanNet, prm, 16)
			src := make([]byte, 3000)
			fill(src, 1)
			dst := make([]byte, 3000)
			aMR := p.regMR(p.a, src, 0x1000, qp.AccessLocalWrite)
			bMR := p.regMR(p.b, dst, 0x1000, allAccess)
			wr := qp.SendWR{ID: 1, Opcode: op, Flags: qp.SendSignaled, Imm: 5, RemoteAddr: 0x1000, RKey: bMR.RKey(),
				SGL: []qp.SGE{{Addr: 0x1000, Length: 3000, LKey: aMR.LKey()}}}
			if err := p.a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			// Let several RNR NAKs happen, then post the receive.
			_ = p.net.Run(func() bool { return p.net.A.E.Stats().RNRNAKsRcvd >= 3 }, 10*time.Second)
			if p.net.A.E.Stats().RNRNAKsRcvd < 3 {
				t.Fatal("no RNR NAKs")
			}
			if err := p.b.QP.PostRecv(&qp.RecvWR{ID: 9, SGL: []qp.SGE{{Addr: 0x1000, Length: 3000, LKey: bMR.LKey()}}}); err != nil {
				t.Fatal(err)
			}
			wcs := waitWC(t, p, p.a.SCQ, 1, 10*time.Second)
			expectStatus(t, wcs[0], 1, qp.WCSuccess)
			r := waitWC(t, p, p.b.RCQ, 1, time.Second)
			expectStatus(t, r[0], 9, qp.WCSuccess)
			if r[0].ByteLen != 3000 || string(dst) != string(src) {
				t.Fatalf("received %d bytes, data equal %v", r[0].ByteLen, string(dst) == string(src))
			}
		})
	}
}

func TestRetryExceededWhenPeerVanishes(t *testing.T) {
	prm := qptest.DefaultRC
	prm.RetryCnt = 3
	prm.Timeout = 10 // 4.2 ms
	p := newPair(t, qp.RC, cleanNet, prm, 16)
	aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	if err := p.b.QP.Destroy(); err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		wr := qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RemoteAddr: 0x1000, RKey: 0x100,
			SGL: []qp.SGE{{Addr: 0x1000, Length: 16, LKey: aMR.LKey()}}}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	start := p.net.Clock.T
	wcs := waitWC(t, p, p.a.SCQ, 3, 10*time.Second)
	expectStatus(t, wcs[0], 1, qp.WCRetryExcErr)
	expectStatus(t, wcs[1], 2, qp.WCWRFlushErr)
	expectStatus(t, wcs[2], 3, qp.WCWRFlushErr)
	// 1 + 3 retries, each after one timeout of 4.096 µs × 2^10.
	if el, want := p.net.Clock.T-start, 4*4194304*time.Nanosecond; el < want || el > want+time.Millisecond {
		t.Fatalf("gave up after %v, want about %v", el, want)
	}
	if got := p.net.A.E.Stats().Timeouts; got != 4 {
		t.Fatalf("%d timeouts, want 4", got)
	}
}

func TestRemoteInvalidRequest(t *testing.T) {
	t.Run("send-too-long", func(t *testing.T) {
		p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
		aMR := p.regMR(p.a, make([]byte, 4096), 0x1000, qp.AccessLocalWrite)
		bMR := p.regMR(p.b, make([]byte, 4096), 0x1000, qp.AccessLocalWrite)
		if err := p.b.QP.PostRecv(&qp.RecvWR{ID: 5, SGL: []qp.SGE{{Addr: 0x1000, Length: 100, LKey: bMR.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		wr := qp.SendWR{ID: 1, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0x1000, Length: 2000, LKey: aMR.LKey()}}}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
		expectStatus(t, wcs[0], 1, qp.WCRemInvReqErr)
		r := pollAll(p.b.RCQ, nil)
		if len(r) != 1 {
			t.Fatalf("responder completions %+v", r)
		}
		expectStatus(t, r[0], 5, qp.WCRemInvReqErr)
	})
	t.Run("qp-without-remote-write", func(t *testing.T) {
		prm := qptest.DefaultRC
		prm.Access = qp.AccessRemoteRead
		p := newPair(t, qp.RC, cleanNet, prm, 16)
		aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
		bMR := p.regMR(p.b, make([]byte, 64), 0x1000, allAccess)
		wr := qp.SendWR{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RemoteAddr: 0x1000, RKey: bMR.RKey(),
			SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR.LKey()}}}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
		expectStatus(t, wcs[0], 1, qp.WCRemInvReqErr)
	})
	t.Run("misaligned-atomic", func(t *testing.T) {
		p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
		aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
		bMR := p.regMR(p.b, make([]byte, 64), 0x1000, allAccess)
		wr := qp.SendWR{ID: 1, Opcode: qp.WRAtomicFetchAndAdd, Flags: qp.SendSignaled, RemoteAddr: 0x1004, RKey: bMR.RKey(),
			SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR.LKey()}}, CompareAdd: 1}
		if err := p.a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		wcs := waitWC(t, p, p.a.SCQ, 1, time.Second)
		expectStatus(t, wcs[0], 1, qp.WCRemInvReqErr)
	})
}

func TestSendWithInvalidate(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
	aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	bBuf := p.regMR(p.b, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	target := p.regMR(p.b, make([]byte, 64), 0x8000, allAccess)
	if err := p.b.QP.PostRecv(&qp.RecvWR{ID: 5, SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: bBuf.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wr := qp.SendWR{ID: 1, Opcode: qp.WRSendWithInv, Flags: qp.SendSignaled, InvalidateRKey: target.RKey(),
		SGL: []qp.SGE{{Addr: 0x1000, Length: 10, LKey: aMR.LKey()}}}
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, p, p.a.SCQ, 1, time.Second)[0], 1, qp.WCSuccess)
	r := pollAll(p.b.RCQ, nil)
	if len(r) != 1 || r[0].Flags&qp.WCWithInv == 0 || r[0].InvalidatedRKey != target.RKey() || r[0].ByteLen != 10 {
		t.Fatalf("receive completion %+v", r)
	}
	if target.Valid() {
		t.Fatal("MR still valid after SEND_WITH_INV")
	}
	// The invalidated key is no longer honoured.
	wr = qp.SendWR{ID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RemoteAddr: 0x8000, RKey: target.RKey(),
		SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR.LKey()}}}
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, p, p.a.SCQ, 1, time.Second)[0], 2, qp.WCRemAccessErr)
}

func TestPostSendErrors(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 2)
	aMR := p.regMR(p.a, make([]byte, 64), 0x1000, qp.AccessLocalWrite)
	sge := []qp.SGE{{Addr: 0x1000, Length: 8, LKey: aMR.LKey()}}
	for _, c := range []struct {
		wr   qp.SendWR
		want error
	}{
		{qp.SendWR{Opcode: qp.WRSend, SGL: make([]qp.SGE, 5)}, qp.ErrTooManySGE},
		{qp.SendWR{Opcode: qp.WRSend, Flags: qp.SendInline, Inline: make([]byte, 257)}, qp.ErrInlineTooLarge},
		{qp.SendWR{Opcode: qp.WRBindMW}, qp.ErrInvalidArgument}, // no window
		{qp.SendWR{Opcode: qp.WROpcode(10)}, qp.ErrOpNotSupported},
		{qp.SendWR{Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{{Length: 4}}}, qp.ErrInvalidArgument},
		{qp.SendWR{Opcode: qp.WRSend, SGL: []qp.SGE{{Length: 1 << 31}, {Length: 1}}}, qp.ErrMessageTooLarge},
	} {
		if err := p.a.QP.PostSend(&c.wr); !errors.Is(err, c.want) {
			t.Errorf("%+v: got %v, want %v", c.wr, err, c.want)
		}
	}
	// Queue full after depth WRs.
	for i := 0; i < 2; i++ {
		if err := p.a.QP.PostSend(&qp.SendWR{Opcode: qp.WRRDMAWrite, SGL: sge}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.a.QP.PostSend(&qp.SendWR{Opcode: qp.WRRDMAWrite, SGL: sge}); !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("got %v, want ErrQueueFull", err)
	}
	// A bad L_Key surfaces as a local protection error completion.
	q := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 4)
	if err := q.a.QP.PostSend(&qp.SendWR{ID: 4, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x1000, Length: 8, LKey: 0xdead00}}}); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, waitWC(t, q, q.a.SCQ, 1, time.Second)[0], 4, qp.WCLocProtErr)
}

// TestReadThenWriteOrder posts a READ of a remote region and, right behind it,
// a WRITE to the same region: the responder executes in order, so the READ
// must return the data from before the WRITE.
func TestReadThenWriteOrder(t *testing.T) {
	p := newPair(t, qp.RC, cleanNet, qptest.DefaultRC, 16)
	const n = 64 << 10
	remote := make([]byte, n)
	fill(remote, 5)
	old := append([]byte(nil), remote...)
	local := make([]byte, 2*n)
	fill(local[n:], 6)
	aMR := p.regMR(p.a, local, 0, qp.AccessLocalWrite)
	bMR := p.regMR(p.b, remote, 0x100000, allAccess)
	rd := qp.SendWR{ID: 1, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled, RemoteAddr: 0x100000, RKey: bMR.RKey(),
		SGL: []qp.SGE{{Addr: 0, Length: n, LKey: aMR.LKey()}}}
	wr := qp.SendWR{ID: 2, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, RemoteAddr: 0x100000, RKey: bMR.RKey(),
		SGL: []qp.SGE{{Addr: n, Length: n, LKey: aMR.LKey()}}}
	if err := p.a.QP.PostSend(&rd); err != nil {
		t.Fatal(err)
	}
	if err := p.a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, p, p.a.SCQ, 2, time.Second)
	expectStatus(t, wcs[0], 1, qp.WCSuccess)
	expectStatus(t, wcs[1], 2, qp.WCSuccess)
	if string(local[:n]) != string(old) {
		t.Fatal("the READ returned data written by the later WRITE")
	}
	if string(remote) != string(local[n:]) {
		t.Fatal("the WRITE did not land")
	}
}
