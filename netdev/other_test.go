//go:build !linux

package netdev_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// loopback is the name of the loopback interface (lo0, or Windows's).
func loopback(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Skip(err)
	}
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagLoopback != 0 && ifi.Flags&net.FlagUp != 0 {
			return ifi.Name
		}
	}
	t.Skip("no loopback interface")
	return ""
}

// Off Linux, Open runs the kernel UDP link: LinkAuto falls back to it and
// says why, LinkXDP is refused, and neighbours are not resolved.
func TestOpenOffLinux(t *testing.T) {
	lo := loopback(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := netdev.Open(ctx, lo, netdev.Options{Link: netdev.LinkXDP}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("LinkXDP: %v, want errors.ErrUnsupported", err)
	}
	bind := netip.MustParseAddr("127.0.0.1")
	d, err := netdev.Open(ctx, lo, netdev.Options{UDPAddr: bind, Device: roce.Options{Port: 47917}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info := d.Info()
	if info.Link.Kind != link.KindUDP || !strings.Contains(info.Fallback, "needs Linux") || info.Name != lo {
		t.Fatalf("info %+v: want the UDP link on %s and why", info, lo)
	}
	if _, err := d.GIDIndex(bind); err != nil {
		t.Fatalf("GID table %v: %v", d.GIDs(), err)
	}
	if _, err := d.ResolveNeighbour(ctx, bind); err != nil {
		t.Fatalf("the UDP link needs no neighbour: %v", err)
	}
}
