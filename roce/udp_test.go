package roce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce/link/udplink"
)

// udpPair opens two devices on kernel UDP sockets on 127.0.0.1 with
// kernel-chosen ports, each sending to the other's port.
func udpPair(t testing.TB) (*Device, *Device) {
	t.Helper()
	lo := netip.MustParseAddr("127.0.0.1")
	la, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	da, err := OpenLink(la, Options{Addrs: []netip.Addr{lo}, Port: lb.LocalAddr().Port()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{lo}, Port: la.LocalAddr().Port()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

func TestUDPLinkRC(t *testing.T) {
	da, db := udpPair(t)
	lo := netip.MustParseAddr("127.0.0.1")
	a := newEndpoint(t, da, RC, 4*70000+64)
	b := newEndpoint(t, db, RC, 4*70000+64)
	connect(t, a, b, lo, lo, ConnectAttr{})
	exerciseRC(t, a, b, 70000)
	if p := a.qp.SourcePort(); p != da.Info().Link.FixedSourcePort {
		t.Fatalf("QP source port %d on a UDP link fixed at %d", p, da.Info().Link.FixedSourcePort)
	}
	ca, cb := da.Counters(), db.Counters()
	if ca.SentPkts == 0 || cb.RcvdPkts == 0 || ca.RDMASends == 0 || cb.RDMARecvs == 0 {
		t.Fatalf("counters did not move: A %v B %v", ca.Map(), cb.Map())
	}
}

func TestUDPLinkUD(t *testing.T) {
	da, db := udpPair(t)
	lo := netip.MustParseAddr("127.0.0.1")
	a := newEndpoint(t, da, UD, 4096)
	b := newEndpoint(t, db, UD, 4096)
	connect(t, a, b, lo, lo, ConnectAttr{})
	exerciseUD(t, a, b, ib.GIDFromAddr(lo), 1000, 10)
}
