//go:build linux

package netnstest

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const childEnv = "NETNSTEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "interfaces" {
		ifs, err := net.Interfaces()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, i := range ifs {
			fmt.Println(i.Name)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestUDPAcrossVeth(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mtu      int
		a, b     string
		size     int
		dontFrag bool
	}{
		{"ipv4", 1500, "10.99.0.1/24", "10.99.0.2/24", 1472, true},
		{"ipv6", 1500, "fd00:99::1/64", "fd00:99::2/64", 1452, true},
		{"ipv4-jumbo", 9000, "10.99.0.1/24", "10.99.0.2/24", 8972, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPairConfig(t, VethConfig{
				MTU:      tc.mtu,
				Addr:     netip.MustParsePrefix(tc.a),
				PeerAddr: netip.MustParsePrefix(tc.b),
			})
			l, err := p.VethA.Link()
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Attrs().MTU; got != tc.mtu {
				t.Fatalf("MTU %d, want %d", got, tc.mtu)
			}
			udpEcho(t, p, tc.size)
		})
	}
}

// udpEcho sends size bytes from A to B's echo server and checks the reply.
func udpEcho(t *testing.T, p *Pair, size int) {
	t.Helper()
	var srv *net.UDPConn
	if err := p.B.Do(func() (err error) {
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.VethB.Addr.Addr(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	var c *net.UDPConn
	if err := p.A.Do(func() (err error) {
		c, err = net.DialUDP("udp", nil, srv.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := bytes.Repeat([]byte{0xa5}, size)
	reply := make([]byte, 65536)
	for try := 0; ; try++ {
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("send: %v", err)
		}
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := c.Read(reply)
		if err == nil {
			if !bytes.Equal(reply[:n], msg) {
				t.Fatalf("echo mismatch: %d bytes", n)
			}
			return
		}
		if try == 5 {
			t.Fatalf("no echo across the veth: %v", err)
		}
	}
}

func TestPingAcrossVeth(t *testing.T) {
	RequireCaps(t, unix.CAP_NET_RAW)
	for _, tc := range []struct{ a, b string }{
		{"10.99.0.1/24", "10.99.0.2/24"},
		{"fd00:99::1/64", "fd00:99::2/64"},
	} {
		t.Run(tc.b, func(t *testing.T) {
			p := NewPairConfig(t, VethConfig{Addr: netip.MustParsePrefix(tc.a), PeerAddr: netip.MustParsePrefix(tc.b)})
			if err := p.A.Ping(p.VethB.Addr.Addr(), 3*time.Second); err != nil {
				t.Fatal(err)
			}
			// Must be able to fail: nobody has this address.
			bad := netip.MustParseAddr("10.99.0.77")
			if p.VethA.Addr.Addr().Is6() {
				bad = netip.MustParseAddr("fd00:99::77")
			}
			if err := p.A.Ping(bad, 300*time.Millisecond); err == nil {
				t.Fatalf("ping %v answered", bad)
			}
		})
	}
}

func TestDoIsolatesAndRestores(t *testing.T) {
	n := New(t)
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	var inside netns.NsHandle
	if err := n.Do(func() (err error) {
		inside, err = netns.Get()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if !inside.Equal(n.Handle()) {
		t.Fatal("Do did not run in the namespace")
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(orig) {
		t.Fatal("Do left the thread in another namespace")
	}
	// An error from fn is returned as is.
	want := fmt.Errorf("boom")
	if err := n.Do(func() error { return want }); err != want {
		t.Fatalf("Do returned %v, want %v", err, want)
	}
}

func TestStartSubprocess(t *testing.T) {
	p := NewPairConfig(t, VethConfig{Name: "gra", PeerName: "grb"})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"=interfaces")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := p.B.Run(cmd); err != nil {
		t.Fatalf("child: %v: %s", err, out.String())
	}
	names := strings.Fields(out.String())
	if len(names) != 2 || names[0] != "lo" || names[1] != "grb" {
		t.Fatalf("child sees interfaces %q, want [lo grb]", names)
	}
}

func TestNamedCleanup(t *testing.T) {
	SkipUnlessNetns(t)
	var path string
	t.Run("create", func(t *testing.T) {
		n := NewNamed(t, "")
		var err error
		path, err = n.NamedPath()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("registered namespace missing: %v", err)
		}
		h, err := netns.GetFromName(n.Name())
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if !h.Equal(n.Handle()) {
			t.Fatal("/run/netns entry is another namespace")
		}
	})
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after cleanup (err %v)", path, err)
	}
}

func TestVethCleanup(t *testing.T) {
	a := New(t)
	t.Run("create", func(t *testing.T) {
		b := New(t)
		NewVeth(t, a, b, VethConfig{Name: "cl0", PeerName: "cl1", MTU: 3000, PeerMTU: 4000})
		l, err := a.Netlink().LinkByName("cl0")
		if err != nil {
			t.Fatal(err)
		}
		if l.Attrs().MTU != 3000 {
			t.Fatalf("mtu %d", l.Attrs().MTU)
		}
		pl, err := b.Netlink().LinkByName("cl1")
		if err != nil {
			t.Fatal(err)
		}
		if pl.Attrs().MTU != 4000 {
			t.Fatalf("peer mtu %d", pl.Attrs().MTU)
		}
	})
	if _, err := a.Netlink().LinkByName("cl0"); err == nil {
		t.Fatal("veth end left behind after the subtest's cleanup")
	}
}

func TestVLAN(t *testing.T) {
	for _, qinq := range []bool{false, true} {
		t.Run(fmt.Sprint("qinq=", qinq), func(t *testing.T) {
			p := NewPair(t, 1500)
			va := NewVLAN(t, p.VethA, 7, qinq, netip.MustParsePrefix("10.98.0.1/24"))
			vb := NewVLAN(t, p.VethB, 7, qinq, netip.MustParsePrefix("10.98.0.2/24"))
			if va.Name != "veth0.7" || vb.NS != p.B {
				t.Fatalf("vlan %+v / %+v", va, vb)
			}
			udpEcho(t, &Pair{A: p.A, B: p.B, VethA: va, VethB: vb}, 1400)
		})
	}
}
