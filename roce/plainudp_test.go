package roce

import (
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/udplink"
)

var (
	loA = netip.MustParseAddr("127.0.0.1")
	loB = netip.MustParseAddr("127.0.0.2")
)

// The portable kernel UDP link (what udplink.Listen opens off Linux)
// carries RC traffic between two devices, as the Linux link does.
func TestPlainUDPLinkRC(t *testing.T) {
	la, err := udplink.ListenPlain(netip.AddrPortFrom(loA, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	lb, err := udplink.ListenPlain(netip.AddrPortFrom(loB, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.2: %v", err)
	}
	da, err := OpenLink(la, Options{Addrs: []netip.Addr{loA}, Port: lb.LocalAddr().Port()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{loB}, Port: la.LocalAddr().Port()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := newEndpoint(t, da, RC, 4*70000+64)
	b := newEndpoint(t, db, RC, 4*70000+64)
	connect(t, a, b, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
	exerciseRC(t, a, b, 70000)
	ca, cb := da.Counters(), db.Counters()
	if ca.SentPkts == 0 || cb.RcvdPkts == 0 || ca.RDMASends == 0 || cb.RDMARecvs == 0 {
		t.Fatalf("counters did not move: A %v B %v", ca.Map(), cb.Map())
	}
	a2 := newEndpoint(t, da, UD, 4096)
	b2 := newEndpoint(t, db, UD, 4096)
	connect(t, a2, b2, loA, loB, ConnectAttr{})
	exerciseUD(t, a2, b2, ib.GIDFromAddr(loB), 1000, 10)
}
