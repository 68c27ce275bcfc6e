package netdev_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/xdp"
)

func readyPair(t *testing.T, mtu int) *netnstest.Pair {
	t.Helper()
	p := netnstest.NewPair(t, mtu) // skips unless root with netns support
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// open opens a device on ifname inside ns.
func open(t *testing.T, ns *netnstest.NS, ifname string, opts netdev.Options) (*roce.Device, error) {
	t.Helper()
	var d *roce.Device
	err := ns.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err = netdev.Open(ctx, ifname, opts)
		return err
	})
	if err == nil {
		t.Cleanup(func() { d.Close() })
	}
	return d, err
}

func TestOpenUDP(t *testing.T) {
	p := readyPair(t, 1500)
	d, err := open(t, p.A, p.VethA.Name, netdev.Options{Link: netdev.LinkUDP})
	if err != nil {
		t.Fatal(err)
	}
	info := d.Info()
	if info.Link.Kind != link.KindUDP || info.Name != p.VethA.Name || info.Fallback != "" {
		t.Fatalf("info %+v: want the UDP link on %s, no fallback", info, p.VethA.Name)
	}
	// The link is bound to the interface's address, which is GID 1.
	if _, err := d.GIDIndex(p.VethA.Addr.Addr()); err != nil {
		t.Fatalf("GID table %v: %v", d.GIDs(), err)
	}
}

func TestOpenNoAddress(t *testing.T) {
	a, b := netnstest.New(t), netnstest.New(t)
	v, _ := netnstest.NewVeth(t, a, b, netnstest.VethConfig{})
	_, err := open(t, v.NS, v.Name, netdev.Options{Link: netdev.LinkUDP})
	if !errors.Is(err, roce.ErrNoAddress) {
		t.Fatalf("UDP link on an interface without addresses: %v, want ErrNoAddress", err)
	}
	if _, err := open(t, v.NS, "nosuchif0", netdev.Options{Link: netdev.LinkUDP}); err == nil {
		t.Fatal("Open of a missing interface succeeded")
	}
}

// When AF_XDP cannot be used, Open falls back to the kernel UDP link and says
// why; with LinkXDP it fails instead.
func TestOpenFallback(t *testing.T) {
	p := readyPair(t, 1500)
	// Queue 3 does not exist on a single-queue veth.
	d, err := open(t, p.A, p.VethA.Name, netdev.Options{XDP: xdplink.Options{Queue: 3}})
	if err != nil {
		t.Fatal(err)
	}
	info := d.Info()
	if info.Link.Kind != link.KindUDP || info.Fallback == "" || info.Name != p.VethA.Name {
		t.Fatalf("info %+v: want a UDP link on %s and a fallback reason", info, p.VethA.Name)
	}
	t.Logf("fallback: %s", info.Fallback)
	if _, err := open(t, p.B, p.VethB.Name, netdev.Options{Link: netdev.LinkXDP, XDP: xdplink.Options{Queue: 3}}); err == nil {
		t.Fatal("LinkXDP on a missing queue succeeded")
	}
}

// On a 9000-byte interface a full frame does not fit one 4 KiB UMEM chunk:
// Open turns on multi-buffer, and the port runs at MTU 4096.
func TestOpenXDPJumbo(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 9000)
	d, err := open(t, p.A, p.VethA.Name, netdev.Options{Link: netdev.LinkXDP})
	if errors.Is(err, xdp.ErrNotSupported) {
		t.Skipf("AF_XDP unavailable on this kernel or machine: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if k := d.Info().Link.Kind; k != link.KindAFXDP {
		t.Fatalf("link kind %q", k)
	}
	if m := d.QueryPort().ActiveMTU; m != ib.MTU4096 {
		t.Fatalf("active MTU %v on a 9000-byte link", m)
	}
}

func TestLinkKindString(t *testing.T) {
	for k, want := range map[netdev.LinkKind]string{netdev.LinkAuto: "auto", netdev.LinkXDP: "xdp", netdev.LinkUDP: "udp", 7: "LinkKind(7)"} {
		if got := k.String(); got != want {
			t.Errorf("%d: %q, want %q", int(k), got, want)
		}
	}
}

// XDP.BusyPoll reaches the AF_XDP sockets; it is off by default.
func TestXDPBusyPoll(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 1500)
	for _, c := range []struct {
		bp   time.Duration
		want bool
	}{{0, false}, {-1, false}, {50 * time.Microsecond, true}} {
		opts := netdev.Options{Link: netdev.LinkXDP}
		opts.XDP.BusyPoll = c.bp
		d, err := open(t, p.A, p.VethA.Name, opts)
		if errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		xl, ok := d.Link().(*xdplink.Link)
		if !ok {
			t.Fatalf("link %T, want AF_XDP", d.Link())
		}
		on, why := xl.BusyPolling()
		switch {
		case c.want && !on && errors.Is(why, xdp.ErrNotSupported):
			t.Logf("busy polling unsupported here: %v", why)
		case on != c.want:
			t.Errorf("BusyPoll %v: busy polling %v (%v), want %v", c.bp, on, why, c.want)
		}
		d.Close()
	}
}
