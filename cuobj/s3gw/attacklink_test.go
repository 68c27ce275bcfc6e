package s3gw

import (
	"bufio"
	"bytes"
	"github.com/goroce/goroce/internal/looppair"
	"net/netip"
	"os"
	"strconv"
	"testing"

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

// udpAttackNet opens the devices on the kernel UDP link on loopback: the
// server's serves 127.R.S.1, the client's .2; .9 is the phantom, which no
// device serves.
func udpAttackNet(t *testing.T) attackNet {
	t.Helper()
	b := looppair.Prefix()
	b[3] = 1
	n := attackNet{srv: netip.AddrFrom4(b)}
	b[3] = 2
	n.cli = netip.AddrFrom4(b)
	b[3] = 9
	n.phantom = netip.AddrFrom4(b)
	n.sdev, n.cdev = looppair.Pair(t, []netip.Addr{n.srv}, n.cli)
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
