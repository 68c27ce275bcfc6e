//go:build linux

package netdev_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/xdp"
)

// udSide is a UD QP with a slab of posted receives.
type udSide struct {
	dev  *roce.Device
	pd   *roce.PD
	cq   *roce.CQ
	qp   *roce.QP
	slab *roce.RecvSlab
}

func newUDSide(t *testing.T, d *roce.Device) *udSide {
	t.Helper()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.Connect(ctx, &roce.ConnectAttr{QKey: 0x1234}); err != nil {
		t.Fatal(err)
	}
	slab, err := pd.NewRecvSlab(q, 16, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return &udSide{d, pd, cq, q, slab}
}

// send sends msg from s to dst's QP at addr, until dst receives it or the
// deadline passes (a datagram may be lost on a busy machine).
func (s *udSide) sendUntilReceived(t *testing.T, dst *udSide, addr netip.Addr, msg string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ah, err := s.pd.CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(addr)})
	if err != nil {
		t.Fatal(err)
	}
	var wc [8]roce.WorkCompletion
	for {
		if err := s.qp.PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline, Inline: []byte(msg),
			AH: ah, RemoteQPN: dst.qp.QPN(), RemoteQKey: 0x1234}); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		dst.cq.Wait(wctx)
		wcancel()
		n := dst.cq.Poll(wc[:])
		for i := range wc[:n] {
			got := string(dst.slab.Bytes(&wc[i]))
			dst.slab.Repost(&wc[i])
			if got == msg {
				return nil
			}
		}
		s.cq.Poll(wc[:]) // the sends' completions
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// TestXDPLeavesOtherAddrs: an AF_XDP device on lo takes only the RoCEv2
// frames addressed to its GID table. Two devices on the kernel UDP link,
// bound to 127.0.0.5 and 127.0.0.6 of the same lo, still exchange
// datagrams (before the address filter their frames were steered into the
// AF_XDP socket and lost), while frames to 127.0.0.1 still reach the AF_XDP
// device.
func TestXDPLeavesOtherAddrs(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	ns := netnstest.New(t)
	xd, err := open(t, ns, "lo", netdev.Options{Link: netdev.LinkXDP, XDP: xdplink.Options{}})
	if errors.Is(err, xdp.ErrNotSupported) {
		t.Skipf("AF_XDP unavailable on lo: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	if _, err := xd.GIDIndex(lo); err != nil {
		t.Fatalf("GID table %v: %v", xd.GIDs(), err)
	}
	xl, ok := xd.Link().(*xdplink.Link)
	if !ok {
		t.Fatalf("link %T, want AF_XDP", xd.Link())
	}

	a5, a6 := netip.MustParseAddr("127.0.0.5"), netip.MustParseAddr("127.0.0.6")
	d5, d6 := udpDev(t, ns, a5), udpDev(t, ns, a6)
	s5, s6, sx := newUDSide(t, d5), newUDSide(t, d6), newUDSide(t, xd)

	before, err := xl.SteeringStats()
	if err != nil {
		t.Fatal(err)
	}
	if err := s5.sendUntilReceived(t, s6, a6, "to the UDP link on 127.0.0.6"); err != nil {
		st, _ := xl.SteeringStats()
		t.Fatalf("127.0.0.5 to 127.0.0.6 beside an AF_XDP device: %v (steering %+v)", err, st)
	}
	if err := s6.sendUntilReceived(t, s5, a5, "to the UDP link on 127.0.0.5"); err != nil {
		t.Fatalf("127.0.0.6 to 127.0.0.5: %v", err)
	}
	if err := s5.sendUntilReceived(t, sx, lo, "to the AF_XDP device"); err != nil {
		t.Fatalf("127.0.0.5 to the AF_XDP device on 127.0.0.1: %v", err)
	}
	after, err := xl.SteeringStats()
	if err != nil {
		t.Fatal(err)
	}
	if after.OtherAddr < before.OtherAddr+2 || after.Redirected == before.Redirected {
		t.Fatalf("steering %+v then %+v: want frames passed for other addresses and frames redirected", before, after)
	}
	t.Logf("steering on lo: %+v", after)
}

// TestXDPLeavesOtherAddrsVeth: on a veth whose second address is served by
// another stack (here a device on the kernel UDP link), an AF_XDP device
// serving only the first address leaves the second one's frames to the
// kernel.
func TestXDPLeavesOtherAddrsVeth(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 1500)
	served := p.VethB.Addr.Addr()
	other := served.Next()
	if err := p.B.Do(func() error {
		l, err := p.B.Netlink().LinkByName(p.VethB.Name)
		if err != nil {
			return err
		}
		return p.B.Netlink().AddrAdd(l, &netlink.Addr{IPNet: netipx(netip.PrefixFrom(other, p.VethB.Addr.Bits()))})
	}); err != nil {
		t.Fatal(err)
	}
	var xl *xdplink.Link
	if err := p.B.Do(func() (err error) {
		xl, err = xdplink.Open(p.VethB.Name, xdplink.Options{})
		return err
	}); errors.Is(err, xdp.ErrNotSupported) {
		t.Skipf("AF_XDP unavailable: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	xd, err := roce.OpenLink(xl, roce.Options{Addrs: []netip.Addr{served}})
	if err != nil {
		xl.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { xd.Close() })

	da, db := udpDev(t, p.A, p.VethA.Addr.Addr()), udpDev(t, p.B, other)
	sa, sb, sx := newUDSide(t, da), newUDSide(t, db), newUDSide(t, xd)
	if err := sa.sendUntilReceived(t, sb, other, "to the UDP link beside AF_XDP"); err != nil {
		st, _ := xl.SteeringStats()
		t.Fatalf("to %v beside an AF_XDP device serving %v: %v (steering %+v)", other, served, err, st)
	}
	if err := sa.sendUntilReceived(t, sx, served, "to the AF_XDP device"); err != nil {
		t.Fatalf("to the AF_XDP device on %v: %v", served, err)
	}
	st, err := xl.SteeringStats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OtherAddr == 0 || st.Redirected == 0 {
		t.Fatalf("steering %+v: want frames passed for the other address and frames redirected", st)
	}
	t.Logf("steering on %s: %+v", p.VethB.Name, st)
}

// udpDev opens a device on the kernel UDP link bound to addr:4791 in ns.
func udpDev(t *testing.T, ns *netnstest.NS, addr netip.Addr) *roce.Device {
	t.Helper()
	var l *udplink.Link
	if err := ns.Do(func() (err error) {
		l, err = udplink.Listen(netip.AddrPortFrom(addr, 4791))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d, err := roce.OpenLink(l, roce.Options{Addrs: []netip.Addr{addr}})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func netipx(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
