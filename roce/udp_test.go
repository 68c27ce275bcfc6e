//go:build linux

package roce

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
)

// udpPair opens two devices on kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2 with kernel-chosen ports, each sending to the other's port.
func udpPair(t testing.TB) (*Device, *Device) {
	t.Helper()
	return udpPairWith(t, Options{})
}

// udpPairWith is udpPair with opts for both devices (their Addrs and Port
// set here).
func udpPairWith(t testing.TB, opts Options) (*Device, *Device) {
	t.Helper()
	return udpPairLinks(t, udplink.Options{}, opts)
}

// udpPairLinks is udpPairWith with lopts for both links (their port
// kernel-chosen).
func udpPairLinks(t testing.TB, lopts udplink.Options, opts Options) (*Device, *Device) {
	t.Helper()
	lopts.EphemeralPort = true
	la, err := udplink.ListenOptions(netip.AddrPortFrom(loA, 0), lopts)
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(loB, 0), lopts)
	if err != nil {
		la.Close()
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	oa, ob := opts, opts
	oa.Addrs, oa.Port = []netip.Addr{loA}, lb.LocalAddr().Port()
	ob.Addrs, ob.Port = []netip.Addr{loB}, la.LocalAddr().Port()
	da, err := OpenLink(la, oa)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, ob)
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

// A frame the link refuses (here: from the default GID, fe80::/64, which
// every device lists at index 0 but a UDP socket bound to IPv4 cannot send
// from) is counted and explained, and the QP's work ends in RETRY_EXC_ERR
// rather than hanging. A source GID the link does not serve at all is not
// in the table, and Connect refuses it.
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
	attr := ConnectAttr{RemoteQPN: 17, RemoteAddr: loB, SGID: ib.GIDFromAddr(other),
		PathMTU: ib.MTU1024, Timeout: 8, RetryCnt: 1, NoDefaults: true}
	if err := a.qp.Connect(t.Context(), &attr); !errors.Is(err, ErrNoGID) {
		t.Fatalf("Connect from %v, an address the link does not serve: %v", other, err)
	}
	if attr.SGID, err = d.GID(0); err != nil {
		t.Fatal(err)
	}
	attr.RemoteAddr = netip.MustParseAddr("fe80::2")
	if err := a.qp.Connect(t.Context(), &attr); err != nil {
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
	if e := d.Info().LastSendError; !strings.Contains(e, "address family") {
		t.Fatalf("LastSendError %q", e)
	}
}

// TestUDPLinkGIDsServed opens a device on a UDP socket bound to 127.0.0.1
// with addresses of both families: its GID table lists the default GID and
// the bound address only, since the link would refuse frames from the
// others (a QP given such a source GID would retry into the void).
func TestUDPLinkGIDsServed(t *testing.T) {
	l, err := udplink.ListenOptions(netip.AddrPortFrom(loA, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on 127.0.0.1: %v", err)
	}
	other4, v6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	d, err := OpenLink(l, Options{Addrs: []netip.Addr{v6, other4, loA}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var got []netip.Addr
	for _, e := range d.GIDs() {
		got = append(got, e.Addr)
	}
	if len(got) != 2 || !got[0].IsLinkLocalUnicast() || got[1] != loA {
		t.Fatalf("GID table %v, want the default GID and %v", got, loA)
	}
	for _, a := range []netip.Addr{v6, other4} {
		if _, err := d.GIDIndex(a); !errors.Is(err, ErrNoGID) {
			t.Errorf("GIDIndex(%v) = %v, want ErrNoGID", a, err)
		}
	}
}

// TestUDPLinkICRCv6: over IPv6 the UDP link's synthesized headers carry
// every field the ICRC covers, so the device checks it, as rxe does: a
// datagram from a plain socket with a good ICRC passes, the same one with a
// payload byte changed is dropped and counted. Both are sent as rxe sends
// over IPv6, with UDP checksum 0: the link takes them, and the ICRC is all
// that checks them.
func TestUDPLinkICRCv6(t *testing.T) {
	lo6 := netip.MustParseAddr("::1")
	l, err := udplink.ListenOptions(netip.AddrPortFrom(lo6, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on ::1: %v", err)
	}
	d, err := OpenLink(l, Options{Addrs: []netip.Addr{lo6}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Info().Link.UncheckedICRC {
		t.Fatal("an IPv6 UDP link reports UncheckedICRC")
	}
	c, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no second UDP socket on ::1: %v", err)
	}
	defer c.Close()
	// Send as rxe does, with UDP checksum 0: the link must take them.
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var soErr error
	if err := rc.Control(func(fd uintptr) {
		soErr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_TX, 1)
	}); err != nil || soErr != nil {
		t.Skipf("UDP_NO_CHECK6_TX: %v %v", err, soErr)
	}
	// A SEND ONLY to a QPN nobody holds: the ICRC check comes first.
	pkt := make([]byte, ib.BTHSize+8+ib.ICRCSize)
	ib.BTH(pkt).Encode(&ib.BTHFields{Opcode: ib.RCSendOnly, PKey: 0xFFFF, DestQP: 0x5A5A5, PSN: 7})
	copy(pkt[ib.BTHSize:], "goroce!!")
	h := link.Header{SrcAddr: lo6, DstAddr: lo6, SrcPort: uint16(c.LocalAddr().(*net.UDPAddr).Port), DstPort: l.LocalAddr().Port(), TTL: 64}
	frame := make([]byte, h.HeaderSize()+len(pkt))
	n := h.Put(frame, len(pkt))
	copy(frame[n:], pkt)
	ipOff := link.EthernetSize
	ib.PutICRC(frame[len(frame)-ib.ICRCSize:], ib.ICRC(frame[ipOff:ipOff+link.IPv6Size], frame[ipOff+link.IPv6Size:len(frame)-ib.ICRCSize]))
	to := net.UDPAddrFromAddrPort(l.LocalAddr())
	send := func(p []byte, rcvd uint64) Counters {
		t.Helper()
		if _, err := c.WriteToUDP(p, to); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctr := d.Counters()
			if ctr.RcvdPkts >= rcvd {
				return ctr
			}
			if time.Now().After(deadline) {
				t.Fatalf("the device did not receive datagram %d: %v", rcvd, ctr.Map())
			}
			time.Sleep(time.Millisecond)
		}
	}
	if ctr := send(frame[n:], 1); ctr.ICRCErr != 0 {
		t.Fatalf("a good ICRC counted as bad: %v", ctr.Map())
	}
	frame[n+ib.BTHSize] ^= 0x20
	if ctr := send(frame[n:], 2); ctr.ICRCErr != 1 {
		t.Fatalf("a changed payload byte passed the ICRC check: %v", ctr.Map())
	}
}

// The same over the kernel UDP link with a receive queue per shard
// (udplink.Options.Queues): each device reads its queues from a goroutine
// each, and every queue carries frames.
func TestQueuesShareCQAndSRQ(t *testing.T) {
	const queues = 3
	da, db := udpPairLinks(t, udplink.Options{Queues: queues}, Options{Shards: queues})
	if n := len(da.rxq); n != queues {
		t.Fatalf("the device reads %d receive queues, want %d", n, queues)
	}
	shareCQAndSRQ(t, da, db, loA, loB, queues)
	for _, d := range []*Device{da, db} {
		for i, n := range d.Link().(*udplink.Link).Stats().QueueBuffers {
			if n == 0 {
				t.Errorf("%v: queue %d received nothing", d.Info().Name, i)
			}
		}
	}
}
