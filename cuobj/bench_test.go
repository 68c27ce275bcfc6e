package cuobj

import (
	"context"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// benchRig is a server with a channel connected to a client region.
type benchRig struct {
	r        *rig
	ch       uint16
	get, put string
	addr     uint64
}

func newBenchRig(tb testing.TB, size int) *benchRig { return newBenchRigProto(tb, size, ProtoRC) }

func newBenchRigProto(tb testing.TB, size int, proto Proto) *benchRig {
	sdev, cdev := memDevices(tb, faultnet.Config{}, faultnet.Config{})
	r := newRig(tb, sdev, cdev, size, &ClientOptions{Proto: proto}, nil)
	cbuf := make([]byte, size)
	if err := r.cli.Register(cbuf); err != nil {
		tb.Fatal(err)
	}
	b := &benchRig{r: r}
	b.get, _ = r.cli.GetRDMAToken(cbuf, uint64(size), 0, OpGet)
	b.put, _ = r.cli.GetRDMAToken(cbuf, uint64(size), 0, OpPut)
	t, _ := ParseToken(b.get)
	b.addr = t.Addr
	b.ch, _ = r.srv.AllocateChannel()
	// Connect once, outside any measurement.
	if _, err := r.srv.HandleGetObject(context.Background(), &Request{Local: r.sreg, RemoteAddr: b.addr, Size: 1, Token: b.get, Channel: b.ch}); err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestHandleAllocs: a synchronous request on a connected channel
// allocates nothing in cuobj (the bound covers the device's own).
func TestHandleAllocs(t *testing.T) {
	for _, proto := range []Proto{ProtoRC, ProtoDC} {
		t.Run(proto.String(), func(t *testing.T) { handleAllocs(t, proto) })
	}
}

func handleAllocs(t *testing.T, proto Proto) {
	b := newBenchRigProto(t, 4096, proto)
	req := &Request{Local: b.r.sreg, RemoteAddr: b.addr, Size: 4096, Token: b.get, Channel: b.ch}
	ctx := context.Background()
	n := testing.AllocsPerRun(200, func() {
		if _, err := b.r.srv.HandleGetObject(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	if n > 0 {
		t.Errorf("%.1f allocations per synchronous GET", n)
	}
}

func benchHandle(tb *testing.B, size int, put bool) { benchHandleProto(tb, size, put, ProtoRC) }

func benchHandleProto(tb *testing.B, size int, put bool, proto Proto) {
	b := newBenchRigProto(tb, size, proto)
	req := &Request{Local: b.r.sreg, RemoteAddr: b.addr, Size: uint64(size), Token: b.get, Channel: b.ch}
	h := b.r.srv.HandleGetObject
	if put {
		req.Token, h = b.put, b.r.srv.HandlePutObject
	}
	ctx := context.Background()
	tb.SetBytes(int64(size))
	tb.ResetTimer()
	for range tb.N {
		if _, err := h(ctx, req); err != nil {
			tb.Fatal(err)
		}
	}
}

// benchRaw posts the same RDMA WRITE or READ on the same connection
// directly, for comparison.
func benchRaw(tb *testing.B, size int, put bool) { benchRawProto(tb, size, put, ProtoRC) }

func benchRawProto(tb *testing.B, size int, put bool, proto Proto) {
	b := newBenchRigProto(tb, size, proto)
	ch, err := b.r.srv.channel(b.ch)
	if err != nil {
		tb.Fatal(err)
	}
	defer ch.mu.Unlock()
	tok, _ := ParseToken(b.get)
	if put {
		tok, _ = ParseToken(b.put)
	}
	mr := b.r.sreg.mrs[0]
	wr := roce.SendWR{Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled, SGL: []roce.SGE{mr.SGE(0, size)}, RemoteAddr: b.addr, RKey: tok.RKey}
	var qp *roce.QP
	switch p := ch.p.(type) {
	case *rcPath:
		for _, c := range p.conns {
			qp = c.c.QP()
		}
	case *dcPath:
		qp = p.cur.qp
		if wr.AH, err = p.tr.ah(context.Background(), tok.GID); err != nil {
			tb.Fatal(err)
		}
		wr.RemoteQPN, wr.DCKey = tok.QPN, p.tr.t.DCKey
	}
	if put {
		wr.Opcode = roce.WRRDMARead
	}
	wc := make([]roce.WorkCompletion, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tb.SetBytes(int64(size))
	tb.ResetTimer()
	for range tb.N {
		if err := qp.PostSend(&wr); err != nil {
			tb.Fatal(err)
		}
		for ch.cq.Poll(wc) == 0 {
			if err := ch.cq.Wait(ctx); err != nil {
				tb.Fatal(err)
			}
		}
		if wc[0].Status != roce.WCSuccess {
			tb.Fatal(wc[0].Status)
		}
	}
}

func BenchmarkGet1MiB(b *testing.B)      { benchHandle(b, 1<<20, false) }
func BenchmarkPut1MiB(b *testing.B)      { benchHandle(b, 1<<20, true) }
func BenchmarkRawWrite1MiB(b *testing.B) { benchRaw(b, 1<<20, false) }
func BenchmarkRawRead1MiB(b *testing.B)  { benchRaw(b, 1<<20, true) }
func BenchmarkGet4KiB(b *testing.B)      { benchHandle(b, 4096, false) }
func BenchmarkRawWrite4KiB(b *testing.B) { benchRaw(b, 4096, false) }

func BenchmarkDCGet1MiB(b *testing.B)      { benchHandleProto(b, 1<<20, false, ProtoDC) }
func BenchmarkDCPut1MiB(b *testing.B)      { benchHandleProto(b, 1<<20, true, ProtoDC) }
func BenchmarkDCRawWrite1MiB(b *testing.B) { benchRawProto(b, 1<<20, false, ProtoDC) }
func BenchmarkDCRawRead1MiB(b *testing.B)  { benchRawProto(b, 1<<20, true, ProtoDC) }
func BenchmarkDCGet4KiB(b *testing.B)      { benchHandleProto(b, 4096, false, ProtoDC) }
func BenchmarkDCRawWrite4KiB(b *testing.B) { benchRawProto(b, 4096, false, ProtoDC) }

// BenchmarkGrant is the client's cost of one region token: a memory
// region registered over the token's range and deregistered when the
// request ends (GetRDMAToken + PutRDMAToken), as for a client's first
// token to a server (no connection to bind a window through yet).
func BenchmarkGrant4KiB(b *testing.B) { benchGrant(b, 4096) }
func BenchmarkGrant1MiB(b *testing.B) { benchGrant(b, 1<<20) }

func benchGrant(b *testing.B, size int) {
	sdev, cdev := memDevices(b, faultnet.Config{}, faultnet.Config{})
	_ = sdev
	c, err := NewClient(cdev, Ops{}, ClientOptions{Telemetry: quiet, Config: ptr(DefaultConfig())})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, size)
	if err := c.Register(buf); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		tok, err := c.GetRDMAToken(buf, uint64(size), 0, OpGet)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.PutRDMAToken(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGrantWindow is BenchmarkGrant for a window token (the default
// once the server has a connection): a type 2 window bound through the
// server's connection, invalidated and deallocated at PutRDMAToken.
func BenchmarkGrantWindow4KiB(b *testing.B) { benchGrantWindow(b, 4096) }
func BenchmarkGrantWindow1MiB(b *testing.B) { benchGrantWindow(b, 1<<20) }

func benchGrantWindow(b *testing.B, size int) {
	sdev, cdev := memDevices(b, faultnet.Config{}, faultnet.Config{})
	r := newRig(b, sdev, cdev, size, nil, nil)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		b.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctxT(b, time.Minute), "user", buf, 0, 0); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); r.cli.idleConns(r.cli.rails[0], srvIP) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("no live connection of the server's")
		}
	}
	w0 := r.cli.Stats().WindowGrants.Load()
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		tok, err := r.cli.GetRDMATokenFor(buf, uint64(size), 0, OpGet, srvIP)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.cli.PutRDMAToken(tok); err != nil {
			b.Fatal(err)
		}
		n++
	}
	if w := r.cli.Stats().WindowGrants.Load() - w0; w != uint64(n) {
		b.Fatalf("%d of %d grants were windows", w, n)
	}
}

// benchWindow is benchHandle with a window token (the RC default once the
// server has a connection): on the channel of the token's connection, or
// on another that borrows it.
func benchWindow(b *testing.B, size int, put, borrowed bool) {
	sdev, cdev := memDevices(b, faultnet.Config{}, faultnet.Config{})
	r := newRig(b, sdev, cdev, size, nil, nil)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		b.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctxT(b, time.Minute), "user", buf, 0, 0); err != nil {
		b.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); r.cli.idleConns(r.cli.rails[0], srvIP) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("no live connection of the server's")
		}
	}
	op, h := OpGet, r.srv.HandleGetObject
	if put {
		op, h = OpPut, r.srv.HandlePutObject
	}
	desc, err := r.cli.GetRDMATokenFor(buf, uint64(size), 0, op, srvIP)
	if err != nil {
		b.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	ch, ok := r.srv.tr.route(&tok)
	if !ok {
		b.Fatal("the token is not a window")
	}
	if borrowed {
		if ch, err = r.srv.AllocateChannel(); err != nil {
			b.Fatal(err)
		}
	}
	req := &Request{Local: r.sreg, RemoteAddr: tok.Addr, Size: uint64(size), Token: desc, Channel: ch}
	ctx := context.Background()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := h(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetWindow4KiB(b *testing.B)         { benchWindow(b, 4096, false, false) }
func BenchmarkGetWindow1MiB(b *testing.B)         { benchWindow(b, 1<<20, false, false) }
func BenchmarkPutWindow1MiB(b *testing.B)         { benchWindow(b, 1<<20, true, false) }
func BenchmarkGetWindowBorrowed4KiB(b *testing.B) { benchWindow(b, 4096, false, true) }

// benchRound is one client request end to end (Client.Get or Put: the
// grant, the callback calling the server, the revoke), with window
// tokens (the default) or region tokens (ClientOptions.RegionTokens).
func benchRound(b *testing.B, size int, put, regions bool) {
	sdev, cdev := memDevices(b, faultnet.Config{}, faultnet.Config{})
	r := newRig(b, sdev, cdev, size, &ClientOptions{RegionTokens: regions}, nil)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		b.Fatal(err)
	}
	r.object = pattern(size, 1)
	ctx := ctxT(b, 10*time.Minute)
	if _, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil {
		b.Fatal(err)
	}
	if !regions {
		for deadline := time.Now().Add(20 * time.Second); r.cli.idleConns(r.cli.rails[0], srvIP) == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("no live connection of the server's")
			}
		}
	}
	st := r.cli.Stats()
	w0, g0 := st.WindowGrants.Load(), st.RegionGrants.Load()
	io := r.cli.Get
	if put {
		io = r.cli.Put
	}
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		if _, err := io(ctx, "user", buf, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if w, g := st.WindowGrants.Load()-w0, st.RegionGrants.Load()-g0; (regions && w != 0) || (!regions && g != 0) {
		b.Fatalf("%d window grants, %d region grants", w, g)
	}
}

func BenchmarkRoundGet4KiB(b *testing.B)       { benchRound(b, 4096, false, false) }
func BenchmarkRoundGetRegion4KiB(b *testing.B) { benchRound(b, 4096, false, true) }
func BenchmarkRoundGet1MiB(b *testing.B)       { benchRound(b, 1<<20, false, false) }
func BenchmarkRoundGetRegion1MiB(b *testing.B) { benchRound(b, 1<<20, false, true) }
func BenchmarkRoundPut1MiB(b *testing.B)       { benchRound(b, 1<<20, true, false) }
func BenchmarkRoundPutRegion1MiB(b *testing.B) { benchRound(b, 1<<20, true, true) }
