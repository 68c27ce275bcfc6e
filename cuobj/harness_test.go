package cuobj

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	srvIP = netip.MustParseAddr("10.0.0.1")
	cliIP = netip.MustParseAddr("10.0.0.2")
	quiet = &Telemetry{Off: true}
)

// memDevices opens two devices on a memlink pair: a for the server, b for
// the client.
func memDevices(t testing.TB, ab, ba faultnet.Config) (*roce.Device, *roce.Device) {
	t.Helper()
	return memDevicesAt(t, ab, ba, srvIP, cliIP)
}

func memDevicesAt(t testing.TB, ab, ba faultnet.Config, srvIP, cliIP netip.Addr) (*roce.Device, *roce.Device) {
	t.Helper()
	return memDevicesWith(t, memlink.Options{AtoB: ab, BtoA: ba}, srvIP, cliIP, nil, nil)
}

// memDevicesWrapped is memDevices with the server's and the client's links
// wrapped by ws and wc (nil: as they are).
func memDevicesWrapped(t testing.TB, ws, wc func(link.Link) link.Link) (*roce.Device, *roce.Device) {
	t.Helper()
	return memDevicesWith(t, memlink.Options{}, srvIP, cliIP, ws, wc)
}

func memDevicesWith(t testing.TB, o memlink.Options, srvIP, cliIP netip.Addr, ws, wc func(link.Link) link.Link) (*roce.Device, *roce.Device) {
	t.Helper()
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}, net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
	o.HardwareAddrA, o.HardwareAddrB = macA, macB
	ma, mb := memlink.PairWithOptions(o)
	var la, lb link.Link = ma, mb
	if ws != nil {
		la = ws(la)
	}
	if wc != nil {
		lb = wc(lb)
	}
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{srvIP}, Neighbours: map[netip.Addr]net.HardwareAddr{cliIP: macB}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{cliIP}, Neighbours: map[netip.Addr]net.HardwareAddr{srvIP: macA}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// rig is a server and a client whose callbacks call the server directly:
// the control path of a test. Objects live in the server's buffer.
type rig struct {
	t      testing.TB
	srv    *Server
	cli    *Client
	sbuf   []byte
	sreg   *Buffer
	chans  chan uint16
	object []byte // what Get serves
	// hook, if set, runs in each callback before the server is called.
	hook func(h *Handle, info *RDMAInfo) error
	// onChannel, if set, runs in each callback once it holds its channel.
	onChannel func(ch uint16)
}

func newRig(t testing.TB, sdev, cdev *roce.Device, size int, copt *ClientOptions, tun *Tunables) *rig {
	t.Helper()
	return newRigAt(t, sdev, cdev, srvIP, size, copt, tun)
}

func newRigAt(t testing.TB, sdev, cdev *roce.Device, saddr netip.Addr, size int, copt *ClientOptions, tun *Tunables) *rig {
	t.Helper()
	so := ServerOptions{Tunables: tun, Telemetry: quiet}
	if copt != nil {
		so.Proto = copt.Proto // the server speaks the client's protocol
	}
	srv, err := NewServer(sdev, netip.AddrPortFrom(saddr, 18515), so)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	r := &rig{t: t, srv: srv, chans: make(chan uint16, 256)}
	if r.sbuf, err = srv.AllocHostBuffer(size); err != nil {
		t.Fatal(err)
	}
	if r.sreg, err = srv.RegisterBuffer(r.sbuf); err != nil {
		t.Fatal(err)
	}
	o := ClientOptions{Telemetry: quiet, Config: ptr(DefaultConfig())}
	if copt != nil {
		o = *copt
		if o.Config == nil {
			o.Config = ptr(DefaultConfig())
		}
		o.Telemetry = quiet
	}
	r.cli, err = NewClient(cdev, Ops{Get: r.get, Put: r.put}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cli.Close() })
	return r
}

func ptr[T any](v T) *T { return &v }

// channel takes a server channel for one callback.
func (r *rig) channel() uint16 {
	select {
	case ch := <-r.chans:
		return ch
	default:
	}
	ch, err := r.srv.AllocateChannel()
	if err != nil {
		r.t.Errorf("AllocateChannel: %v", err)
	}
	return ch
}

func (r *rig) get(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
	info.AllowServer(r.srv.Addr().Addr())
	if r.hook != nil {
		if err := r.hook(h, info); err != nil {
			return 0, err
		}
	}
	ch := r.channel()
	defer func() { r.chans <- ch }()
	if r.onChannel != nil {
		r.onChannel(ch)
	}
	n := min(int64(len(chunk)), int64(len(r.object))-off)
	if n <= 0 {
		return 0, nil
	}
	copy(r.sbuf[off:], r.object[off:off+n])
	got, err := r.srv.HandleGetObject(h.Context(), &Request{Key: "get", Local: r.sreg, LocalOffset: uint64(off),
		RemoteAddr: info.Token.Addr, Size: uint64(n), Token: info.Desc, Channel: ch})
	return int(got), err
}

func (r *rig) put(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
	info.AllowServer(r.srv.Addr().Addr())
	if r.hook != nil {
		if err := r.hook(h, info); err != nil {
			return 0, err
		}
	}
	ch := r.channel()
	defer func() { r.chans <- ch }()
	if r.onChannel != nil {
		r.onChannel(ch)
	}
	got, err := r.srv.HandlePutObject(h.Context(), &Request{Key: "put", Local: r.sreg, LocalOffset: uint64(off),
		RemoteAddr: info.Token.Addr, Size: uint64(len(chunk)), Token: info.Desc, Channel: ch})
	return int(got), err
}

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip GETs the rig's object into a fresh registered buffer and PUTs
// another back, checking both.
func (r *rig) roundTrip(ctx context.Context, size int, seed uint64) {
	t := r.t
	t.Helper()
	r.object = pattern(size, seed)
	buf := make([]byte, size)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	defer r.cli.Deregister(buf)
	n, err := r.cli.Get(ctx, "user", buf, 0, 0)
	if err != nil || n != int64(size) {
		t.Fatalf("Get %d bytes = %d, %v", size, n, err)
	}
	if !bytes.Equal(buf, r.object) {
		t.Fatalf("Get %d bytes: data differs", size)
	}
	want := pattern(size, seed+1)
	copy(buf, want)
	clear(r.sbuf[:size])
	if n, err = r.cli.Put(ctx, "user", buf, 0, 0); err != nil || n != int64(size) {
		t.Fatalf("Put %d bytes = %d, %v", size, n, err)
	}
	if !bytes.Equal(r.sbuf[:size], want) {
		t.Fatalf("Put %d bytes: data differs", size)
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// reserve maps n bytes of address space that is never touched (no
// memory behind it): for checks of size limits.
func reserve(t testing.TB, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		t.Skipf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// idleConns counts the client's live connections of server on rl that no
// live window is bound through (those windowConn picks from).
func (c *Client) idleConns(rl *rail, server netip.Addr) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, sc := range c.conns {
		if sc.rail == rl && sc.from == server && sc.windows == 0 && sc.live() {
			n++
		}
	}
	return n
}
