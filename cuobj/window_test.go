package cuobj

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// barrier returns a function that blocks its first n callers until all n
// have called it (or, on a machine too busy for that, a generous deadline
// has passed: the test then fails).
func barrier(t *testing.T, n int) func(uint16) {
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	return func(uint16) {
		mu.Lock()
		arrived++
		if arrived == n {
			close(all)
		}
		late := arrived > n
		mu.Unlock()
		if late {
			return
		}
		select {
		case <-all:
		case <-time.After(30 * time.Second):
			t.Errorf("barrier: %d of %d callbacks at once", arrived, n)
		}
	}
}

// waitIdle waits until the client has n live connections of the rig's
// server that no window is bound through.
func (r *rig) waitIdle(t *testing.T, n int) {
	t.Helper()
	srv := r.srv.Addr().Addr()
	deadline := time.Now().Add(20 * time.Second)
	for r.cli.idleConns(r.cli.rails[0], srv) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections of the server's, want %d", r.cli.idleConns(r.cli.rails[0], srv), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWindowsConcurrentChannels: a server serves one client through
// several channels at once, each with its own connection, with window
// tokens (the RC default). Every request succeeds: a token names its
// connection by the client's QPN and runs on it, on whichever channel the
// front end gave the request (the server borrows the connection's
// channel). Each token works through its own QP alone: the same token
// naming another connection's QPN gets a remote access error, counted.
func TestWindowsConcurrentChannels(t *testing.T) {
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		const n, chunk = 4, 4096
		pair := lk.open(t)
		r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, n*chunk,
			&ClientOptions{Proto: ProtoRC, Parallel: n, MaxRequestCallbackSize: chunk}, nil)
		ctx := ctxT(t, 90*time.Second)
		buf := make([]byte, n*chunk)
		if err := r.cli.Register(buf); err != nil {
			t.Fatal(err)
		}
		st, sst := r.cli.Stats(), r.srv.Stats()
		get := func(step string, seed uint64) {
			t.Helper()
			r.object = pattern(n*chunk, seed)
			r.onChannel = barrier(t, n) // n callbacks on n channels at once
			got, err := r.cli.Get(ctx, "user", buf, 0, 0)
			r.onChannel = nil
			if err != nil || got != n*chunk || !bytes.Equal(buf, r.object) {
				t.Fatalf("%s: Get = %d, %v (data equal: %v)", step, got, err, bytes.Equal(buf, r.object))
			}
		}

		// No connection yet: n region tokens, and the n channels connect.
		get("first Get", 1)
		if w, g := st.WindowGrants.Load(), st.RegionGrants.Load(); w != 0 || g != n {
			t.Fatalf("first Get: %d window grants, %d region grants; want 0, %d", w, g, n)
		}
		r.waitIdle(t, n)

		// n window tokens, one per connection, served at once.
		for i := range 3 {
			get("Get through windows", uint64(2+i))
		}
		if w, g := st.WindowGrants.Load(), st.RegionGrants.Load(); w != 3*n || g != n {
			t.Fatalf("Gets through windows: %d window grants, %d region grants; want %d, %d", w, g, 3*n, n)
		}
		t.Logf("requests on a borrowed channel: %d", sst.Borrowed.Load())
		if sst.Failed.Load() != 0 {
			t.Fatalf("%d failed completions", sst.Failed.Load())
		}

		// One live token per connection; each served on a channel whose own
		// connection is another's: it runs on its own.
		r.waitIdle(t, n)
		loot, _ := r.srv.AllocHostBuffer(chunk)
		lreg, err := r.srv.RegisterBuffer(loot)
		if err != nil {
			t.Fatal(err)
		}
		copy(buf, pattern(n*chunk, 9))
		var toks []Token
		var owners []uint16
		seen := map[uint32]bool{}
		for i := range n {
			desc, err := r.cli.GetRDMATokenFor(buf, chunk, uint64(i*chunk), OpPut, pair.srv)
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := ParseToken(desc)
			owner, ok := r.srv.tr.route(&tok)
			if !ok || seen[tok.QPN] || tok.QPN == r.cli.Endpoint() {
				t.Fatalf("token %d names qp %#x (routed %v, seen %v, endpoint %#x)", i, tok.QPN, ok, seen[tok.QPN], r.cli.Endpoint())
			}
			seen[tok.QPN] = true
			toks, owners = append(toks, tok), append(owners, owner)
		}
		if w := st.WindowGrants.Load(); w != 4*n {
			t.Fatalf("%d window grants, want %d", w, 4*n)
		}
		chans := map[uint16]bool{}
		for _, o := range owners {
			chans[o] = true
		}
		if len(chans) != n {
			t.Fatalf("tokens' connections on channels %v, want %d channels", owners, n)
		}
		b0 := sst.Borrowed.Load()
		for i, tok := range toks {
			clear(loot)
			on := owners[(i+1)%n]
			if err := r.stealOn(ctx, on, lreg, tok, true); err != nil {
				t.Fatalf("token %d on channel %d (its connection's is %d): %v", i, on, owners[i], err)
			}
			if !bytes.Equal(loot, buf[i*chunk:(i+1)*chunk]) {
				t.Fatalf("token %d: data differs", i)
			}
		}
		if b := sst.Borrowed.Load() - b0; b != n {
			t.Errorf("%d requests on a borrowed channel, want %d", b, n)
		}

		// Token i naming connection i+1's QPN: a remote access error, which
		// ends that connection (so each names one still live).
		a0 := st.AccessErrors.Load()
		for i, tok := range toks {
			clear(loot)
			forged := tok
			forged.QPN = toks[(i+1)%n].QPN
			wantAccessError(t, "a token through another connection's QP", r.stealOn(ctx, owners[i], lreg, forged, true))
			if !bytes.Equal(loot, make([]byte, chunk)) {
				t.Errorf("token %d through another QP fetched client memory", i)
			}
		}
		waitCount(t, "client AccessErrors", func() uint64 { return st.AccessErrors.Load() - a0 }, n)
	})
}

// TestWindowTokenFallback: a token whose qp field names no live
// connection of the server's is an endpoint number, as before windows:
// the client's own endpoint connects (and a window token sent that way
// meets another QP: a remote access error), any other number is refused
// by the client as stale, with a REJ; a window token whose connection has
// ended is refused the same way. Region tokens keep working.
func TestWindowTokenFallback(t *testing.T) {
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		pair := lk.open(t)
		const size = 4096
		r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, size, &ClientOptions{Proto: ProtoRC}, nil)
		ctx := ctxT(t, 90*time.Second)
		buf := make([]byte, size)
		if err := r.cli.Register(buf); err != nil {
			t.Fatal(err)
		}
		r.object = pattern(size, 1)
		if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != size {
			t.Fatalf("first Get = %d, %v", n, err)
		}
		r.waitIdle(t, 1)
		desc, err := r.cli.GetRDMATokenFor(buf, size, 0, OpPut, pair.srv)
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := ParseToken(desc)
		if st := r.cli.Stats(); st.WindowGrants.Load() != 1 {
			t.Fatalf("%d window grants, want 1", st.WindowGrants.Load())
		}
		loot, _ := r.srv.AllocHostBuffer(2 * size)
		lreg, err := r.srv.RegisterBuffer(loot)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := r.srv.AllocateChannel()
		if err != nil {
			t.Fatal(err)
		}
		defer r.srv.FreeChannel(ch)
		st := r.cli.Stats()

		// Neither the endpoint nor a live QPN: the server dials that
		// "endpoint" and the client refuses it.
		stale := tok
		stale.QPN = tok.QPN ^ 0x800000
		if stale.QPN == r.cli.Endpoint() || stale.QPN == 0 {
			stale.QPN ^= 0x400000
		}
		ref0, conn0 := st.Refused.Load(), st.Connections.Load()
		err = r.srv.Connect(ctx, ch, stale.String())
		var rej *mad.RejectError
		if !errors.As(err, &rej) {
			t.Fatalf("Connect with qp %#x naming nothing: %v, want a REJ", stale.QPN, err)
		}
		waitCount(t, "client Refused", func() uint64 { return st.Refused.Load() - ref0 }, 1)

		// The endpoint: the channel connects as before windows.
		viaEndpoint := tok
		viaEndpoint.QPN = r.cli.Endpoint()
		if err := r.srv.Connect(ctx, ch, viaEndpoint.String()); err != nil {
			t.Fatalf("Connect with the endpoint: %v", err)
		}
		waitCount(t, "client Connections", func() uint64 { return st.Connections.Load() - conn0 }, 1)
		wantAccessError(t, "window token on the endpoint's connection", r.stealOn(ctx, ch, lreg, viaEndpoint, true))
		if !bytes.Equal(loot, make([]byte, 2*size)) {
			t.Error("window token on another QP fetched client memory")
		}

		// The token as it is works, on any channel; then its connection
		// ends (a widened use) and the token names nothing live.
		if err := r.stealOn(ctx, ch, lreg, tok, true); err != nil {
			t.Fatalf("window token: %v", err)
		}
		wide := tok
		wide.Size = size + 1
		wide.Addr--
		wantAccessError(t, "widened window token", r.stealOn(ctx, ch, lreg, wide, true))
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, ok := r.srv.tr.route(&tok); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the server still routes a token to a failed connection")
			}
			time.Sleep(time.Millisecond)
		}
		ref0 = st.Refused.Load()
		err = r.srv.Connect(ctx, ch, tok.String())
		if !errors.As(err, &rej) {
			t.Fatalf("Connect with an ended connection's QPN: %v, want a REJ", err)
		}
		waitCount(t, "client Refused", func() uint64 { return st.Refused.Load() - ref0 }, 1)
		if err := r.cli.PutRDMAToken(desc); err != nil {
			t.Fatal(err)
		}
		r.object = pattern(size, 2)
		if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != size || !bytes.Equal(buf, r.object) {
			t.Fatalf("Get after = %d, %v", n, err)
		}
	})
}

// FuzzTokenQPN: a token's qp field of any value, sent to a server that
// holds connections to the client, is routed, dialled as an endpoint or
// refused, and fails with a package error or succeeds (only in range and
// with the token's own QPN); never a panic, and
// client memory outside the token is never reached.
func FuzzTokenQPN(f *testing.F) {
	sdev, cdev := attackDevices(f)
	const size = 4096
	tun := DefaultTunables()
	tun.ConnectTimeout = 2 * time.Second
	r := newRigAt(f, sdev, cdev, srvIP, size, &ClientOptions{Proto: ProtoRC}, &tun)
	ctx := context.Background()
	buf := pattern(3*size, 1)
	if err := r.cli.Register(buf); err != nil {
		f.Fatal(err)
	}
	r.object = pattern(size, 2)
	if _, err := r.cli.Get(ctx, "user", buf[size:2*size], 0, 0); err != nil {
		f.Fatal(err)
	}
	private := append([]byte(nil), buf...)
	deadline := time.Now().Add(20 * time.Second)
	for r.cli.idleConns(r.cli.rails[0], srvIP) == 0 {
		if time.Now().After(deadline) {
			f.Fatal("no connection of the server's")
		}
		time.Sleep(time.Millisecond)
	}
	desc, err := r.cli.GetRDMATokenFor(buf, size, size, OpGet, srvIP)
	if err != nil {
		f.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	loot, _ := r.srv.AllocHostBuffer(3 * size)
	lreg, err := r.srv.RegisterBuffer(loot)
	if err != nil {
		f.Fatal(err)
	}
	ch, err := r.srv.AllocateChannel()
	if err != nil {
		f.Fatal(err)
	}
	var serverQPN uint32
	for _, c := range r.srv.tr.(*rcTransport).byPeer {
		serverQPN = c.qpn
	}
	for _, q := range []uint32{0, 1, 0xFFFFFF, tok.QPN, tok.QPN + 1, tok.QPN - 1, r.cli.Endpoint(), serverQPN, 0x800000} {
		f.Add(q, false)
		f.Add(q, true)
	}
	f.Fuzz(func(t *testing.T, qpn uint32, wide bool) {
		forged := tok
		forged.QPN = qpn & 0xFFFFFF
		if wide {
			forged.Addr -= size
			forged.Size = 3 * size
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cerr := r.srv.Connect(cctx, ch, forged.String())
		_, err := r.srv.HandleGetObject(cctx, &Request{Key: "fuzz", Local: lreg, RemoteAddr: forged.Addr,
			Size: uint64(forged.Size), Token: forged.String(), Channel: ch})
		var e *Error
		for _, err := range []error{cerr, err} {
			if err != nil && !errors.As(err, &e) {
				t.Fatalf("qp %#x: %v is not a package error", forged.QPN, err)
			}
		}
		if !bytes.Equal(buf[:size], private[:size]) || !bytes.Equal(buf[2*size:], private[2*size:]) {
			t.Fatalf("qp %#x (wide %v) reached client memory outside the token", forged.QPN, wide)
		}
		if err == nil && (wide || forged.QPN != tok.QPN) {
			t.Fatalf("qp %#x (wide %v): served", forged.QPN, wide)
		}
	})
}

// TestWindowAsyncBorrowed: an asynchronous request whose window token
// names another channel's connection runs there, and its completion is
// the caller's channel's to Poll, a success or the remote access error of
// a token given back.
func TestWindowAsyncBorrowed(t *testing.T) {
	sdev, cdev := attackDevices(t)
	const size = 4096
	r := newRigAt(t, sdev, cdev, srvIP, size, &ClientOptions{Proto: ProtoRC}, nil)
	ctx := ctxT(t, 60*time.Second)
	buf, desc, tok, owner := windowGetToken(t, ctx, r, size)
	ch, err := r.srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer r.srv.FreeChannel(ch)
	if ch == owner {
		t.Fatalf("channel %d is the connection's own", ch)
	}
	want := pattern(size, 2)
	copy(r.sbuf, want)
	req := &Request{Key: "async", Local: r.sreg, RemoteAddr: tok.Addr, Size: size, Token: desc, Channel: ch, Async: "first"}
	if n, err := r.srv.HandleGetObject(ctx, req); n != 0 || err != nil {
		t.Fatalf("asynchronous GET = %d, %v", n, err)
	}
	ev := make([]AsyncEvent, 4)
	if n, err := r.srv.PollWait(ctx, ch, ev); n != 1 || err != nil || ev[0].Handle != "first" {
		t.Fatalf("PollWait = %d, %v, %+v", n, err, ev[0])
	}
	for _, m := range r.cli.regions[uintptrOf(buf)].mrs {
		m.Sync()
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("asynchronous GET: data differs")
	}
	if err := r.cli.PutRDMAToken(desc); err != nil {
		t.Fatal(err)
	}
	req.Async = "dead"
	if n, err := r.srv.HandleGetObject(ctx, req); n != 0 || err != nil {
		t.Fatalf("asynchronous GET with a dead token = %d, %v", n, err)
	}
	n, err := r.srv.PollWait(ctx, ch, ev)
	if st, ok := CompletionStatus(err); n != 1 || !ok || st != roce.WCRemAccessErr || ev[0].Handle != "dead" {
		t.Fatalf("PollWait = %d, %v, %+v; want the dead token's remote access error", n, err, ev[0])
	}
	if r.srv.Stats().Borrowed.Load() != 2 {
		t.Errorf("%d requests on a borrowed channel, want 2", r.srv.Stats().Borrowed.Load())
	}
}

// TestWindowTokenOtherServer: a window token bound through one server's
// connection, handed to another server that the client admits, names no
// connection of the second server's: it dials the QPN as an endpoint
// number and the client refuses it as stale (not as a stranger).
func TestWindowTokenOtherServer(t *testing.T) {
	sdev, cdev := attackDevices(t)
	const size = 4096
	r := newRigAt(t, sdev, cdev, srvIP, size, &ClientOptions{Proto: ProtoRC}, nil)
	ctx := ctxT(t, 60*time.Second)
	other, err := NewServer(sdev, netip.AddrPortFrom(strangerIP, 18516), ServerOptions{Telemetry: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	buf := make([]byte, 2*size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctx, "user", buf[:size], 0, 0); err != nil {
		t.Fatal(err)
	}
	r.waitIdle(t, 1)
	desc, err := r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	if _, ok := r.srv.tr.route(&tok); !ok || tok.QPN == r.cli.Endpoint() {
		t.Fatalf("token %v is not a window of the first server's connection", tok)
	}
	// The second server is admitted: a live token was handed to it (a
	// region: it has no connection to bind through).
	if _, err := r.cli.GetRDMATokenFor(buf, size, size, OpGet, strangerIP); err != nil {
		t.Fatal(err)
	}
	ch, err := other.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	st := r.cli.Stats()
	ref0, str0 := st.Refused.Load(), st.Strangers.Load()
	err = other.Connect(ctx, ch, desc)
	var rej *mad.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("another server's Connect with the window token: %v, want a REJ", err)
	}
	waitCount(t, "client Refused", func() uint64 { return st.Refused.Load() - ref0 }, 1)
	if st.Strangers.Load() != str0 {
		t.Errorf("refused as a stranger, not as stale")
	}
	if w, g := st.WindowGrants.Load(), st.RegionGrants.Load(); w != 1 || g != 2 {
		t.Errorf("%d window grants, %d region grants; want 1, 2", w, g)
	}
}

// TestHandleAllocsWindow: a synchronous request with a window token, on
// the channel of the token's connection and on another (borrowing it),
// allocates nothing in cuobj.
func TestHandleAllocsWindow(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const size = 4096
	r := newRig(t, sdev, cdev, size, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	_, desc, tok, owner := windowGetToken(t, ctx, r, size)
	other, err := r.srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range []uint16{owner, other} {
		req := &Request{Local: r.sreg, RemoteAddr: tok.Addr, Size: size, Token: desc, Channel: ch}
		n := testing.AllocsPerRun(200, func() {
			if _, err := r.srv.HandleGetObject(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
		if n > 0 {
			t.Errorf("channel %d (the connection's: %d): %.1f allocations per synchronous GET", ch, owner, n)
		}
	}
	if b := r.srv.Stats().Borrowed.Load(); b < 200 {
		t.Errorf("%d requests on a borrowed channel, want at least 200", b)
	}
}

// TestWindowGuessCorrected: a client that names no server (no
// AllowServer, no ClientOptions.Servers) binds its callbacks' windows
// through the only server connected. When a callback hands such a token
// to another server, that server's connection with the QPN is refused as
// stale, the callback is retried with a region and succeeds, and the
// client guesses no more.
func TestWindowGuessCorrected(t *testing.T) {
	sdev, cdev := attackDevices(t)
	const size = 4096
	ctx := ctxT(t, 60*time.Second)
	type end struct {
		s   *Server
		reg *Buffer
	}
	var ends []end
	for i, a := range []netip.Addr{srvIP, strangerIP} {
		s, err := NewServer(sdev, netip.AddrPortFrom(a, uint16(18515+i)), ServerOptions{Telemetry: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		b, _ := s.AllocHostBuffer(size)
		copy(b, pattern(size, uint64(i)))
		reg, err := s.RegisterBuffer(b)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, end{s, reg})
	}
	var target atomic.Int32
	get := func(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
		e := ends[target.Load()]
		ch, err := e.s.AllocateChannel()
		if err != nil {
			return 0, err
		}
		defer e.s.FreeChannel(ch)
		n, err := e.s.HandleGetObject(h.Context(), &Request{Key: "get", Local: e.reg, RemoteAddr: info.Token.Addr,
			Size: uint64(len(chunk)), Token: info.Desc, Channel: ch})
		return int(n), err
	}
	c, err := NewClient(cdev, Ops{Get: get}, ClientOptions{Telemetry: quiet, Config: ptr(DefaultConfig())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, size)
	if err := c.Register(buf); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	do := func(step string, to int32, windows, regions uint64) {
		t.Helper()
		target.Store(to)
		if n, err := c.Get(ctx, "user", buf, 0, 0); err != nil || n != size || !bytes.Equal(buf, pattern(size, uint64(to))) {
			t.Fatalf("%s: Get = %d, %v", step, n, err)
		}
		if w, g := st.WindowGrants.Load(), st.RegionGrants.Load(); w != windows || g != regions {
			t.Fatalf("%s: %d window grants, %d region grants; want %d, %d", step, w, g, windows, regions)
		}
	}
	do("first Get", 0, 0, 1)
	deadline := time.Now().Add(20 * time.Second)
	for c.idleConns(c.rails[0], srvIP) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no connection of the first server's")
		}
		time.Sleep(time.Millisecond)
	}
	do("Get through a window", 0, 1, 1)
	ref0 := st.Refused.Load()
	do("Get from the other server", 1, 2, 2)
	if st.Retries.Load() == 0 || st.Refused.Load() == ref0 || !c.ambiguous.Load() {
		t.Fatalf("retries %d, refused %d, ambiguous %v: the misdirected window was not refused and retried",
			st.Retries.Load(), st.Refused.Load()-ref0, c.ambiguous.Load())
	}
	do("Get after", 0, 2, 3)
}

// TestWindowNeverOnEndpointQPN: the client binds no window through a
// connection whose QPN is its endpoint number, so that a token's qp field
// is either: a token for that server is then a region.
func TestWindowNeverOnEndpointQPN(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const size = 4096
	r := newRig(t, sdev, cdev, size, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil {
		t.Fatal(err)
	}
	r.waitIdle(t, 1)
	rl := r.cli.rails[0]
	r.cli.mu.RLock()
	var qpn uint32
	for _, sc := range r.cli.conns {
		qpn = sc.qpn
	}
	r.cli.mu.RUnlock()
	saved := rl.endpoint
	rl.endpoint = qpn // as if the device had handed out the endpoint's number
	desc, err := r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP)
	rl.endpoint = saved
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	if st := r.cli.Stats(); st.WindowGrants.Load() != 0 || st.RegionGrants.Load() != 2 || tok.QPN != qpn {
		t.Fatalf("%d window grants, %d region grants, qp %#x: want a region naming the endpoint %#x",
			st.WindowGrants.Load(), st.RegionGrants.Load(), tok.QPN, qpn)
	}
	// With the true endpoint the same connection binds windows again.
	if desc, err = r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP); err != nil {
		t.Fatal(err)
	}
	if tok, _ = ParseToken(desc); tok.QPN != qpn || r.cli.Stats().WindowGrants.Load() != 1 {
		t.Fatalf("qp %#x, %d window grants: want a window through %#x", tok.QPN, r.cli.Stats().WindowGrants.Load(), qpn)
	}
}

// TestFreeChannelWhileLent: a channel freed while another channel's
// request holds it leaves nothing of its holder's to the next: the next
// holder's Poll finds no event of the one before.
func TestFreeChannelWhileLent(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 4096, nil, nil)
	ctx := ctxT(t, 30*time.Second)
	id, err := r.srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := r.srv.channel(id)
	if err != nil {
		t.Fatal(err)
	}
	ch.events = append(ch.events, AsyncEvent{Handle: "the first holder's"})
	ch.mu.Unlock()
	lender, err := r.srv.borrow(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.srv.channel(id); !errors.Is(err, errLent) {
		t.Fatalf("a lent channel: %v, want errLent", err)
	}
	r.srv.FreeChannel(id)
	lender.giveBack()
	again, err := r.srv.AllocateChannel()
	if err != nil || again != id {
		t.Fatalf("AllocateChannel = %d, %v; want %d", again, err, id)
	}
	ev := make([]AsyncEvent, 4)
	if n, err := r.srv.Poll(id, ev); n != 0 || err != nil {
		t.Fatalf("the next holder's Poll = %d, %v (%+v)", n, err, ev[0])
	}
}

// TestWindowLostConnection: a server that has lost a connection the
// client still holds (its DREQ lost with the path, say) dials the QPN of
// a window token bound through it as an endpoint number: the client
// refuses it, closes its end, and the callback's retry, a region,
// succeeds on a new connection.
func TestWindowLostConnection(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const size = 4096
	r := newRig(t, sdev, cdev, size, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil {
		t.Fatal(err)
	}
	r.waitIdle(t, 1)
	// The server forgets its connection without a word to the client.
	rt := r.srv.tr.(*rcTransport)
	var lost *rcConn
	rt.mu.Lock()
	for k, c := range rt.byPeer {
		lost = c
		delete(rt.byPeer, k)
	}
	rt.mu.Unlock()
	lost.p.mu.Lock()
	delete(lost.p.conns, lost.key)
	lost.p.mu.Unlock()
	t.Cleanup(func() { lost.c.Close() })

	st := r.cli.Stats()
	r.object = pattern(size, 2)
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != size || !bytes.Equal(buf, r.object) {
		t.Fatalf("Get with the connection lost = %d, %v", n, err)
	}
	if st.Retries.Load() == 0 || st.WindowGrants.Load() != 1 || r.cli.ambiguous.Load() {
		t.Fatalf("retries %d, window grants %d, ambiguous %v: want the window refused, a retry, no ambiguity",
			st.Retries.Load(), st.WindowGrants.Load(), r.cli.ambiguous.Load())
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r.cli.mu.RLock()
		held := false
		for _, sc := range r.cli.conns {
			held = held || sc.qpn == lost.peer.qpn
		}
		r.cli.mu.RUnlock()
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client still holds the connection the server lost")
		}
		time.Sleep(time.Millisecond)
	}
	// Windows again, through the new connection.
	r.waitIdle(t, 1)
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != size || st.WindowGrants.Load() != 2 {
		t.Fatalf("Get after = %d, %v; %d window grants, want 2", n, err, st.WindowGrants.Load())
	}
}

// windowGetToken makes the server's connection to r's client with a first
// GET of size bytes, then a GET token for a registered buffer of that size:
// a window, whose qp field routes to owner, the channel of that connection.
func windowGetToken(t *testing.T, ctx context.Context, r *rig, size int) (buf []byte, desc string, tok Token, owner uint16) {
	t.Helper()
	buf = make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(size, 1)
	if _, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil {
		t.Fatal(err)
	}
	r.waitIdle(t, 1)
	desc, err := r.cli.GetRDMATokenFor(buf, uint64(size), 0, OpGet, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ = ParseToken(desc)
	owner, ok := r.srv.tr.route(&tok)
	if !ok {
		t.Fatal("the window token names no connection")
	}
	return buf, desc, tok, owner
}

// TestWindowNotBeforeServerUsedIt: the client's accept completes before
// the server has taken the connection into the index it routes window
// tokens by, so no window is bound through a connection the server has
// not yet sent on: a token taken then is a region naming the endpoint;
// once the server has used the connection, the next token is a window
// through it that the server routes.
func TestWindowNotBeforeServerUsedIt(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 4096, nil, nil)
	ctx := ctxT(t, 30*time.Second)
	const size = 4096
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	first, err := r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := r.srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer r.srv.FreeChannel(ch)
	// The server reaches the client and sends nothing on the connection.
	if err := r.srv.Connect(ctx, ch, first); err != nil {
		t.Fatal(err)
	}
	r.waitIdle(t, 1)
	if err := r.cli.PutRDMAToken(first); err != nil {
		t.Fatal(err)
	}
	desc, err := r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	if st := r.cli.Stats(); st.WindowGrants.Load() != 0 || tok.QPN != r.cli.endpoint {
		t.Fatalf("%d window grants, qp %#x: want a region naming the endpoint %#x before the server used its connection",
			st.WindowGrants.Load(), tok.QPN, r.cli.endpoint)
	}
	req := &Request{Key: "k", Local: r.sreg, RemoteAddr: tok.Addr, Size: size, Token: desc, Channel: ch}
	if n, err := r.srv.HandleGetObject(ctx, req); err != nil || n != size {
		t.Fatalf("GET with the region token = %d, %v", n, err)
	}
	if err := r.cli.PutRDMAToken(desc); err != nil {
		t.Fatal(err)
	}
	if desc, err = r.cli.GetRDMATokenFor(buf, size, 0, OpGet, srvIP); err != nil {
		t.Fatal(err)
	}
	tok, _ = ParseToken(desc)
	if r.cli.Stats().WindowGrants.Load() != 1 {
		t.Fatalf("qp %#x, no window once the server used its connection", tok.QPN)
	}
	if _, ok := r.srv.tr.route(&tok); !ok {
		t.Fatal("the server does not route the window token")
	}
	req.Token = desc
	if n, err := r.srv.HandleGetObject(ctx, req); err != nil || n != size {
		t.Fatalf("GET with the window token = %d, %v", n, err)
	}
}
