package s3gw

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

// attackNet is the server's and the client's device an exhaustion
// attack runs on: the server's device holds srv, the client's cli, and
// phantom is an address nobody answers on the client's side.
type attackNet struct {
	sdev, cdev        *roce.Device
	srv, cli, phantom netip.Addr
}

// attackLink opens the devices of an attack over one kind of link.
type attackLink struct {
	name string
	open func(t *testing.T) attackNet
}

// attackLinks are the links the exhaustion attacks run over, as in
// cuobj's attack suite.
var attackLinks = []attackLink{
	{"memlink", func(t *testing.T) attackNet {
		sdev, cdev := devices(t, phantomIP)
		return attackNet{sdev: sdev, cdev: cdev, srv: srvIP, cli: cliIP, phantom: phantomIP}
	}},
	{"udp", udpAttackNet},
}

// forAttackLinks runs fn in a subtest for each of attackLinks.
func forAttackLinks(t *testing.T, fn func(t *testing.T, lk attackLink)) {
	for _, lk := range attackLinks {
		t.Run(lk.name, func(t *testing.T) { fn(t, lk) })
	}
}

// udpAttackNet opens the server's and the client's device on kernel UDP
// sockets on loopback, each sending to the other's kernel-chosen port.
// The addresses are 127.R.S.1 (server), .2 (client) and .9 (phantom), R
// and S random, so that another run on the same host at the same time
// uses others. Both links are bound to the IPv4 wildcard address: the
// server's packets to the phantom then reach the client's socket, whose
// device drops what is not for its address (as memlink's does), and
// both report the same MTU (DC and RC here have no path MTU
// negotiation; a link bound to a loopback address reports lo's).
func udpAttackNet(t *testing.T) attackNet {
	t.Helper()
	b := [4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), 1}
	n := attackNet{srv: netip.AddrFrom4(b)}
	b[3] = 2
	n.cli = netip.AddrFrom4(b)
	b[3] = 9
	n.phantom = netip.AddrFrom4(b)
	// Linux routes all of 127.0.0.0/8 to lo; some systems only 127.0.0.1.
	probe, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(n.cli, 0)))
	if err != nil {
		t.Skipf("no UDP socket on %v: %v", n.cli, err)
	}
	probe.Close()
	ls, err := udplink.ListenOptions(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Skipf("no UDP socket on the IPv4 wildcard address: %v", err)
	}
	lc, err := udplink.ListenOptions(netip.AddrPortFrom(netip.IPv4Unspecified(), 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		ls.Close()
		t.Skipf("no second UDP socket on the IPv4 wildcard address: %v", err)
	}
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	n.sdev, err = roce.OpenLink(ls, roce.Options{Addrs: []netip.Addr{n.srv}, Port: lc.LocalAddr().Port(), Logger: lg})
	if err != nil {
		ls.Close()
		lc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.sdev.Close() })
	n.cdev, err = roce.OpenLink(lc, roce.Options{Addrs: []netip.Addr{n.cli}, Port: ls.LocalAddr().Port(), Logger: lg})
	if err != nil {
		lc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.cdev.Close() })
	// Runs before the devices close: the attack went over the sockets.
	t.Cleanup(func() {
		if s, c := n.sdev.Counters(), n.cdev.Counters(); s.RcvdPkts == 0 || c.RcvdPkts == 0 {
			t.Errorf("the UDP link carried nothing: server %v, client %v", s.Map(), c.Map())
		}
	})
	return n
}

// procStatus returns the test process's resident set (VmRSS) and its
// peak (VmHWM) in bytes, from /proc/self/status; ok is false where
// there is none. The gateway and its cuobj.Server run in the test
// process, so this is the server's memory and the client's together.
func procStatus() (rss, hwm int64, ok bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			continue
		}
		switch string(f[0]) {
		case "VmRSS:":
			rss, ok = kb<<10, true
		case "VmHWM:":
			hwm = kb << 10
		}
	}
	return rss, hwm, ok
}

// resetHWM resets VmHWM to the current RSS (Linux 4.0 and later);
// it reports whether it could.
func resetHWM() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}
