//go:build linux

package roce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/xdp"
)

func readyPair(t testing.TB, mtu int) *netnstest.Pair {
	t.Helper()
	p := netnstest.NewPair(t, mtu) // skips unless root with netns support
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// linkKind is the link openIn opens. Choosing one by interface name, with
// the fallback, is package netdev's and tested there.
type linkKind int

const (
	udpLink linkKind = iota
	xdpLink
)

// OpenFollowing is netdev.OpenLink, which follows an interface through
// rtnetlink for the device. Package netdev imports roce, so only an external
// test file can reach it: follow_test.go sets it.
var OpenFollowing func(l link.Link, ifname string, opts Options) (*Device, error)

// openIn opens a device over a link of the given kind on v, inside its
// namespace, following v through netlink (OpenFollowing).
func openIn(t testing.TB, v *netnstest.Veth, kind linkKind, opts Options) *Device {
	t.Helper()
	return openBound(t, v, kind, v.Addr.Addr(), opts)
}

// openBound is openIn with the UDP link bound to addr.
func openBound(t testing.TB, v *netnstest.Veth, kind linkKind, bind netip.Addr, opts Options) *Device {
	t.Helper()
	var d *Device
	err := v.NS.Do(func() error {
		var l link.Link
		var err error
		if kind == xdpLink {
			ifi, err := net.InterfaceByName(v.Name)
			if err != nil {
				return err
			}
			// Frames beyond one 4 KiB UMEM chunk need multi-buffer.
			l, err = xdplink.Open(v.Name, xdplink.Options{Multibuffer: ifi.MTU > 3000})
			if err != nil {
				return err
			}
		} else if l, err = udplink.Listen(netip.AddrPortFrom(bind, ib.RoCEv2Port)); err != nil {
			return err
		}
		if OpenFollowing == nil {
			return errors.New("no OpenFollowing: follow_test.go sets it")
		}
		if d, err = OpenFollowing(l, v.Name, opts); err != nil {
			l.Close()
		}
		return err
	})
	if err != nil {
		if kind == xdpLink && errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable on this kernel or machine: %v", err)
		}
		t.Fatalf("opening a device on %s: %v", v.Name, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// waitFor polls cond for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNetnsGIDTable(t *testing.T) {
	p := readyPair(t, 1500)
	d := openIn(t, p.VethA, udpLink, Options{})
	var mac [6]byte
	copy(mac[:], p.VethA.HardwareAddr)
	g0, err := d.GID(0)
	if err != nil || g0 != defaultGID(mac) {
		t.Fatalf("GID 0 = %v (%v), want %v", g0, err, defaultGID(mac))
	}
	g1, err := d.GID(1)
	if want := ib.GIDFromAddr(netip.MustParseAddr("10.99.0.1")); err != nil || g1 != want {
		t.Fatalf("GID 1 = %v (%v), want %v; table %v", g1, err, want, d.GIDs())
	}
	if got := d.Info().Link.Kind; got != "udp" {
		t.Fatalf("link kind %q", got)
	}
	if pa := d.QueryPort(); pa.ActiveMTU != ib.MTU1024 || pa.State != PortActive {
		t.Fatalf("port %+v", pa)
	}
	d.Close()

	// A UDP link bound to 0.0.0.0 serves every IPv4 address and no IPv6
	// one: the table follows the first and leaves out the second.
	d = openBound(t, p.VethA, udpLink, netip.IPv4Unspecified(), Options{})
	if g, err := d.GID(1); err != nil || g != g1 {
		t.Fatalf("GID 1 = %v (%v), want %v; table %v", g, err, g1, d.GIDs())
	}
	h := p.A.Netlink()
	l, err := p.VethA.Link()
	if err != nil {
		t.Fatal(err)
	}
	extra4 := netip.MustParsePrefix("10.77.0.1/24")
	extra6 := netip.MustParsePrefix("2001:db8::1/64")
	// extra6 first: once extra4 is in the table, the update that brought
	// it listed extra6 as well.
	for _, pfx := range []netip.Prefix{extra6, extra4} {
		a := &netlink.Addr{IPNet: prefixNet(pfx)}
		if pfx.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the new address in the GID table", func() bool {
		_, err := d.GIDIndex(extra4.Addr())
		return err == nil
	})
	if _, err := d.GIDIndex(extra6.Addr()); !errors.Is(err, ErrNoGID) {
		t.Fatalf("an IPv6 address in the table of an IPv4 UDP link: %v", err)
	}
	i4, _ := d.GIDIndex(extra4.Addr())
	if i4 < 2 {
		t.Fatalf("new address at index %d", i4)
	}
	t.Logf("GID table: %v", d.GIDs())
	if err := h.AddrDel(l, &netlink.Addr{IPNet: prefixNet(extra4)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed address to leave the GID table", func() bool {
		_, err := d.GIDIndex(extra4.Addr())
		return errors.Is(err, ErrNoGID)
	})
	// The others keep their indices.
	if g, _ := d.GID(1); g != g1 {
		t.Fatalf("GID 1 changed to %v", g)
	}
	if _, err := d.GID(i4); !errors.Is(err, ErrNoGID) {
		t.Fatalf("slot %d of a removed address: %v", i4, err)
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// RC and UD between two namespaces over AF_XDP on a veth pair.
func TestNetnsXDP(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 1500)
	var capA bytes.Buffer
	da := openIn(t, p.VethA, xdpLink, Options{Capture: &capA})
	db := openIn(t, p.VethB, xdpLink, Options{})
	if k := da.Info().Link.Kind; k != "afxdp" {
		t.Fatalf("link kind %q", k)
	}
	ipA, ipB := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	a := newEndpoint(t, da, RC, 4*30000+64)
	b := newEndpoint(t, db, RC, 4*30000+64)
	connect(t, a, b, ipA, ipB, ConnectAttr{})
	exerciseRC(t, a, b, 30000)

	ua := newEndpoint(t, da, UD, 4096)
	ub := newEndpoint(t, db, UD, 4096)
	connect(t, ua, ub, ipA, ipB, ConnectAttr{})
	exerciseUD(t, ua, ub, ib.GIDFromAddr(ipB), 1024, 10)

	mac, err := da.ResolveNeighbour(context.Background(), ipB)
	if err != nil || !bytes.Equal(mac, p.VethB.HardwareAddr) {
		t.Fatalf("neighbour %v (%v), want %v", mac, err, p.VethB.HardwareAddr)
	}
	// A neighbour nobody answers for fails Connect within its context.
	q := newEndpoint(t, da, RC, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = q.qp.Connect(ctx, &ConnectAttr{RemoteQPN: 17, RemoteAddr: netip.MustParseAddr("10.99.0.99")})
	if !errors.Is(err, ErrNoNeighbour) {
		t.Fatalf("connect to a silent address: %v", err)
	}
	c := da.Counters()
	if c.ICRCErr != 0 || c.BadFrame != 0 || c.SentPkts == 0 {
		t.Fatalf("counters: %v", c.Map())
	}
	// The KernelUDP/XDP ICRC matched on the wire: B accepted everything.
	if cb := db.Counters(); cb.ICRCErr != 0 || cb.RDMARecvs == 0 {
		t.Fatalf("B counters: %v", cb.Map())
	}
}

// Jumbo frames over AF_XDP: path MTU 4096 needs ~4.2 KB frames, which cross
// the 4 KiB UMEM chunks only with multi-buffer (netdev.Open turns it on, as openIn does).
func TestNetnsXDPJumbo(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 9000)
	da := openIn(t, p.VethA, xdpLink, Options{})
	db := openIn(t, p.VethB, xdpLink, Options{})
	if m := da.QueryPort().ActiveMTU; m != ib.MTU4096 {
		t.Fatalf("active MTU %v on a 9000-byte link", m)
	}
	ipA, ipB := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	a := newEndpoint(t, da, RC, 4*100000+64)
	b := newEndpoint(t, db, RC, 4*100000+64)
	connect(t, a, b, ipA, ipB, ConnectAttr{PathMTU: ib.MTU4096})
	exerciseRC(t, a, b, 100000)
}

// Mismatched MTUs: A (9000) may use path MTU 4096, B (1500) refuses it with a
// clear error; if A sends 4 KiB packets anyway, B's interface drops them and
// A's work completes with RETRY_EXC_ERR while A's other QPs keep working.
func TestNetnsMTUMismatch(t *testing.T) {
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 9000, PeerMTU: 1500,
		Addr: netip.MustParsePrefix("10.99.0.1/24"), PeerAddr: netip.MustParsePrefix("10.99.0.2/24")})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	da := openIn(t, p.VethA, udpLink, Options{})
	db := openIn(t, p.VethB, udpLink, Options{})
	ipA, ipB := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	a := newEndpoint(t, da, RC, 1<<16)
	b := newEndpoint(t, db, RC, 1<<16)
	ctx := context.Background()
	err := b.qp.Connect(ctx, &ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: ipA, PathMTU: ib.MTU4096})
	if !errors.Is(err, ErrMTU) {
		t.Fatalf("path MTU 4096 on a 1500-byte interface: %v", err)
	}
	t.Log(err)
	// Force it on A only: B's side uses 1024.
	if err := a.qp.Connect(ctx, &ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: ipB, PathMTU: ib.MTU4096,
		LocalPSN: 1, RemotePSN: 2, Timeout: 10, RetryCnt: 2, RNRRetry: 7, MinRNRTimer: 12, NoDefaults: true}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(ctx, &ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: ipA, PathMTU: ib.MTU1024,
		LocalPSN: 2, RemotePSN: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 8192)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 10*time.Second); wc.Status != WCRetryExcErr {
		t.Fatalf("oversized packets to a 1500-byte peer: %v, want %v", wc.Status, WCRetryExcErr)
	}
	a2 := newEndpoint(t, da, RC, 8192)
	b2 := newEndpoint(t, db, RC, 8192)
	connect(t, a2, b2, ipA, ipB, ConnectAttr{PathMTU: ib.MTU1024})
	if err := pingPong(a2, b2, 5000, 3); err != nil {
		t.Fatal(err)
	}
}

// The port follows the interface: MTU changes move the active MTU, and the
// operational state is the port state.
func TestNetnsLinkChanges(t *testing.T) {
	p := readyPair(t, 1500)
	d := openIn(t, p.VethA, udpLink, Options{})
	if m := d.QueryPort().ActiveMTU; m != ib.MTU1024 {
		t.Fatalf("active MTU %v", m)
	}
	if err := p.VethA.SetMTU(9000); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "active MTU 4096 after the MTU change", func() bool {
		pa := d.QueryPort()
		return pa.ActiveMTU == ib.MTU4096 && pa.NetdevMTU == 9000
	})
	l, err := p.VethA.Link()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.A.Netlink().LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "port DOWN", func() bool { return d.QueryPort().State == PortDown })
	if err := p.A.Netlink().LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "port ACTIVE", func() bool { return d.QueryPort().State == PortActive })
}

// RC and UD over IPv6 between namespaces on AF_XDP: GIDs are the IPv6
// addresses and neighbours are found by ND.
func TestNetnsXDPIPv6(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500,
		Addr: netip.MustParsePrefix("fd00:99::1/64"), PeerAddr: netip.MustParsePrefix("fd00:99::2/64")})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	da := openIn(t, p.VethA, xdpLink, Options{})
	db := openIn(t, p.VethB, xdpLink, Options{})
	ipA, ipB := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	if _, err := da.GIDIndex(ipA); err != nil {
		t.Fatalf("%v not in the GID table %v", ipA, da.GIDs())
	}
	a := newEndpoint(t, da, RC, 4*20000+64)
	b := newEndpoint(t, db, RC, 4*20000+64)
	connect(t, a, b, ipA, ipB, ConnectAttr{})
	exerciseRC(t, a, b, 20000)
	ua := newEndpoint(t, da, UD, 4096)
	ub := newEndpoint(t, db, UD, 4096)
	connect(t, ua, ub, ipA, ipB, ConnectAttr{})
	exerciseUD(t, ua, ub, ib.GIDFromAddr(ipB), 1000, 5)
}

// A device on an AF_XDP link of two queues (a two-queue veth) reads each
// queue through its own goroutine (link.MultiQueue), and RC traffic of
// several QPs sharing CQs and an SRQ runs through it both ways. With one
// transmit shard every frame leaves by the first queue; with two, shard k
// sends through queue k (link.TxQueues), so both queues' sockets send.
func TestNetnsXDPQueues(t *testing.T) {
	for _, shards := range []int{1, 2} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) { xdpQueues(t, shards) })
	}
}

func xdpQueues(t *testing.T, shards int) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500, Queues: 2,
		Addr: netip.MustParsePrefix("10.99.0.1/24"), PeerAddr: netip.MustParsePrefix("10.99.0.2/24")})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var devs [2]*Device
	var links [2]*xdplink.Link
	for i, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		err := v.NS.Do(func() error {
			l, err := xdplink.Open(v.Name, xdplink.Options{Queues: []int{0, 1}, NumFrames: 1024})
			if err != nil {
				return err
			}
			links[i] = l
			if devs[i], err = OpenFollowing(l, v.Name, Options{Shards: shards}); err != nil {
				l.Close()
			}
			return err
		})
		if errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable on this kernel or machine: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { devs[i].Close() })
		if n := len(devs[i].rxq); n != 2 {
			t.Fatalf("the device reads %d queues, want 2", n)
		}
	}
	shareCQAndSRQ(t, devs[0], devs[1], p.VethA.Addr.Addr(), p.VethB.Addr.Addr(), shards)
	for i, d := range devs {
		c := d.Counters()
		if c.RcvdPkts == 0 || c.ICRCErr != 0 || c.BadFrame != 0 {
			t.Fatalf("counters %v", c.Map())
		}
		sent := links[i].Stats().QueueSent
		t.Logf("device %d: frames sent per queue %v, out-of-sequence requests %d", i, sent, c.OutOfSeqRequest)
		if sent[0] == 0 || (sent[1] != 0) != (shards == 2) {
			t.Errorf("device %d with %d shards: frames sent per queue %v", i, shards, sent)
		}
	}
}
