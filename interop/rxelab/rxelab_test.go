// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	os.Exit(Main(m, Config{Guests: 1}))
}

func TestMissingErrorIsNotSupported(t *testing.T) {
	err := missing("root", "uid %d", 1000)
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("errors.Is(%v, ErrNotSupported) = false", err)
	}
	var me *MissingError
	if !errors.As(err, &me) || me.Capability != "root" {
		t.Fatalf("errors.As: %v", err)
	}
	if got := err.Error(); got != "rxe lab needs root: uid 1000" {
		t.Errorf("Error() = %q", got)
	}
}

func TestMACRule(t *testing.T) {
	for _, c := range []struct{ addr, mac string }{
		{"10.77.0.1", "52:54:00:4d:00:01"},
		{"10.77.0.3", "52:54:00:4d:00:03"},
		{"10.77.1.200", "52:54:00:4d:01:c8"},
	} {
		if got := MACFor(netip.MustParseAddr(c.addr)).String(); got != c.mac {
			t.Errorf("MACFor(%s) = %s, want %s", c.addr, got, c.mac)
		}
	}
}

const sampleReady = `name=g1-a
status=ok
uptime_ready=3.52
kernel=6.1.0-56-amd64
addr=10.77.0.2/24
addr6=fd77::2/64
mac=52:54:00:4d:00:02
netdev_mtu=9000
rdma_link=link rxe0/1 state ACTIVE physical_state LINK_UP netdev eth0
active_mtu=4096 (5)
gid0=fe80:0000:0000:0000:5054:00ff:fe4d:0002 RoCE v2
gid1=0000:0000:0000:0000:0000:ffff:0a4d:0002 RoCE v2
gid2=fd77:0000:0000:0000:0000:0000:0000:0002 RoCE v2
`

func TestParseReady(t *testing.T) {
	g := &Guest{Name: "g1-a", Addr: netip.MustParseAddr("10.77.0.2"), Addr6: netip.MustParseAddr("fd77::2")}
	if err := g.parseReady(sampleReady); err != nil {
		t.Fatal(err)
	}
	if g.ActiveMTU != 4096 || g.MAC.String() != "52:54:00:4d:00:02" || len(g.GIDs) != 3 {
		t.Fatalf("parsed %+v", g)
	}
	for addr, want := range map[string]int{"10.77.0.2": 1, "fd77::2": 2, "fe80::5054:ff:fe4d:2": 0} {
		if idx, ok := g.GIDIndex(netip.MustParseAddr(addr)); !ok || idx != want {
			t.Errorf("GIDIndex(%s) = %d, %v; want %d", addr, idx, ok, want)
		}
	}
	if g.GIDs[0].Type != "RoCE v2" {
		t.Errorf("GID type %q", g.GIDs[0].Type)
	}
	bad := strings.Replace(sampleReady, "status=ok", "status=rxe0 not ACTIVE", 1)
	if err := g.parseReady(bad); err == nil || !strings.Contains(err.Error(), "not ACTIVE") {
		t.Errorf("status not ok: err = %v", err)
	}
	noV6 := strings.Replace(sampleReady, "gid2=", "xgid2=", 1)
	if err := g.parseReady(noV6); err == nil {
		t.Errorf("missing IPv6 GID accepted")
	}
}

func TestExec(t *testing.T) {
	lab := Get(t)
	g := lab.Guests[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	out, errOut, code, err := g.Exec(ctx, "sh", "-c", `echo "out:$1"; echo err >&2; exit 3`, "sh", `a b 'c' "d" $e`)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 || string(out) != "out:a b 'c' \"d\" $e\n" || string(errOut) != "err\n" {
		t.Errorf("exec = %q, %q, %d; want out:..., err, 3", out, errOut, code)
	}

	out, _, code, err = g.Exec(ctx, "cat", "/sys/class/infiniband/rxe0/ports/1/state")
	if err != nil || code != 0 || !bytes.Contains(out, []byte("ACTIVE")) {
		t.Errorf("rxe0 port state = %q, %d, %v", out, code, err)
	}

	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	defer cancelShort()
	t0 := time.Now()
	_, _, _, err = g.Exec(short, "sleep", "60")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exec past its deadline: err = %v", err)
	}
	if d := time.Since(t0); d > 30*time.Second {
		t.Errorf("cancelled exec took %v", d)
	}
	// The killed job must not linger in the guest.
	out, _, _, err = g.Exec(ctx, "sh", "-c", "ps | grep -c '[s]leep 60'")
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("sleep still running after cancel: %q %v", out, err)
	}

	if _, _, _, err := lab.Exec(ctx, "no-such-guest", "true"); err == nil {
		t.Errorf("exec on an unknown guest succeeded")
	}
}

func TestInPeerNS(t *testing.T) {
	lab := Get(t)
	var ifi *net.Interface
	err := lab.InPeerNS(func() error {
		var err error
		ifi, err = net.InterfaceByName(lab.PeerIf)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if ifi.HardwareAddr.String() != lab.PeerMAC.String() || ifi.MTU != lab.MTU {
		t.Errorf("%s in the peer netns: mac %v mtu %d; want %v %d", lab.PeerIf, ifi.HardwareAddr, ifi.MTU, lab.PeerMAC, lab.MTU)
	}
	// This goroutine's thread never left the original netns.
	if _, err := net.InterfaceByName(lab.PeerIf); err == nil {
		t.Errorf("%s visible outside the peer netns", lab.PeerIf)
	}

	// The peer netns reaches the guest: TCP from rxeh0 to a guest listener.
	g := lab.Guests[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := g.Start(ctx, "sh", "-c", "echo hello-from-guest | nc -l -p 7777")
	var conn net.Conn
	deadline := time.Now().Add(60 * time.Second)
	for {
		err = lab.InPeerNS(func() error {
			var err error
			conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(g.Addr, 7777).String(), DialTimeout)
			return err
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("dial the guest from the peer netns: %v", err)
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	conn.Close()
	if string(buf[:n]) != "hello-from-guest\n" {
		t.Errorf("read %q from the guest", buf[:n])
	}
	if _, stderr, code, err := srv.Wait(); err != nil || code != 0 {
		t.Errorf("guest nc: code %d err %v stderr %q", code, err, stderr)
	}
}
