package naaice

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

var (
	hostAddr = netip.MustParseAddr("10.0.0.1")
	naaAddr  = netip.MustParseAddr("10.0.0.2")
)

// devPair opens two devices joined by an in-memory link.
func devPair(t testing.TB, ab, ba faultnet.Config) (host, naa *roce.Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: ab, BtoA: ba})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{hostAddr}, Neighbours: map[netip.Addr]net.HardwareAddr{naaAddr: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{naaAddr}, Neighbours: map[netip.Addr]net.HardwareAddr{hostAddr: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

type lab struct {
	host, naa *roce.Device
	srv       *Server
	remote    netip.AddrPort
	ctx       context.Context
}

// newLab starts a server with the example routines on the NAA device.
func newLab(t testing.TB, opts *ServerOptions, ab, ba faultnet.Config) *lab {
	t.Helper()
	host, naa := devPair(t, ab, ba)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	srv := NewServer(naa, o)
	ExampleRoutines(srv)
	l, err := cm.Listen(ctx, naa, netip.AddrPortFrom(netip.IPv4Unspecified(), mrsp.ServerPort), cm.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-served
	})
	return &lab{host: host, naa: naa, srv: srv, remote: netip.AddrPortFrom(naaAddr, mrsp.ServerPort), ctx: ctx}
}

func fill(n int, v byte) []byte { return bytes.Repeat([]byte{v}, n) }

func allBytes(t testing.TB, what string, b []byte, v byte) {
	t.Helper()
	for i, x := range b {
		if x != v {
			t.Fatalf("%s: byte %d of %d is %d, want %d", what, i, len(b), x, v)
		}
	}
}

// The C example client's shape: N regions, all inputs, the last the
// output, region 0 single-send with 2 bytes in the first RPC; then more
// RPCs, internal regions, and the state machine seen from outside.
func TestRPCRegions(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	sizes := []int{1000, 5000, 64, 70000}
	params := make([][]byte, len(sizes))
	for i, n := range sizes {
		params[i] = fill(n, byte(10+i))
	}
	c, err := NewContext(l.host, l.remote, params, []uint32{4096, 10}, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.State() != mrsp.Init {
		t.Fatalf("state %v", c.State())
	}
	for i := range params {
		c.SetInput(i)
	}
	c.SetOutput(len(params) - 1)
	c.SetOutput(1)
	c.SetSingleSend(0)
	c.SetImmediate([3]byte{1, 2, 3})
	if err := c.SetBytesToSend(0, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if c.State() != mrsp.Connected {
		t.Fatalf("state %v", c.State())
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	if c.State() != mrsp.MRSPDone {
		t.Fatalf("state %v", c.State())
	}
	for rpc := 0; rpc < 5; rpc++ {
		// Reset the inputs; the NAA adds 1 to everything it holds.
		for i := 1; i < len(params); i++ {
			copy(params[i], fill(sizes[i], byte(10+i)))
		}
		if err := c.DoRPC(l.ctx); err != nil {
			t.Fatalf("RPC %d: %v", rpc, err)
		}
		if c.State() != mrsp.Finished {
			t.Fatalf("state %v", c.State())
		}
		allBytes(t, "output 3", params[3], 14)
		allBytes(t, "output 1", params[1], 12)
		allBytes(t, "input 2 (not an output)", params[2], 12)
		if code, n := c.Result(); code != 0 || n != uint32(sizes[3]) {
			t.Fatalf("result %d, %d bytes", code, n)
		}
		if rpc == 0 {
			c.SetBytesToSend(0, -1)
		}
	}
	if c.RPCs() != 5 {
		t.Fatalf("RPCs %d", c.RPCs())
	}
	// The NAA counts an RPC once its write-back completed, which may be
	// after the host saw it.
	waitFor(t, func() bool { c := l.srv.Counters(); return c.RPCs == 5 && c.Accepted == 1 })
	if err := c.Disconnect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if c.State() != mrsp.Disconnected {
		t.Fatalf("state %v", c.State())
	}
}

// The routine sees what the host sent: single-send regions only once,
// the shortened first write, the user bytes, the internal regions.
func TestRoutineView(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	type seen struct {
		user     [3]byte
		rpc      int
		first    []byte
		internal []int
		flags    []mrsp.Flags
	}
	var mu sync.Mutex
	var calls []seen
	l.srv.Handle(9, func(_ context.Context, c *Call) uint8 {
		mu.Lock()
		defer mu.Unlock()
		s := seen{user: c.User, rpc: c.RPC, first: append([]byte(nil), c.Regions[0][:4]...), flags: c.Flags}
		for _, r := range c.Internal {
			s.internal = append(s.internal, len(r))
		}
		calls = append(calls, s)
		c.Regions[0][0] = 0xEE // persists on the NAA
		return 0
	})
	cfg := fill(8, 7)
	data := fill(16, 1)
	c, err := NewContext(l.host, l.remote, [][]byte{cfg, data}, []uint32{100, 200}, 9, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetSingleSend(0)
	c.SetInput(1)
	c.SetOutput(1)
	c.SetBytesToSend(0, 2)
	c.SetImmediate([3]byte{0xA, 0xB, 0xC})
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		cfg[0] = byte(100 + i) // single-send: the NAA must not see this change
		if err := c.DoRPC(l.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(calls) != 3 {
		t.Fatalf("%d calls", len(calls))
	}
	if !bytes.Equal(calls[0].first, []byte{100, 7, 0, 0}) {
		t.Errorf("first RPC: region 0 starts % x, want 2 bytes written", calls[0].first)
	}
	if !bytes.Equal(calls[1].first, []byte{0xEE, 7, 0, 0}) || !bytes.Equal(calls[2].first, []byte{0xEE, 7, 0, 0}) {
		t.Errorf("later RPCs: region 0 starts % x / % x: single-send written again?", calls[1].first, calls[2].first)
	}
	for i, s := range calls {
		if s.user != [3]byte{0xA, 0xB, 0xC} || s.rpc != i || len(s.internal) != 2 || s.internal[0] != 100 || s.internal[1] != 200 {
			t.Errorf("call %d: %+v", i, s)
		}
		if s.flags[0] != mrsp.FlagSingleSend|mrsp.FlagInput || s.flags[1] != mrsp.FlagInput|mrsp.FlagOutput {
			t.Errorf("flags %v", s.flags)
		}
	}
}

func TestCall(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	cl := NewClient(l.host, l.remote, Options{})
	in := fill(3000, 5)
	inout := fill(100, 50)
	out := make([]byte, 4<<20)
	if err := cl.Call(l.ctx, 2, [][]byte{in, inout}, [][]byte{inout, out}); err != nil {
		t.Fatal(err)
	}
	allBytes(t, "in/out", inout, 52)
	allBytes(t, "out", out, 2) // zero on the NAA, +2
	allBytes(t, "in", in, 5)
}

func TestPollingModes(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	p := fill(512, 0)
	c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetInput(0)
	c.SetOutput(0)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartMRSP(); err != nil {
		t.Fatal(err)
	}
	if err := c.PollBusy(l.ctx); err != nil || c.State() != mrsp.MRSPDone {
		t.Fatalf("busy MRSP: %v, state %v", err, c.State())
	}
	// Nonblocking.
	if err := c.StartRPC(); err != nil {
		t.Fatal(err)
	}
	for c.State() != mrsp.Finished {
		if err := c.Poll(); err != nil {
			t.Fatal(err)
		}
		if l.ctx.Err() != nil {
			t.Fatal("timeout polling")
		}
		time.Sleep(100 * time.Microsecond)
	}
	allBytes(t, "after poll", p, 1)
	// Blocking, one completion batch at a time.
	if err := c.StartRPC(); err != nil {
		t.Fatal(err)
	}
	for c.State() != mrsp.Finished {
		if err := c.Wait(l.ctx); err != nil {
			t.Fatal(err)
		}
	}
	allBytes(t, "after wait", p, 2)
	// Busy.
	if err := c.StartRPC(); err != nil {
		t.Fatal(err)
	}
	if err := c.PollBusy(l.ctx); err != nil {
		t.Fatal(err)
	}
	allBytes(t, "after busy", p, 3)
	// Wrong order: an MRSP again is refused locally.
	if err := c.StartMRSP(); !errors.Is(err, ErrState) {
		t.Fatalf("second MRSP: %v", err)
	}
}

func TestConcurrentClients(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	const clients, rpcs = 6, 10
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for k := 0; k < clients; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := fill(1000*(k+1), byte(k))
			c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 1, Options{})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetInput(0)
			c.SetOutput(0)
			if err := c.Connect(l.ctx); err != nil {
				errs <- err
				return
			}
			if err := c.DoMRSP(l.ctx); err != nil {
				errs <- err
				return
			}
			for i := 0; i < rpcs; i++ {
				if err := c.DoRPC(l.ctx); err != nil {
					errs <- err
					return
				}
			}
			for i, b := range p {
				if b != byte(k+rpcs) {
					errs <- errors.New("client " + string(rune('0'+k)) + ": wrong byte at " + string(rune('0'+i%10)))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// A host that closes at once after its last result may take the ACK of
	// the NAA's write-back with it: the NAA then counts that RPC as cut
	// short.
	waitFor(t, func() bool { c := l.srv.Counters(); return c.Active == 0 && c.RPCs+c.Disconnects == clients*rpcs })
}

func TestLossyLink(t *testing.T) {
	// 1 % of the frames lost each way, as the lab's loss test does; a lost
	// tail costs an RC timeout, so few RPCs.
	l := newLab(t, nil, faultnet.Config{Loss: 0.01, Seed: 3}, faultnet.Config{Loss: 0.01, Seed: 4})
	p := fill(20000, 0)
	q := fill(3000, 9)
	c, err := NewContext(l.host, l.remote, [][]byte{p, q}, nil, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetInput(0)
	c.SetOutput(0)
	c.SetInput(1)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := c.DoRPC(l.ctx); err != nil {
			t.Fatalf("RPC %d: %v", i, err)
		}
	}
	allBytes(t, "output", p, 10)
}

func TestRPCErrors(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	l.srv.Handle(5, func(context.Context, *Call) uint8 { return 0x42 })
	l.srv.Handle(6, func(context.Context, *Call) uint8 { panic("routine bug") })
	cl := NewClient(l.host, l.remote, Options{})
	p := fill(10, 1)
	for _, c := range []struct {
		fn   uint8
		code uint32
	}{{5, 0x42}, {6, uint32(RCRoutinePanic)}, {77, uint32(RCUnknownFunction)}} {
		err := cl.Call(l.ctx, c.fn, [][]byte{p}, [][]byte{p})
		var re *RPCError
		if !errors.As(err, &re) || re.Code != c.code || re.Imm != c.code<<8 {
			t.Errorf("fn %d: %v, want return code %#x", c.fn, err, c.code)
		}
	}
	allBytes(t, "not written back after errors", p, 1)
	if c := l.srv.Counters(); c.RPCErrors != 3 || c.UnknownFunction != 1 {
		t.Errorf("counters %+v", c)
	}
	// The server still serves.
	if err := cl.Call(l.ctx, 1, [][]byte{p}, [][]byte{p}); err != nil {
		t.Fatal(err)
	}
	allBytes(t, "after", p, 2)
}

// TestOverload: with every slot held by a connection mid-RPC, a new one
// is rejected with the C server's overload message.
func TestOverload(t *testing.T) {
	l := newLab(t, &ServerOptions{MaxConns: 1}, faultnet.Config{}, faultnet.Config{})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	l.srv.Handle(10, func(ctx context.Context, c *Call) uint8 {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return 0
	})
	p := fill(10, 1)
	c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 10, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetInput(0)
	c.SetOutput(0)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	busy := make(chan error, 1)
	go func() { busy <- c.DoRPC(l.ctx) }()
	<-entered
	err = NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, nil)
	var rej *mad.RejectError
	if !errors.As(err, &rej) || !bytes.HasPrefix(rej.PrivateData, []byte(mrsp.RejectOverload)) {
		t.Fatalf("second connection: %v", err)
	}
	close(release)
	if err := <-busy; err != nil {
		t.Fatalf("the busy connection: %v", err)
	}
	if c := l.srv.Counters(); c.Rejected != 1 || c.IdleEvicted != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// hoard connects n contexts that finish the handshake and, if aar, the
// MRSP with size bytes of regions, and then do nothing.
func hoard(t *testing.T, l *lab, n, size int, aar bool) []*Context {
	t.Helper()
	var cs []*Context
	for range n {
		c, err := NewContext(l.host, l.remote, [][]byte{make([]byte, size)}, nil, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetInput(0)
		c.SetOutput(0)
		if err := c.Connect(l.ctx); err != nil {
			t.Fatal(err)
		}
		if aar {
			if err := c.DoMRSP(l.ctx); err != nil {
				t.Fatal(err)
			}
		}
		cs = append(cs, c)
	}
	return cs
}

// TestIdleEvicted: connections that never send their AAR, and others
// that announced regions and went quiet, hold every slot; a real client's
// RPCs still succeed, taking the slot of the connection idle longest.
func TestIdleEvicted(t *testing.T) {
	l := newLab(t, &ServerOptions{MaxConns: 4, MaxMemory: 4 << 20}, faultnet.Config{}, faultnet.Config{})
	hoard(t, l, 2, 1<<20, true) // half the memory
	hoard(t, l, 2, 64, false)   // every slot
	for i := range 3 {
		p := fill(100, 1)
		if err := NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, nil); err != nil {
			t.Fatalf("real client %d: %v (counters %+v)", i, err, l.srv.Counters())
		}
	}
	// The first client took a hoarder's slot; the others may find the
	// slot of the client before them free again.
	if c := l.srv.Counters(); c.IdleEvicted == 0 || c.Rejected != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// TestIdleMemoryEvicted: idle connections whose AARs took the whole
// memory budget give it up to a real client's AAR, oldest first.
func TestIdleMemoryEvicted(t *testing.T) {
	l := newLab(t, &ServerOptions{MaxMemory: 4 << 20}, faultnet.Config{}, faultnet.Config{})
	hoard(t, l, 4, 1<<20, true) // the whole budget
	for i := range 2 {
		p := fill(1<<20, 1)
		if err := NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, nil); err != nil {
			t.Fatalf("real client %d: %v (counters %+v)", i, err, l.srv.Counters())
		}
	}
	if c := l.srv.Counters(); c.IdleEvicted == 0 || c.MRSPErrors != 0 {
		t.Fatalf("counters %+v", c)
	}
	l.srv.mu.Lock()
	defer l.srv.mu.Unlock()
	if l.srv.used > 4<<20 {
		t.Fatalf("%d bytes of a 4 MiB budget reserved", l.srv.used)
	}
}

// TestIdleTimeout: a connection that sends no AAR, and one that stops
// after its MRSP, are closed after IdleTimeout and their memory returned.
func TestIdleTimeout(t *testing.T) {
	l := newLab(t, &ServerOptions{IdleTimeout: 200 * time.Millisecond}, faultnet.Config{}, faultnet.Config{})
	hoard(t, l, 1, 64, false)
	hoard(t, l, 1, 1<<20, true)
	deadline := time.Now().Add(20 * time.Second)
	for l.srv.Counters().IdleTimeouts < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v", l.srv.Counters())
		}
		time.Sleep(10 * time.Millisecond)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		l.srv.mu.Lock()
		used, active := l.srv.used, l.srv.active
		l.srv.mu.Unlock()
		if used == 0 && active == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes, %d connections still held", used, active)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p := fill(100, 1)
	if err := NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, nil); err != nil {
		t.Fatal(err)
	}
}

// blockLab has routine 10, which blocks until released, so that a test
// can act mid-RPC.
func blockLab(t *testing.T) (*lab, chan struct{}, chan struct{}) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	l.srv.Handle(10, func(ctx context.Context, c *Call) uint8 {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return 0
	})
	return l, entered, release
}

func TestCancel(t *testing.T) {
	l, entered, release := blockLab(t)
	p := fill(100, 1)
	c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 10, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetInput(0)
	c.SetOutput(0)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(l.ctx)
	go func() { <-entered; cancel() }()
	if err := c.DoRPC(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled RPC: %v", err)
	}
	// The RPC is still under way; finish it and the connection goes on.
	close(release)
	for c.State() != mrsp.Finished {
		if err := c.Wait(l.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DoRPC(l.ctx); err != nil {
		t.Fatal(err)
	}
}

func TestDisconnectMidRPC(t *testing.T) {
	l, entered, release := blockLab(t)
	defer close(release)
	p := fill(100, 1)
	c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 10, Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.SetInput(0)
	c.SetOutput(0)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartRPC(); err != nil {
		t.Fatal(err)
	}
	<-entered
	c.Close()
	release <- struct{}{}
	waitFor(t, func() bool { return l.srv.Counters().Disconnects == 1 && l.srv.Counters().Active == 0 })

}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawHost is a host that sends what a test makes it send.
type rawHost struct {
	conn *cm.Conn
	cq   *roce.CQ
	buf  []byte
	mr   *roce.MR
}

func dialRaw(t *testing.T, l *lab) *rawHost {
	t.Helper()
	pd, err := l.host.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := l.host.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	h := &rawHost{cq: cq, buf: make([]byte, 2048)}
	h.mr, err = pd.RegisterMR(h.buf, roce.AccessLocalWrite|roce.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	h.conn, err = cm.Dial(l.ctx, l.host, l.remote, cm.DialOptions{QP: cm.QPOptions{PD: pd, SendCQ: cq, RecvCQ: cq, SigAll: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.conn.Close()
		h.mr.Close()
		cq.Close()
		pd.Close()
	})
	if err := h.conn.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{h.mr.SGE(1024, 1024)}}); err != nil {
		t.Fatal(err)
	}
	return h
}

// send sends msg and returns the NAA's answer (nil if the connection
// ended without one).
func (h *rawHost) send(t *testing.T, ctx context.Context, msg []byte) []byte {
	t.Helper()
	copy(h.buf, msg)
	if err := h.conn.QP().PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSolicited, SGL: []roce.SGE{h.mr.SGE(0, len(msg))}}); err != nil {
		t.Fatal(err)
	}
	var wc [4]roce.WorkCompletion
	for {
		n := h.cq.Poll(wc[:])
		for _, w := range wc[:n] {
			if w.Opcode == roce.WCRecv && w.Status == roce.WCSuccess {
				return append([]byte(nil), h.buf[1024:1024+w.ByteLen]...)
			}
		}
		if n == 0 {
			if err := waitCQ(ctx, h.cq, h.conn.Done()); err != nil {
				return nil
			}
		}
	}
}

func aar(regions ...mrsp.Region) []byte {
	b, _ := mrsp.AppendAAR(nil, regions)
	return b
}

func TestBadAAR(t *testing.T) {
	l := newLab(t, &ServerOptions{MaxMemory: 8 << 20}, faultnet.Config{}, faultnet.Config{})
	in := mrsp.Region{Flags: mrsp.FlagInput | mrsp.FlagOutput, HostAddr: 0x1000, RKey: 5, Size: 64}
	var regs []mrsp.Region
	for i := 0; i < 31; i++ {
		r := in
		r.NAAAddr = uint64(i) * 4096
		regs = append(regs, r)
	}
	tooMany := aar(regs...)
	tooMany[1] = 32 // one more than fits the 768-byte receive
	tooMany = append(tooMany, tooMany[4:28]...)
	huge := in
	huge.Size = 1 << 31
	big := in
	big.Size = 200 << 20 // within the protocol, beyond the server's memory
	unaligned := in
	unaligned.NAAAddr = 100
	second := in
	second.NAAAddr = 0
	for _, c := range []struct {
		name string
		msg  []byte
		code mrsp.ErrCode
	}{
		{"too many regions", tooMany, 0}, // longer than the receive: the QP fails, no answer
		{"absurd size", aar(huge), mrsp.CodeNoMemory},
		{"beyond memory", aar(big), mrsp.CodeNoMemory},
		{"unaligned", aar(unaligned), mrsp.CodeInvalidAddress},
		{"overlapping", aar(in, second), mrsp.CodeInvalidAddress},
		{"count 0", []byte{1, 0, 0, 0}, mrsp.CodeNoMemory},
		{"wrong type", []byte{2, 0, 0, 0}, mrsp.CodeNoMemory},
		{"truncated", aar(in)[:20], mrsp.CodeNoMemory},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := dialRaw(t, l)
			before := l.srv.Counters()
			ans := h.send(t, l.ctx, c.msg)
			if c.code == 0 {
				if ans != nil {
					t.Fatalf("answer % x", ans)
				}
			} else if len(ans) != 4 || ans[0] != mrsp.MsgErr || mrsp.ErrCode(ans[1]) != c.code {
				t.Fatalf("answer % x, want ERR code %d", ans, c.code)
			}
			waitFor(t, func() bool {
				a := l.srv.Counters()
				return a.Active == 0 && a.MRSPErrors+a.CompletionErrors > before.MRSPErrors+before.CompletionErrors
			})
		})
	}
	// Then a good client still works.
	p := fill(10, 1)
	if err := NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, [][]byte{p}); err != nil {
		t.Fatal(err)
	}
}

// An MRSP message in the data phase, a host error write, and a write
// outside the regions end only that connection.
func TestOutOfOrder(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	good := mrsp.Region{Flags: mrsp.FlagInput | mrsp.FlagOutput, Size: 64}
	t.Run("second AAR", func(t *testing.T) {
		h := dialRaw(t, l)
		g := good
		g.HostAddr, g.RKey = h.mr.Addr(), h.mr.RKey()
		ans := h.send(t, l.ctx, aar(g))
		if len(ans) != 4+16 || ans[0] != mrsp.MsgA {
			t.Fatalf("A % x", ans)
		}
		h.conn.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{h.mr.SGE(1024, 1024)}})
		h.send(t, l.ctx, aar(g))
		waitFor(t, func() bool { return l.srv.Counters().OutOfOrder == 1 && l.srv.Counters().Active == 0 })
	})
	t.Run("host abort", func(t *testing.T) {
		h := dialRaw(t, l)
		g := good
		g.HostAddr, g.RKey = h.mr.Addr(), h.mr.RKey()
		ans := h.send(t, l.ctx, aar(g))
		adv, err := mrsp.ParseA(ans, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.conn.QP().PostSend(&roce.SendWR{Opcode: roce.WRRDMAWriteWithImm, Imm: 0, RemoteAddr: adv[0].Addr, RKey: adv[0].RKey}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return l.srv.Counters().HostAborts == 1 && l.srv.Counters().Active == 0 })
	})
	t.Run("write outside", func(t *testing.T) {
		h := dialRaw(t, l)
		g := good
		g.HostAddr, g.RKey = h.mr.Addr(), h.mr.RKey()
		adv, err := mrsp.ParseA(h.send(t, l.ctx, aar(g)), nil)
		if err != nil {
			t.Fatal(err)
		}
		imm, _ := mrsp.HostImm(1, [3]byte{})
		if err := h.conn.QP().PostSend(&roce.SendWR{Opcode: roce.WRRDMAWriteWithImm, Imm: imm, SGL: []roce.SGE{h.mr.SGE(0, 64)},
			RemoteAddr: adv[0].Addr + 32, RKey: adv[0].RKey}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return l.srv.Counters().CompletionErrors == 1 && l.srv.Counters().Active == 0 })
	})
	t.Run("Context.Abort", func(t *testing.T) {
		before := l.srv.Counters().HostAborts
		p := fill(10, 1)
		c, err := NewContext(l.host, l.remote, [][]byte{p}, nil, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetInput(0)
		if err := c.Abort(); !errors.Is(err, ErrState) {
			t.Fatalf("abort before connecting: %v", err)
		}
		if err := c.Connect(l.ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.DoMRSP(l.ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Abort(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return l.srv.Counters().HostAborts == before+1 })
	})
	p := fill(10, 1)
	if err := NewClient(l.host, l.remote, Options{}).Call(l.ctx, 1, [][]byte{p}, [][]byte{p}); err != nil {
		t.Fatal(err)
	}
}

// Once connected, an RPC allocates nothing on the host.
func TestRPCAllocs(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	a, b := fill(256, 0), fill(256, 0)
	c, err := NewContext(l.host, l.remote, [][]byte{a, b}, nil, 3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetInput(0)
	c.SetInput(1)
	c.SetOutput(1)
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	ctx := l.ctx
	n := testing.AllocsPerRun(50, func() {
		if err := c.DoRPC(ctx); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per RPC", n)
	}
}

func TestAARWire(t *testing.T) {
	// The AAR of a context is the C host's for the same call: flags, the
	// sequential requested addresses (internal regions first), sizes.
	dev, _ := devPair(t, faultnet.Config{}, faultnet.Config{})
	c, err := NewContext(dev, netip.AddrPortFrom(naaAddr, 1), [][]byte{make([]byte, 1024), make([]byte, 5000)}, []uint32{8192}, 3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetSingleSend(0)
	c.SetInput(1)
	c.SetOutput(1)
	msg, err := mrsp.AppendAAR(nil, c.regions())
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) != 4+3*24 || msg[1] != 3 {
		t.Fatalf("AAR % x", msg)
	}
	want := []struct {
		info uint64
		size uint32
	}{{0x06<<56 | 8192, 1024}, {0x0c<<56 | 12288, 5000}, {0x01 << 56, 8192}}
	for i, w := range want {
		e := msg[4+24*i:]
		if got := binary.BigEndian.Uint64(e); got != w.info || binary.BigEndian.Uint32(e[20:]) != w.size {
			t.Errorf("entry %d: %#x size %d", i, got, binary.BigEndian.Uint32(e[20:]))
		}
	}
}

// The most regions the protocol carries (31 with the internal ones), each
// an input and an output; one more is refused before anything is sent.
func TestMaxRegions(t *testing.T) {
	l := newLab(t, nil, faultnet.Config{}, faultnet.Config{})
	params := make([][]byte, mrsp.MaxAAREntries-2)
	for i := range params {
		params[i] = fill(100+i, byte(i))
	}
	if _, err := NewContext(l.host, l.remote, params, []uint32{1, 2, 3}, 1, Options{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("32 regions: %v", err)
	}
	c, err := NewContext(l.host, l.remote, params, []uint32{1, 2}, 2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range params {
		c.SetInput(i)
		c.SetOutput(i)
	}
	if err := c.Connect(l.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DoMRSP(l.ctx); err != nil {
		t.Fatal(err)
	}
	for r := 1; r <= 3; r++ {
		if err := c.DoRPC(l.ctx); err != nil {
			t.Fatal(err)
		}
		for i, p := range params {
			allBytes(t, "region", p, byte(i+2*r))
		}
	}
}
