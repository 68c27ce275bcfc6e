package udplink

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
)

// TestBetweenNamespaces runs the link as between two hosts: two namespaces
// joined by a veth pair with MTU 1500, both ends on the RoCEv2 port.
func TestBetweenNamespaces(t *testing.T) {
	netnstest.RequireRoot(t)
	for _, fam := range []struct {
		name, a, b string
		ipHdr      int
	}{
		{"IPv4", "10.99.0.1/24", "10.99.0.2/24", 20},
		{"IPv6", "fd99::1/64", "fd99::2/64", 40},
		{"IPv6-link-local", "fe80::99:1/64", "fe80::99:2/64", 40},
	} {
		t.Run(fam.name, func(t *testing.T) {
			p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500,
				Addr: netip.MustParsePrefix(fam.a), PeerAddr: netip.MustParsePrefix(fam.b)})
			// The first WriteBatch is 200 datagrams at once: the kernel
			// would queue only 92 of them for a neighbour still being
			// resolved and drop the rest.
			p.Resolve(t)
			betweenNamespaces(t, p, fam.ipHdr)
		})
	}
}

func betweenNamespaces(t *testing.T, p *netnstest.Pair, ipHdr int) {
	var a, b *Link
	open := func(ns *netnstest.NS, v *netnstest.Veth, l **Link) {
		if err := ns.Do(func() (err error) {
			ip := v.Addr.Addr()
			if ip.IsLinkLocalUnicast() {
				ip = ip.WithZone(v.Name)
			}
			*l, err = Listen(netip.AddrPortFrom(ip, 0))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { (*l).Close() })
	}
	open(p.A, p.VethA, &a)
	open(p.B, p.VethB, &b)
	if a.LocalAddr().Port() != DefaultPort || a.Info().FixedSourcePort != DefaultPort {
		t.Fatalf("bound %v, info %+v", a.LocalAddr(), a.Info())
	}
	if a.MTU() != 1500 || a.HardwareAddr().String() != p.VethA.HardwareAddr.String() {
		t.Fatalf("MTU %d MAC %v, want 1500 %v", a.MTU(), a.HardwareAddr(), p.VethA.HardwareAddr)
	}

	const n = 200
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(i, 64+i*7))
	}
	// The largest datagram that fits the MTU.
	maxPayload := 1500 - ipHdr - 8
	frames[n-1] = mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(n-1, maxPayload))
	// Resolve the neighbour first: while the kernel resolves it, it queues
	// only unres_qlen_bytes of datagrams (about 90 of these) and drops the
	// rest of a burst.
	if k, err := a.WriteBatch(frames[:1]); k != 1 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	collect(t, b, a.LocalAddr(), 1, 5*time.Second)
	if k, err := a.WriteBatch(frames); k != n || err != nil {
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	got := collect(t, b, a.LocalAddr(), n, 5*time.Second)
	for i, f := range got {
		if string(f[:6]) != string(p.VethB.HardwareAddr) {
			t.Fatalf("synthesized destination MAC % x, want %v", f[:6], p.VethB.HardwareAddr)
		}
		pf, _ := link.ParseFrame(f)
		if string(f[pf.Payload:pf.End]) != string(frames[i][14+ipHdr+8:]) {
			t.Fatalf("frame %d altered", i)
		}
	}

	// One byte more does not fit: DF is set, so the kernel refuses it
	// instead of fragmenting.
	big := mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, maxPayload+1))
	k, err := a.WriteBatch([][]byte{frames[0], big})
	var fe *link.FrameError
	if k != 1 || !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, link.ErrTooLarge) {
		t.Fatalf("oversize datagram: n=%d err=%v, want 1 and ErrTooLarge at index 1", k, err)
	}
	collect(t, b, a.LocalAddr(), 1, 5*time.Second)
}
