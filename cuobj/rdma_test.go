package cuobj

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"

	"github.com/goroce/goroce/link/faultnet"
)

func TestGetPutMemlink(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 8<<20, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	for i, size := range []int{1, 7, 4096, 4097, 65536, 1 << 20, 8 << 20} {
		r.roundTrip(ctx, size, uint64(i))
	}
	if st := r.cli.Stats(); st.Connections.Load() != 1 {
		t.Errorf("%d connections, want 1 (kept between requests)", st.Connections.Load())
	}
}

// TestIPv6 serves an IPv6 client from an IPv6 endpoint, which
// refuses IPv4 tokens with EAFNOSUPPORT.
func TestIPv6(t *testing.T) {
	s6, c6 := netip.MustParseAddr("fd00::10"), netip.MustParseAddr("fd00::20")
	sdev, cdev := memDevicesAt(t, faultnet.Config{}, faultnet.Config{}, s6, c6)
	r := newRigAt(t, sdev, cdev, s6, 1<<20, &ClientOptions{Addr: netip.AddrPortFrom(c6, 0)}, nil)
	ctx := ctxT(t, 30*time.Second)
	r.roundTrip(ctx, 100000, 1)
	if a := r.cli.Addr().Addr(); a != c6 {
		t.Fatalf("client address %v", a)
	}
	buf := make([]byte, 10)
	r.cli.Register(buf)
	tok, _ := r.cli.GetRDMAToken(buf, 10, 0, OpGet)
	if p, _ := ParseToken(tok); netip.AddrFrom16(p.GID) != c6 {
		t.Fatalf("token GID %v", p.GID)
	}
	v6srv, err := NewServer(sdev, netip.MustParseAddrPort("[fd00::10]:1"), ServerOptions{Telemetry: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer v6srv.Close()
	wrong := Token{Addr: 1, Size: 1, HasGID: true, GID: ib.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}
	ch, _ := v6srv.AllocateChannel()
	reg, _ := v6srv.RegisterBuffer(make([]byte, 1))
	if _, err := v6srv.HandleGetObject(ctx, &Request{Local: reg, RemoteAddr: 1, Size: 1, Token: wrong.String(), Channel: ch}); !errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Fatalf("IPv4 client at an IPv6 endpoint: %v", err)
	}
}
