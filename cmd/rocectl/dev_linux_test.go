package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/vishvananda/netlink"
)

func TestGUIDAndGIDFormat(t *testing.T) {
	if got := guidString(0x505400fffe4d0002); got != "5054:00ff:fe4d:0002" {
		t.Errorf("guidString = %q", got)
	}
	g := ib.GIDFromAddr(netip.MustParseAddr("10.77.0.2"))
	if got := gidHex(g); got != "0000:0000:0000:0000:0000:ffff:0a4d:0002" {
		t.Errorf("gidHex = %q", got)
	}
	for m, n := range map[ib.MTU]int{ib.MTU256: 256, ib.MTU1024: 1024, ib.MTU4096: 4096, 0: 0, 9: 0} {
		if got := mtuBytes(m); got != n {
			t.Errorf("mtuBytes(%d) = %d, want %d", m, got, n)
		}
	}
}

func TestQueryLink(t *testing.T) {
	l := newQueryLink(net.Interface{Name: "x", MTU: 1500})
	if got := l.HardwareAddr(); len(got) != 6 {
		t.Errorf("HardwareAddr of an interface without one: %v", got)
	}
	var fe *link.FrameError
	if _, err := l.WriteBatch([][]byte{{1}}); !errors.As(err, &fe) {
		t.Errorf("WriteBatch: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := l.ReadBatch(ctx, func([][]byte) { t.Error("frame delivered") }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ReadBatch: %v", err)
	}
	l.Close()
	if _, err := l.ReadBatch(context.Background(), nil); !errors.Is(err, link.ErrClosed) {
		t.Errorf("ReadBatch after Close: %v", err)
	}
}

// TestDev checks dev's output on a veth with IPv4 and IPv6 addresses: the
// GID table (default GID, IPv4-mapped, IPv6), the GUIDs and rxe's
// active_mtu rule, while another goroce device runs on the interface.
func TestDev(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	a := p.VethA
	v6 := netip.MustParsePrefix("fd00:99::1/64")
	if err := a.NS.Do(func() error {
		l, err := a.Link()
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: v6.Addr().AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: 0x80 /* IFA_F_NODAD */}
		return a.NS.Netlink().AddrAdd(l, addr)
	}); err != nil {
		t.Fatal(err)
	}
	// A device of another process would hold the interface's UDP port; dev
	// must not need it.
	var busy *roce.Device
	if err := a.NS.Do(func() (err error) {
		busy, err = netdev.Open(context.Background(), a.Name, netdev.Options{Link: netdev.LinkUDP})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	code, out, errOut := runIn(t, a.NS, "dev", "-v", "-d", a.Name)
	if code != 0 {
		t.Fatalf("dev: exit %d: %s", code, errOut)
	}
	mac := a.HardwareAddr
	eui := []byte{mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]}
	guid := fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", eui[0], eui[1], eui[2], eui[3], eui[4], eui[5], eui[6], eui[7])
	def := fmt.Sprintf("fe80:0000:0000:0000:%s", guid)
	v4 := a.Addr.Addr().As4()
	want := []string{
		"hca_id:\t" + a.Name,
		"transport:\t\t\tInfiniBand (0)",
		"node_guid:\t\t\t" + guid,
		"sys_image_guid:\t\t\t" + guid,
		"vendor_id:\t\t\t0xffffff",
		"phys_port_cnt:\t\t\t1",
		"state:\t\t\tPORT_ACTIVE (4)",
		"max_mtu:\t\t4096 (5)",
		"active_mtu:\t\t1024 (3)",
		"link_layer:\t\tEthernet",
		"GID[  0]:\t\t" + netip.AddrFrom16([16]byte(append([]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0}, eui...))).String() + ", RoCE v2",
		"GID[  1]:\t\t::ffff:" + a.Addr.Addr().String() + ", RoCE v2",
		"GID[  2]:\t\tfd00:99::1, RoCE v2",
		fmt.Sprintf("1\t0\t%s\t\t\tv2\t%s", def, a.Name),
		fmt.Sprintf("1\t1\t0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x\t%s", v4[0], v4[1], v4[2], v4[3], a.Addr.Addr()),
		"1\t2\tfd00:0099:0000:0000:0000:0000:0000:0001\t",
		"n_gids_found=3",
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("dev output lacks %q:\n%s", w, out)
		}
	}

	// The same in JSON.
	code, out, errOut = runIn(t, a.NS, "dev", "-j", "-d", a.Name)
	var js []devJSON
	if err := json.Unmarshal([]byte(out), &js); code != 0 || err != nil || len(js) != 1 || len(js[0].Ports) != 1 {
		t.Fatalf("dev -j: exit %d, %v: %q %s", code, err, out, errOut)
	}
	if pj := js[0].Ports[0]; js[0].NodeGUID != guid || pj.ActiveMTU != 1024 || pj.State != "PORT_ACTIVE" || len(pj.GIDs) != 3 ||
		pj.GIDs[1].GID != "::ffff:"+a.Addr.Addr().String() || pj.GIDs[1].IPv4 != a.Addr.Addr().String() ||
		pj.GIDs[2].GID != "fd00:99::1" || pj.GIDs[2].Type != "RoCE v2" {
		t.Errorf("dev -j: %+v", js[0])
	}

	// rxe's rule: the largest IB MTU not above netdev MTU - 80.
	for _, c := range []struct {
		mtu  int
		want string
	}{{1500, "1024 (3)"}, {3000, "2048 (4)"}, {9000, "4096 (5)"}, {1103, "512 (2)"}, {4176, "4096 (5)"}} {
		if err := a.SetMTU(c.mtu); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runIn(t, a.NS, "dev", "-d", a.Name)
		if code != 0 || !strings.Contains(out, "active_mtu:\t\t"+c.want+"\n") {
			t.Errorf("MTU %d: exit %d, want active_mtu %s:\n%s%s", c.mtu, code, c.want, out, errOut)
		}
	}

	// Without carrier the port is down, as rxe reports it.
	if err := p.VethB.NS.Do(func() error {
		l, err := p.VethB.Link()
		if err != nil {
			return err
		}
		return p.VethB.NS.Netlink().LinkSetDown(l)
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, out, _ := runIn(t, a.NS, "dev", "-d", a.Name)
		if strings.Contains(out, "state:\t\t\tPORT_DOWN (1)") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer down, port still up:\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Every Ethernet interface by default; an unknown one fails.
	code, out, _ = runIn(t, a.NS, "dev")
	if code != 0 || !strings.Contains(out, "hca_id:\t"+a.Name) {
		t.Errorf("dev: exit %d:\n%s", code, out)
	}
	var errBuf bytes.Buffer
	if code := run([]string{"dev", "-d", "nonexistent0"}, &bytes.Buffer{}, &errBuf); code != 1 {
		t.Errorf("dev -d nonexistent0: exit %d", code)
	}
}
