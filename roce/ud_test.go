package roce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
)

// exerciseUD sends n datagrams a → b through an address handle and checks
// them byte for byte, received zero-copy from a slab.
func exerciseUD(t *testing.T, a, b *endpoint, dstB ib.GID, size, n int) {
	t.Helper()
	slab, err := b.pd.NewRecvSlab(b.qp, 16, size)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ah, err := a.pd.CreateAH(ctx, AddressVector{DGID: dstB})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Close()
	for i := 0; i < n; i++ {
		fill(a.buf[:size], byte(i))
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSendWithImm, Flags: SendSignaled, Imm: uint32(i),
			SGL: []SGE{a.mr.SGE(0, size)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
		wantOK(t, waitWC(t, a.scq, 5*time.Second), WCSend)
		wc := waitWC(t, b.rcq, 5*time.Second)
		wantOK(t, wc, WCRecv)
		if !slab.Owns(&wc) || wc.SrcQP != a.qp.QPN() || wc.Imm != uint32(i) || wc.Flags&WCWithGRH == 0 {
			t.Fatalf("UD completion %+v", wc)
		}
		if got := slab.Bytes(&wc); !bytes.Equal(got, a.buf[:size]) {
			t.Fatalf("datagram %d: %d bytes received, differ from the %d sent", i, len(got), size)
		}
		grh := slab.GRH(&wc)
		if dstB.IsIPv4() {
			// 20 zero bytes, then the IPv4 header with our addresses.
			src := ib.IPv4(grh[20:40]).Src()
			if !bytes.Equal(grh[:20], make([]byte, 20)) || src != ah.AV().SGID.Addr() {
				t.Fatalf("GRH area %x: source %v, want %v", grh, src, ah.AV().SGID.Addr())
			}
		} else if src := ib.IPv6(grh).Src(); grh[0]>>4 != 6 || src != ah.AV().SGID.Addr() {
			t.Fatalf("GRH area %x: source %v, want the IPv6 header from %v", grh, src, ah.AV().SGID.Addr())
		}
		if err := slab.Repost(&wc); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMemlinkUD(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, UD, 4096)
	b := newEndpoint(t, db, UD, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	exerciseUD(t, a, b, ib.GIDFromAddr(addrB), 1024, 20)
	if got := da.QueryPort().ActiveMTU; got != ib.MTU1024 {
		t.Fatalf("active MTU %v, want 1024 on a 1500-byte link", got)
	}
	// A datagram above the port MTU completes successfully without being
	// sent, as rxe does (IBTA C10-93.1.1).
	ah, err := a.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
	if err != nil {
		t.Fatal(err)
	}
	before := da.Counters().SentPkts
	if err := a.qp.PostSend(&SendWR{ID: 99, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 2000)},
		AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1234}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, 5*time.Second), WCSend)
	if after := da.Counters().SentPkts; after != before {
		t.Fatalf("%d frames sent for an oversized datagram", after-before)
	}
}

func TestManyQPs(t *testing.T) {
	cfg := faultnet.Config{Seed: 9, Loss: 0.01}
	da, db := memPair(t, cfg, cfg, nil)
	const nqp = 32
	const msgs = 20
	var wg sync.WaitGroup
	errs := make(chan error, nqp)
	for i := 0; i < nqp; i++ {
		a := newEndpoint(t, da, RC, 8192)
		b := newEndpoint(t, db, RC, 8192)
		connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 6})
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- pingPong(a, b, 3000+i, msgs)
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// pingPong sends msgs SENDs of size bytes from a to b, each checked.
func pingPong(a, b *endpoint, size, msgs int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [1]WorkCompletion
	get := func(cq *CQ) (WorkCompletion, error) {
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				return wc[0], err
			}
		}
		return wc[0], nil
	}
	for i := 0; i < msgs; i++ {
		fill(a.buf[:size], byte(i))
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(0, size)}}); err != nil {
			return err
		}
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, size)}}); err != nil {
			return err
		}
		w, err := get(a.scq)
		if err != nil || w.Status != WCSuccess {
			return fmt.Errorf("QP %d send %d: %v %v", a.qp.QPN(), i, w.Status, err)
		}
		w, err = get(b.rcq)
		if err != nil || w.Status != WCSuccess || int(w.ByteLen) != size {
			return fmt.Errorf("QP %d recv %d: %+v %v", b.qp.QPN(), i, w, err)
		}
		if !bytes.Equal(a.buf[:size], b.buf[:size]) {
			return fmt.Errorf("QP %d message %d differs", b.qp.QPN(), i)
		}
	}
	return nil
}

func TestCQWaitContext(t *testing.T) {
	da, _ := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	cq, err := da.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	// Measured against the context's own deadline: on a busy machine the
	// test may lose its CPU between making the context and calling Wait.
	deadline, _ := ctx.Deadline()
	if err := cq.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an empty CQ: %v, want deadline exceeded", err)
	}
	if now := time.Now(); now.Before(deadline) {
		t.Fatalf("Wait returned %v before its deadline", deadline.Sub(now))
	} else if late := now.Sub(deadline); late > 10*time.Second {
		t.Fatalf("Wait returned %v after its deadline", late)
	}
	// Closing the device wakes waiters.
	done := make(chan error, 1)
	go func() { done <- cq.Wait(context.Background()) }()
	time.Sleep(10 * time.Millisecond)
	da.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Wait after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Wait did not return after Close")
	}
	if _, err := da.AllocPD(); !errors.Is(err, ErrClosed) {
		t.Fatalf("AllocPD on a closed device: %v", err)
	}
}

// Two UD QPs share one SRQ fed by a slab; completions arrive through the
// CQ's Ready channel in a select loop.
func TestSRQSlabReady(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, UD, 4096)
	connect(t, a, a2peer(t, db), addrA, addrB, ConnectAttr{})
	pd, _ := db.AllocPD()
	cq, _ := db.CreateCQ(64)
	srq, err := pd.CreateSRQ(SRQAttr{MaxWR: 64, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	slab, err := pd.NewSRQSlab(srq, 32, 256, true)
	if err != nil {
		t.Fatal(err)
	}
	var qps [2]*QP
	for i := range qps {
		if qps[i], err = pd.CreateQP(&QPInitAttr{Type: UD, SendCQ: cq, RecvCQ: cq, SRQ: srq}); err != nil {
			t.Fatal(err)
		}
		if err := qps[i].Connect(t.Context(), &ConnectAttr{QKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := a.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("message %02d", i))
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendInline, Inline: msg,
			AH: ah, RemoteQPN: qps[i%2].QPN(), RemoteQKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]uint32{}
	var wc [8]WorkCompletion
	timeout := time.After(5 * time.Second)
	for len(got) < n {
		select {
		case <-cq.Ready():
		case <-timeout:
			t.Fatalf("received %d of %d", len(got), n)
		}
		// Drain: one signal may stand for many completions.
		for k := cq.Poll(wc[:]); k > 0; k = cq.Poll(wc[:]) {
			for i := range wc[:k] {
				wantOK(t, wc[i], WCRecv)
				got[string(slab.Bytes(&wc[i]))] = wc[i].QPN
				if err := slab.Repost(&wc[i]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for i := 0; i < n; i++ {
		if q := got[fmt.Sprintf("message %02d", i)]; q != qps[i%2].QPN() {
			t.Fatalf("message %d arrived on QP %d, want %d", i, q, qps[i%2].QPN())
		}
	}
}

// a2peer is a placeholder UD endpoint on d so that connect can bring a up.
func a2peer(t *testing.T, d *Device) *endpoint { return newEndpoint(t, d, UD, 64) }

// CQ.Serve delivers completions in batches until its context ends.
func TestCQServe(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 1<<16)
	b := newEndpoint(t, db, RC, 1<<16)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const n = 100
	for i := 0; i < n; i++ {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	got := 0
	go func() {
		done <- b.rcq.Serve(ctx, make([]WorkCompletion, 16), func(wcs []WorkCompletion) {
			for _, wc := range wcs {
				if wc.Status != WCSuccess || wc.WRID != uint64(got) {
					t.Errorf("completion %+v, want WRID %d", wc, got)
				}
				got++
			}
			if got == n {
				cancel()
			}
		})
	}()
	for i := 0; i < n; i++ {
		if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendInline, Inline: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; !errors.Is(err, context.Canceled) || got != n {
		t.Fatalf("Serve returned %v after %d of %d completions", err, got, n)
	}
}
