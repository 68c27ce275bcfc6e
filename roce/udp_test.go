package roce

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce/link/udplink"
)

var (
	loA = netip.MustParseAddr("127.0.0.1")
	loB = netip.MustParseAddr("127.0.0.2")
)

// udpPair opens two devices on kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2 with kernel-chosen ports, each sending to the other's port.
func udpPair(t testing.TB) (*Device, *Device) {
	t.Helper()
	la, err := udplink.ListenOptions(netip.AddrPortFrom(loA, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(loB, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
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
	return da, db
}

func TestUDPLinkRC(t *testing.T) {
	da, db := udpPair(t)
	a := newEndpoint(t, da, RC, 4*70000+64)
	b := newEndpoint(t, db, RC, 4*70000+64)
	// 127.0.0.2 is not an interface address, so B's link reports MTU 1500:
	// agree on 1024 (B would reject longer packets with REM_INV_REQ).
	connect(t, a, b, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
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
	a := newEndpoint(t, da, UD, 4096)
	b := newEndpoint(t, db, UD, 4096)
	connect(t, a, b, loA, loB, ConnectAttr{})
	exerciseUD(t, a, b, ib.GIDFromAddr(loB), 1000, 10)
}

// A frame the link refuses (here: a source address the UDP socket is not
// bound to) is counted and explained, and the QP's work ends in
// RETRY_EXC_ERR rather than hanging.
func TestUDPLinkRefusedFrame(t *testing.T) {
	la, err := udplink.ListenOptions(netip.AddrPortFrom(loA, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	other := netip.MustParseAddr("127.0.0.3")
	d, err := OpenLink(la, Options{Addrs: []netip.Addr{loA, other}, Port: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a := newEndpoint(t, d, RC, 4096)
	if err := a.qp.Connect(t.Context(), &ConnectAttr{RemoteQPN: 17, RemoteAddr: loB, SGID: ib.GIDFromAddr(other),
		PathMTU: ib.MTU1024, Timeout: 8, RetryCnt: 1, NoDefaults: true}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 10)}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 5*time.Second); wc.Status != WCRetryExcErr {
		t.Fatalf("status %v", wc.Status)
	}
	if c := d.Counters(); c.SendErr == 0 {
		t.Fatalf("send_err did not move: %v", c.Map())
	}
	if e := d.Info().LastSendError; !strings.Contains(e, "source address") {
		t.Fatalf("LastSendError %q", e)
	}
}
