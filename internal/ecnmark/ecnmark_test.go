//go:build linux

package ecnmark_test

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/ecnmark"
	"github.com/goroce/goroce/internal/netnstest"
)

// readyPair is a netns pair with both veth ends up and neighbours known.
func readyPair(t *testing.T) *netnstest.Pair {
	t.Helper()
	return ready(t, netnstest.NewPair(t, 1500)) // skips unless root with netns support
}

// readyPair6 is readyPair over IPv6.
func readyPair6(t *testing.T) *netnstest.Pair {
	t.Helper()
	return ready(t, netnstest.NewPairConfig(t, netnstest.VethConfig{
		Addr: netip.MustParsePrefix("fd99::1/64"), PeerAddr: netip.MustParsePrefix("fd99::2/64")}))
}

func ready(t *testing.T, p *netnstest.Pair) *netnstest.Pair {
	t.Helper()
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Resolve(t)
	return p
}

// attach puts a marker at the egress of v, or skips when the kernel has
// no tc BPF.
func attach(t *testing.T, v *netnstest.Veth, opts ecnmark.Options) *ecnmark.Marker {
	t.Helper()
	var m *ecnmark.Marker
	err := v.NS.Do(func() (err error) {
		m, err = ecnmark.Attach(v.Index, v.NS.Netlink(), opts)
		return err
	})
	if errors.Is(err, ecnmark.ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func udpIn(t *testing.T, ns *netnstest.NS, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func setsockopt(t *testing.T, c *net.UDPConn, level, name, v int) {
	t.Helper()
	rc, _ := c.SyscallConn()
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, name, v) })
	if serr != nil {
		t.Fatal(serr)
	}
}

// TestMarkEveryNth sends ECT(0) and Not-ECT datagrams to port 4791 and to
// another port through the marker: every 4th ECT(0) datagram to 4791
// arrives CE (with a good IPv4 checksum, or the receiver's kernel would
// have dropped it), the Not-ECT ones and those to the other port arrive
// as they left.
func TestMarkEveryNth(t *testing.T) {
	for _, c := range []struct {
		name       string
		clsact, v6 bool
	}{{"IPv4", false, false}, {"IPv6", false, true}, {"IPv4,clsact", true, false}} {
		t.Run(c.name, func(t *testing.T) { testMarkEveryNth(t, c.clsact, c.v6) })
	}
}

func testMarkEveryNth(t *testing.T, clsact, v6 bool) {
	var p *netnstest.Pair
	level, recv, set := unix.IPPROTO_IP, unix.IP_RECVTOS, unix.IP_TOS
	if v6 {
		p = readyPair6(t)
		level, recv, set = unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, unix.IPV6_TCLASS
	} else {
		p = readyPair(t)
	}
	opts := ecnmark.Options{Every: 4}
	if clsact {
		opts = ecnmark.WithClsact(opts)
	}
	m := attach(t, p.VethA, opts)
	if clsact && !m.Clsact() {
		t.Fatal("not attached as a clsact filter")
	}
	a, b := p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	rRoCE, rOther := udpIn(t, p.B, netip.AddrPortFrom(b, 4791)), udpIn(t, p.B, netip.AddrPortFrom(b, 4792))
	for _, r := range []*net.UDPConn{rRoCE, rOther} {
		setsockopt(t, r, level, recv, 1)
	}
	ect, plain := udpIn(t, p.A, netip.AddrPortFrom(a, 0)), udpIn(t, p.A, netip.AddrPortFrom(a, 0))
	setsockopt(t, ect, level, set, 2)
	const n = 40
	for range n {
		for _, s := range []*net.UDPConn{ect, plain} {
			for _, r := range []*net.UDPConn{rRoCE, rOther} {
				if _, err := s.WriteToUDPAddrPort(make([]byte, 100), netip.MustParseAddrPort(r.LocalAddr().String())); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	type key struct {
		roce bool
		tos  uint8
	}
	got := map[key]int{}
	buf, oob := make([]byte, 2000), make([]byte, 128)
	for _, r := range []*net.UDPConn{rRoCE, rOther} {
		for range 2 * n {
			r.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, oobn, _, _, err := r.ReadMsgUDP(buf, oob)
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			tos := uint8(0xff)
			for _, c := range msgs {
				switch {
				case c.Header.Level == unix.IPPROTO_IP && c.Header.Type == unix.IP_TOS && len(c.Data) >= 1:
					tos = c.Data[0]
				case c.Header.Level == unix.IPPROTO_IPV6 && c.Header.Type == unix.IPV6_TCLASS && len(c.Data) >= 4:
					tos = uint8(binary.NativeEndian.Uint32(c.Data))
				}
			}
			got[key{r == rRoCE, tos}]++
		}
	}
	// The marker counts per CPU, and the sender may move between CPUs
	// mid-run: each CPU's count leaves up to Every-1 packets unmarked.
	marked := got[key{true, 3}]
	if lo := n/4 - (runtime.NumCPU() - 1); marked < lo || marked > n/4 {
		t.Errorf("%d datagrams to 4791 marked CE, want %d..%d (all: %v)", marked, lo, n/4, got)
	}
	want := map[key]int{{true, 2}: n - marked, {true, 0}: n, {false, 2}: n, {false, 0}: n}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("datagrams (to 4791: %v) with TOS %#x: %d, want %d (all: %v)", k.roce, k.tos, got[k], v, got)
		}
	}
	s, err := m.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s != (ecnmark.Stats{ECT: n, Marked: uint64(marked), NotECT: n}) {
		t.Errorf("stats %+v, want %d ECT, %d marked (as received), %d Not-ECT", s, n, marked, n)
	}
}
