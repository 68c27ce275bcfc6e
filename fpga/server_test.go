package fpga_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// Every frame arrives once, in order, byte-exact and on its channel, for
// sizes from 1 byte to the PMTU, on both data paths.
func TestFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write bool
		pmtu  ib.MTU
	}{{"send", false, ib.MTU4096}, {"send-1024", false, ib.MTU1024}, {"write", true, ib.MTU4096}} {
		t.Run(tc.name, func(t *testing.T) {
			host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
			s, e := bringUp(t, host, fdev, 0, 64, emulator.Config{PMTU: tc.pmtu, Write: tc.write}, 1)
			const n = 2000
			max := tc.pmtu.Bytes()
			c := newChecker(max, n)
			if tc.write {
				c.counterMod = uint32(s.Depth())
			}
			go s.Serve(context.Background(), c.check)
			sendAll(t, e, n, max)
			c.wait(t, s, 10*time.Second)
			st := s.Stats()
			if st.Frames != n || st.BadSlot+st.BadLength+st.BadOpcode+st.BadStatus+st.BadRelease != 0 {
				t.Fatalf("stats %+v", st)
			}
			if s.FrameCount() != n || s.ByteCount() != e.Stats().Bytes {
				t.Fatalf("server counted %d frames %d bytes, emulator sent %+v", s.FrameCount(), s.ByteCount(), e.Stats())
			}
		})
	}
}

// A consumer that holds frames makes the device answer with RNR NAKs; the
// emulator retries and nothing is lost. Frames are released later, out of
// order and from other goroutines.
func TestSlowConsumerRNR(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const depth = 8
	s, e := bringUp(t, host, fdev, 4096, depth, emulator.Config{}, 1)
	const n = 400
	c := newChecker(4096, n)
	var held []fpga.Frame
	var mu sync.Mutex
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// Release everything held, newest first, every 2 ms.
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			mu.Lock()
			h := held
			held = nil
			mu.Unlock()
			var wg sync.WaitGroup
			for i := len(h) - 1; i >= 0; i-- {
				wg.Add(1)
				go func(f fpga.Frame) { defer wg.Done(); f.Release() }(h[i])
			}
			wg.Wait()
		}
	}()
	go s.Serve(context.Background(), func(f fpga.Frame) {
		c.check(f)
		f.Retain()
		mu.Lock()
		held = append(held, f)
		mu.Unlock()
	})
	sendAll(t, e, n, 4096)
	c.wait(t, s, 20*time.Second)
	if rnr := host.Counters().SendRNRErr; rnr == 0 || e.Stats().RNRNAKs == 0 {
		t.Fatalf("no RNR NAKs (host sent %d, emulator received %d) with a consumer holding all %d slots", rnr, e.Stats().RNRNAKs, depth)
	}
	t.Logf("RNR NAKs: %d, emulator %+v", host.Counters().SendRNRErr, e.Stats())
	if st := s.Stats(); st.BadRelease != 0 || st.Frames != n {
		t.Fatalf("stats %+v", st)
	}
}

// Loss on the path (both directions) delays frames, never loses, reorders
// or duplicates them.
func TestLoss(t *testing.T) {
	for _, loss := range []float64{0.01, 0.05} {
		t.Run("", func(t *testing.T) {
			host, fdev := memDevices(t, faultnet.Config{Seed: 1, Loss: loss}, faultnet.Config{Seed: 2, Loss: loss, Duplicate: 0.01, Reorder: 0.01})
			// Short ACK timeout (4 ms) and retry forever: the test is about
			// delivery, not the firmware's retry budget.
			s, e := bringUp(t, host, fdev, 4096, 32, emulator.Config{Timeout: 10, RetryCnt: 7}, 1)
			const n = 1000
			c := newChecker(4096, n)
			go s.Serve(context.Background(), c.check)
			sendAll(t, e, n, 4096)
			c.wait(t, s, 30*time.Second)
			t.Logf("loss %.0f%%: emulator %+v", loss*100, e.Stats())
		})
	}
}

// Secondary consumers see each frame before the primary; the slot is
// reposted only when the last reference is gone.
func TestConsumers(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 4, emulator.Config{}, 1)
	var mu sync.Mutex // the test reads what the receive goroutine appends
	var order []string
	var kept []fpga.Frame
	var n atomic.Int32
	done := make(chan struct{})
	s.Attach(fpga.ConsumerFunc(func(f fpga.Frame) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, "primary")
		if n.Add(1) == 10 {
			close(done)
		}
	}))
	s.Attach(fpga.ConsumerFunc(func(f fpga.Frame) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, "secondary")
		if len(kept) < 4 {
			f.Retain()
			kept = append(kept, f)
		}
	}))
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		if err := e.Send(ctx, 1, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// All four slots are held by the secondary: the next frame waits.
	if err := e.Send(ctx, 1, []byte{4}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if got := s.FrameCount(); got != 4 || s.Stats().Held != 4 {
		t.Fatalf("with every slot held: %d frames, stats %+v", got, s.Stats())
	}
	mu.Lock()
	held := kept[:4]
	mu.Unlock()
	for i, f := range held {
		if f.Data()[0] != byte(i) {
			t.Fatalf("held frame %d reads %d", i, f.Data()[0])
		}
		f.Release()
		f.Release() // a second release is counted, not honoured
	}
	for i := 5; i < 10; i++ {
		if err := e.Send(ctx, 1, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("frames after release: %d, stats %+v", s.FrameCount(), s.Stats())
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < 20; i += 2 {
		if order[i] != "secondary" || order[i+1] != "primary" {
			t.Fatalf("delivery order %v", order)
		}
	}
	if st := s.Stats(); st.BadRelease != 4 {
		t.Fatalf("stats %+v: want 4 bad releases", st)
	}
}

// Completions Rogue drops are counted and their slots posted again; a
// flushed completion stops the server with ErrFlushed.
func TestBadCompletions(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const max = 1024
	s, err := fpga.NewServer(host, 1, -1, max, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	s.SetLogger(quiet)
	s.SetDataPath(fpga.DataPathSend)
	s.SetFPGAGID(ib.GIDFromAddr(fpgaAddr))
	// A plain RC QP plays a misbehaving FPGA.
	pd, err := fdev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := fdev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	buf := make([]byte, 4096)
	mr, err := pd.RegisterMR(buf, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Connect(ctx, &roce.ConnectAttr{RemoteQPN: s.QPN(), RemoteGID: s.GID(), RemotePSN: s.RqPSN(),
		LocalPSN: s.SqPSN(), PathMTU: ib.MTU4096, RNRRetry: 7, RetryCnt: 7, Timeout: 14, MinRNRTimer: 1, NoDefaults: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteConnection(ctx, q.QPN(), s.SqPSN(), ib.MTU4096, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteConnection(ctx, q.QPN(), s.SqPSN(), ib.MTU4096, 1); !errors.Is(err, fpga.ErrState) || !strings.Contains(err.Error(), "already called") {
		t.Fatalf("second CompleteConnection: %v", err)
	}
	var frames atomic.Int32
	go s.Serve(ctx, func(f fpga.Frame) { frames.Add(1) })
	post := func(wr roce.SendWR, want roce.WCStatus) {
		t.Helper()
		wr.Flags |= roce.SendSignaled
		if err := q.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		var wc [1]roce.WorkCompletion
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if wc[0].Status != want {
			t.Fatalf("%v completed with %v, want %v", wr.Opcode, wc[0].Status, want)
		}
	}
	post(roce.SendWR{Opcode: roce.WRSendWithImm, Imm: 1}, roce.WCSuccess)
	post(roce.SendWR{Opcode: roce.WRSend, SGL: []roce.SGE{mr.SGE(0, 10)}}, roce.WCSuccess)
	post(roce.SendWR{Opcode: roce.WRRDMAWriteWithImm, SGL: []roce.SGE{mr.SGE(0, 10)}, RemoteAddr: s.MRAddr(), RKey: s.MRRKey(), Imm: 1}, roce.WCSuccess)
	post(roce.SendWR{Opcode: roce.WRSendWithImm, SGL: []roce.SGE{mr.SGE(0, 10)}, Imm: 1}, roce.WCSuccess)
	// Longer than a slot: the receive fails, the QP goes to ERR and the
	// remaining receives are flushed.
	post(roce.SendWR{Opcode: roce.WRSendWithImm, SGL: []roce.SGE{mr.SGE(0, max+1)}, Imm: 1}, roce.WCRemInvReqErr)
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatalf("server did not stop after the flush: %+v", s.Stats())
	}
	if !errors.Is(s.Err(), fpga.ErrFlushed) {
		t.Fatalf("Err %v, want ErrFlushed", s.Err())
	}
	st := s.Stats()
	if st.BadLength != 1 || st.BadOpcode != 2 || st.Frames != 1 || frames.Load() != 1 || st.BadStatus != 1 {
		t.Fatalf("stats %+v, frames seen %d", st, frames.Load())
	}
	s.Stop()
	s.Stop()
}

// A new server connected to a sender that kept its old PSNs (an FPGA that
// was not reset) reports ErrPSNMismatch instead of silently receiving
// nothing; after a soft reset the same sender gets through.
func TestStalePSNReconnect(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 16, emulator.Config{Timeout: 10, RetryCnt: 7}, 1)
	c := newChecker(4096, 50)
	go s.Serve(context.Background(), c.check)
	sendAll(t, e, 50, 4096)
	c.wait(t, s, 10*time.Second)
	s.Stop()

	s2, err := fpga.NewServer(host, 1, -1, 4096, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	s2.SetLogger(quiet)
	s2.SetFPGAGID(ib.GIDFromAddr(fpgaAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := e.Reconnect(ctx, hostParams(s2), true)
	if err != nil {
		t.Fatal(err)
	}
	// The host passes its own SqPSN, as PyRogue does: the FPGA was
	// programmed with it but did not take it.
	if err := s2.CompleteConnection(ctx, p.QPN, s2.SqPSN(), 0, 1); err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	serr := make(chan error, 1)
	go func() { serr <- s2.Serve(ctx, func(fpga.Frame) { got.Add(1) }) }()
	buf := make([]byte, 64)
	sendCtx, stopSend := context.WithCancel(ctx)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		// The stale sender's frames may be acknowledged as duplicates or
		// NAKed; either way none must reach the consumer.
		for i := 0; i < 20 && sendCtx.Err() == nil; i++ {
			if e.Send(sendCtx, 1, buf) != nil {
				return
			}
		}
	}()
	select {
	case err := <-serr:
		if !errors.Is(err, fpga.ErrPSNMismatch) {
			t.Fatalf("Serve returned %v, want ErrPSNMismatch", err)
		}
		t.Logf("reported: %v", err)
	case <-ctx.Done():
		t.Fatalf("stale PSNs not reported; counters %v", host.Counters().Map())
	}
	stopSend()
	<-sent
	if !errors.Is(s2.Err(), fpga.ErrPSNMismatch) || got.Load() != 0 {
		t.Fatalf("Err %v, frames %d", s2.Err(), got.Load())
	}
	s2.Stop()

	// After a soft reset the sender takes the PSNs it is given again.
	s3, err := fpga.NewServer(host, 1, -1, 4096, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Stop()
	s3.SetFPGAGID(ib.GIDFromAddr(fpgaAddr))
	if p, err = e.Reconnect(ctx, hostParams(s3), false); err != nil {
		t.Fatal(err)
	}
	if err := s3.CompleteConnection(ctx, p.QPN, p.RqPSN, 0, 1); err != nil {
		t.Fatal(err)
	}
	c3 := newChecker(4096, 50)
	go s3.Serve(ctx, c3.check)
	sendAll(t, e, 50, 4096)
	c3.wait(t, s3, 10*time.Second)
}
