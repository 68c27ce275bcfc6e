package cuobj

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

func TestNewServerFailures(t *testing.T) {
	sdev, _ := memDevices(t, faultnet.Config{}, faultnet.Config{})
	cases := []struct {
		name  string
		addr  netip.AddrPort
		opts  *ServerOptions
		errno syscall.Errno
		want  error
	}{
		{"invalid address", netip.AddrPort{}, nil, syscall.ENODEV, ErrNoDevice},
		{"not the device's", netip.MustParseAddrPort("10.9.9.9:18515"), nil, syscall.ENODEV, ErrNoDevice},
		{"not the device's v6", netip.MustParseAddrPort("[fd00::10]:18515"), nil, syscall.ENODEV, ErrNoDevice},
		{"unknown proto", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Proto: 7}, syscall.EPROTONOSUPPORT, ErrUnsupported},
		{"num_dcis 0", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Tunables: &Tunables{CQDepth: 1}}, syscall.EINVAL, ErrInvalid},
		{"num_dcis too many", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Tunables: ptr(tun(func(t *Tunables) { t.NumDCIs = 1 << 16 }))}, syscall.EINVAL, ErrInvalid},
		{"cq_depth 0", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Tunables: ptr(tun(func(t *Tunables) { t.CQDepth = 0 }))}, syscall.EINVAL, ErrInvalid},
		{"cq_depth too deep", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Tunables: ptr(tun(func(t *Tunables) { t.CQDepth = 1 << 20 }))}, syscall.EINVAL, ErrInvalid},
		{"timeout 32", netip.MustParseAddrPort("10.0.0.1:18515"), &ServerOptions{Tunables: ptr(tun(func(t *Tunables) { t.Timeout = 32 }))}, syscall.EINVAL, ErrInvalid},
	}
	for _, c := range cases {
		if c.opts == nil {
			c.opts = &ServerOptions{}
		}
		c.opts.Telemetry = quiet
		s, err := NewServer(sdev, c.addr, *c.opts)
		if err == nil {
			s.Close()
			t.Errorf("%s: NewServer succeeded", c.name)
			continue
		}
		if !errors.Is(err, c.errno) || !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v and %v", c.name, err, c.errno, c.want)
		}
	}
	if _, err := NewServer(nil, netip.MustParseAddrPort("10.0.0.1:1"), ServerOptions{}); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("nil device: %v", err)
	}
}

func tun(f func(*Tunables)) Tunables {
	t := DefaultTunables()
	f(&t)
	return t
}

func TestTunableCaps(t *testing.T) {
	d := DefaultTunables()
	if d.NumDCIs != 128 || d.CQDepth != 640 || d.DCKey != 0xffeeddcc || d.Timeout != 16 || d.HopLimit != 4 ||
		d.MaxSGE != 10 || d.DelayInterval != 5000 || d.DelayMode != DelayBatch || !d.QPResetOnFailure ||
		d.RetryCount != 7 || d.TrafficClass != 96 || d.MaxRdAtomic != 0 || d.ServiceLevel != 0 || d.PKeyIndex != 0 {
		t.Fatalf("defaults %+v", d)
	}
	in := tun(func(t *Tunables) {
		t.RetryCount, t.TrafficClass, t.HopLimit, t.MaxSGE, t.MaxRdAtomic, t.DelayMode = 9, 256, 300, 64, 500, DelayInvalid
	})
	got, notes, err := in.normalize()
	if err != nil {
		t.Fatal(err)
	}
	if got.RetryCount != 7 || got.TrafficClass != 96 || got.HopLimit != 255 || got.MaxSGE != 32 ||
		got.MaxRdAtomic != 128 || got.DelayMode != DelayBatch || len(notes) != 6 {
		t.Fatalf("normalized %+v, notes %q", got, notes)
	}
	if got, _, _ := d.normalize(); got.MaxRdAtomic != 128 {
		t.Fatalf("max_rd_atomic 0 is the device maximum, got %d", got.MaxRdAtomic)
	}
	if got, _, _ := tun(func(t *Tunables) { t.TrafficClass = 255; t.MaxSGE = 0 }).normalize(); got.TrafficClass != 255 || got.MaxSGE != 10 {
		t.Fatalf("traffic_class 255 applies, max_sge 0 → 10: %+v", got)
	}
}

func TestServerMemory(t *testing.T) {
	sdev, _ := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, err := NewServer(sdev, netip.MustParseAddrPort("10.0.0.1:18515"), ServerOptions{Telemetry: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.IsConnected() {
		t.Fatal("not connected")
	}
	for _, n := range []int{0, -1} {
		if _, err := s.AllocHostBuffer(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("AllocHostBuffer(%d): %v", n, err)
		}
	}
	b, err := s.AllocHostBuffer(5000)
	if err != nil || len(b) != 5000 || uintptrOf(b)%4096 != 0 {
		t.Fatalf("AllocHostBuffer: %d bytes at %#x, %v", len(b), uintptrOf(b), err)
	}
	// registerBuffer failure cases.
	if _, err := s.RegisterBuffer(nil); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("nil: %v", err)
	}
	if _, err := s.RegisterBuffer(b[:0]); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("size 0: %v", err)
	}
	eleven := make([][]byte, 11)
	for i := range eleven {
		eleven[i] = make([]byte, 16)
	}
	for name, sgl := range map[string][][]byte{"empty": nil, "11 entries": eleven, "nil entry": {b, nil}, "empty entry": {b, b[:0]}} {
		if _, err := s.RegisterSG(sgl); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("RegisterSG %s: %v", name, err)
		}
	}
	ten, err := s.RegisterSG(eleven[:10])
	if err != nil || ten.Entries() != 10 || ten.Size() != 160 {
		t.Fatalf("10 entries: %v", err)
	}
	base, err := s.RegisterBuffer(b)
	if err != nil {
		t.Fatal(err)
	}
	// getRDMABufferFromSgList failure cases.
	viewCases := map[string]struct {
		base *Buffer
		sgl  []SGOffset
	}{
		"empty":          {base, nil},
		"nil base":       {nil, []SGOffset{{0, 1}}},
		"multi-entry":    {ten, []SGOffset{{0, 1}}},
		"sum too large":  {base, []SGOffset{{0, 4000}, {0, 1001}}},
		"outside base":   {base, []SGOffset{{4999, 2}}},
		"offset at end":  {base, []SGOffset{{5000, 1}}},
		"zero-size":      {base, []SGOffset{{0, 0}}},
		"other server's": {&Buffer{s: &Server{}, mrs: base.mrs, size: 5000}, []SGOffset{{0, 1}}},
	}
	for name, c := range viewCases {
		if _, err := s.View(c.base, c.sgl); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("View %s: %v", name, err)
		}
	}
	v, err := s.View(base, []SGOffset{{0, 100}, {4096, 904}})
	if err != nil || v.Size() != 1004 || !v.IsView() {
		t.Fatalf("View: %v", err)
	}
	if _, err := s.View(v, []SGOffset{{0, 1}}); err == nil {
		t.Error("view of a view")
	}
	if err := s.DeregisterBuffer(v); err == nil {
		t.Error("DeregisterBuffer of a view")
	}
	if err := s.DeregisterBuffer(base); err == nil {
		t.Error("DeregisterBuffer with a live view")
	}
	// putRDMABufferFromSgList failure cases.
	if err := s.ReleaseView(nil); err == nil {
		t.Error("ReleaseView(nil)")
	}
	if err := s.ReleaseView(base); err == nil {
		t.Error("ReleaseView of a registered buffer")
	}
	if err := s.ReleaseView(v); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseView(v); err == nil {
		t.Error("ReleaseView twice")
	}
	if err := s.DeregisterBuffer(base); err != nil {
		t.Fatal(err)
	}
	if err := s.DeregisterBuffer(base); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("DeregisterBuffer twice: %v", err)
	}
	if err := s.DeregisterBuffer(ten); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s.IsConnected() {
		t.Error("connected after Close")
	}
	if _, err := s.RegisterBuffer(b); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("RegisterBuffer after Close: %v", err)
	}
}

func TestChannels(t *testing.T) {
	sdev, _ := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, err := NewServer(sdev, netip.MustParseAddrPort("10.0.0.1:18515"), ServerOptions{Telemetry: quiet,
		Tunables: ptr(tun(func(t *Tunables) { t.NumDCIs = 3 }))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for want := uint16(0); want < 3; want++ {
		if id, err := s.AllocateChannel(); err != nil || id != want {
			t.Fatalf("AllocateChannel = %d, %v; want %d", id, err, want)
		}
	}
	if id, err := s.AllocateChannel(); id != InvalidChannelID || !errors.Is(err, ErrNoChannel) {
		t.Fatalf("4th channel: %d, %v", id, err)
	}
	s.FreeChannel(1)
	s.FreeChannel(3)      // ≥ num_dcis: no-op
	s.FreeChannel(0xFFFF) // INVALID_CHANNEL_ID: no-op
	if id, _ := s.AllocateChannel(); id != 1 {
		t.Fatalf("reallocated %d, want 1", id)
	}
	s.FreeChannel(2)
	ev := make([]AsyncEvent, 16)
	for name, c := range map[string]struct {
		ch uint16
		ev []AsyncEvent
	}{"nil events": {0, nil}, "unallocated": {2, ev}, "out of range": {3, ev}, "invalid": {InvalidChannelID, ev}} {
		if _, err := s.Poll(c.ch, c.ev); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Poll %s: %v", name, err)
		}
	}
	if n, err := s.Poll(0, ev); n != 0 || err != nil {
		t.Errorf("Poll with nothing outstanding = %d, %v", n, err)
	}
	if n, err := s.Poll(0, ev[:0]); n != 0 || err != nil {
		t.Errorf("Poll of 0 events = %d, %v", n, err)
	}
}

// TestRequestFailures runs every documented pre-submission failure of
// handleGetObject/handlePutObject; none reaches the client.
func TestRequestFailures(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, nil, nil)
	s := r.srv
	cbuf := make([]byte, 1<<16)
	if err := r.cli.Register(cbuf); err != nil {
		t.Fatal(err)
	}
	desc, err := r.cli.GetRDMAToken(cbuf, 4096, 1024, OpGet)
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := ParseToken(desc)
	ch, _ := s.AllocateChannel()
	other := tok
	other.GID = ib.GIDFromAddr(netip.MustParseAddr("fd00::2"))
	noGID := tok
	noGID.HasGID, noGID.GID = false, ib.GID{}
	sg, _ := s.RegisterSG([][]byte{make([]byte, 100), make([]byte, 100)})
	dereg, _ := s.RegisterBuffer(make([]byte, 100))
	s.DeregisterBuffer(dereg)
	small := tun(func(t *Tunables) { t.MaxSGE = 1 })
	sSmall, err := NewServer(sdev, netip.MustParseAddrPort("10.0.0.1:18516"), ServerOptions{Telemetry: quiet, Tunables: &small})
	if err != nil {
		t.Fatal(err)
	}
	defer sSmall.Close()
	sg1, _ := sSmall.RegisterSG([][]byte{make([]byte, 100), make([]byte, 100)})
	ch1, _ := sSmall.AllocateChannel()
	ok := Request{Local: r.sreg, RemoteAddr: tok.Addr, Size: 4096, Token: desc, Channel: ch}
	mod := func(f func(*Request)) *Request { q := ok; f(&q); return &q }
	cases := []struct {
		name  string
		srv   *Server
		req   *Request
		errno syscall.Errno
		want  error
	}{
		{"nil request", s, nil, syscall.EIO, ErrInvalid},
		{"nil buffer", s, mod(func(q *Request) { q.Local = nil }), syscall.EIO, ErrInvalid},
		{"deregistered buffer", s, mod(func(q *Request) { q.Local = dereg }), syscall.EIO, ErrNotRegistered},
		{"remote 0", s, mod(func(q *Request) { q.RemoteAddr = 0 }), syscall.EIO, ErrInvalid},
		{"size 0", s, mod(func(q *Request) { q.Size = 0 }), syscall.EIO, ErrInvalid},
		{"over 1 GiB", s, mod(func(q *Request) { q.Size = MaxOpSize + 1 }), syscall.EIO, ErrRange},
		{"local overflow", s, mod(func(q *Request) { q.LocalOffset = 1<<20 - 4095 }), syscall.EIO, ErrRange},
		{"local offset past end", s, mod(func(q *Request) { q.LocalOffset = 1<<20 + 1; q.Size = 1 }), syscall.EIO, ErrRange},
		{"sg total", s, mod(func(q *Request) { q.Local = sg; q.Size = 201 }), syscall.EIO, ErrRange},
		{"entries over max_sge", sSmall, mod(func(q *Request) { q.Local = sg1; q.Size = 10; q.Channel = ch1 }), syscall.EIO, ErrInvalid},
		{"empty token", s, mod(func(q *Request) { q.Token = "" }), syscall.EIO, ErrToken},
		{"malformed token", s, mod(func(q *Request) { q.Token = desc[:80] + "G" }), syscall.EIO, ErrToken},
		{"before the region", s, mod(func(q *Request) { q.RemoteAddr = tok.Addr - 1 }), syscall.EIO, ErrRange},
		{"past the region", s, mod(func(q *Request) { q.RemoteAddr = tok.Addr + 1 }), syscall.EIO, ErrRange},
		{"larger than the region", s, mod(func(q *Request) { q.Size = 4097 }), syscall.EIO, ErrRange},
		{"no GID", s, mod(func(q *Request) { q.Token = noGID.String() }), syscall.EIO, ErrToken},
		{"IPv6 client, IPv4 endpoint", s, mod(func(q *Request) { q.Token = other.String() }), syscall.EAFNOSUPPORT, ErrInvalid},
		{"unallocated channel", s, mod(func(q *Request) { q.Channel = 5 }), syscall.EIO, ErrChannel},
		{"channel out of range", s, mod(func(q *Request) { q.Channel = 128 }), syscall.EIO, ErrChannel},
		{"invalid channel", s, mod(func(q *Request) { q.Channel = InvalidChannelID }), syscall.EIO, ErrChannel},
	}
	ctx := ctxT(t, 30*time.Second)
	for _, c := range cases {
		for _, put := range []bool{false, true} {
			h := c.srv.HandleGetObject
			if put {
				h = c.srv.HandlePutObject
			}
			n, err := h(ctx, c.req)
			if n != 0 || !errors.Is(err, c.errno) || !errors.Is(err, c.want) {
				t.Errorf("%s (put %v): %d, %v; want %v and %v", c.name, put, n, err, c.errno, c.want)
			}
			if _, has := CompletionStatus(err); has {
				t.Errorf("%s: a status for a pre-submission error", c.name)
			}
		}
	}
	if st := r.cli.Stats(); st.Connections.Load() != 0 {
		t.Errorf("a refused request reached the client")
	}
	// The valid request works, on the same channel, and the device has
	// not been disturbed.
	if n, err := s.HandleGetObject(ctx, &ok); err != nil || n != 4096 {
		t.Fatalf("valid request: %d, %v", n, err)
	}
	s.Close()
	if _, err := s.HandleGetObject(ctx, &ok); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := s.Poll(ch, make([]AsyncEvent, 1)); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("Poll after Close: %v", err)
	}
}

// TestChannelBusy: a channel serves one goroutine at a time.
func TestChannelBusy(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, nil, nil)
	ch, _ := r.srv.AllocateChannel()
	c, err := r.srv.channel(ch)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.srv.HandleGetObject(context.Background(), &Request{Local: r.sreg, RemoteAddr: 1, Size: 1,
		Token: Token{Addr: 1, Size: 1, HasGID: true, GID: ib.GIDFromAddr(cliIP)}.String(), Channel: ch})
	c.mu.Unlock()
	if !errors.Is(err, ErrChannel) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("busy channel: %v", err)
	}
	if _, err := r.srv.Poll(ch, nil); !errors.Is(err, syscall.EINVAL) {
		t.Fatal(err)
	}
}

var _ = roce.WCSuccess
