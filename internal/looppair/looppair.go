package looppair

import (
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

// Prefix returns a random 127.R.S.0, so that another run of the suite on
// the same host at the same time uses other addresses.
func Prefix() [4]byte {
	return [4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), 0}
}

// Pair opens the server's device, serving srv, and the client's, serving
// cli, each sending to the other's kernel-chosen port. Both links are
// bound to the IPv4 wildcard address: one port serves every address of a
// device, packets to an address neither serves reach the client's socket
// and are dropped by its device (as memlink's are), and both links report
// the same MTU (DC has no path MTU negotiation, and a link bound to a
// loopback address reports lo's). It skips where 127.R.S.x or a wildcard
// socket cannot be had, and fails the test at cleanup if the link carried
// nothing either way.
func Pair(t testing.TB, srv []netip.Addr, cli netip.Addr) (sdev, cdev *roce.Device) {
	t.Helper()
	return PairMTU(t, srv, cli, 0)
}

// PairMTU is Pair with both links reporting mtu (0: a wildcard's 1500,
// so a path MTU of 1024). Benchmarks set lo's, as a link bound to a
// loopback address reports it (perf --loopback's path MTU of 4096).
func PairMTU(t testing.TB, srv []netip.Addr, cli netip.Addr, mtu int) (sdev, cdev *roce.Device) {
	t.Helper()
	// Linux routes all of 127.0.0.0/8 to lo; some systems only 127.0.0.1.
	probe, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(cli, 0)))
	if err != nil {
		t.Skipf("no UDP socket on %v: %v", cli, err)
	}
	probe.Close()
	ls, err := udplink.ListenOptions(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), udplink.Options{EphemeralPort: true, WildcardMTU: mtu})
	if err != nil {
		t.Skipf("no UDP socket on the IPv4 wildcard address: %v", err)
	}
	lc, err := udplink.ListenOptions(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), udplink.Options{EphemeralPort: true, WildcardMTU: mtu})
	if err != nil {
		ls.Close()
		t.Skipf("no second UDP socket on the IPv4 wildcard address: %v", err)
	}
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	sdev, err = roce.OpenLink(ls, roce.Options{Addrs: srv, Port: lc.LocalAddr().Port(), Logger: lg})
	if err != nil {
		ls.Close()
		lc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { sdev.Close() })
	cdev, err = roce.OpenLink(lc, roce.Options{Addrs: []netip.Addr{cli}, Port: ls.LocalAddr().Port(), Logger: lg})
	if err != nil {
		lc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cdev.Close() })
	// Runs before the devices close: the test went over the sockets.
	t.Cleanup(func() {
		if s, c := sdev.Counters(), cdev.Counters(); s.RcvdPkts == 0 || c.RcvdPkts == 0 {
			t.Errorf("the UDP link carried nothing: server %v, client %v", s.Map(), c.Map())
		}
	})
	return sdev, cdev
}
