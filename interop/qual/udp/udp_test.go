// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package udp

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

func TestMain(m *testing.M) {
	qual.Shared.UDP = true
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 9000, IPv6: true,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	qual.Shared.Close()
	if v6.dev != nil {
		v6.dev.Close()
	}
	os.Exit(code)
}

// v6 is the second device, on a UDP socket bound to rxeh0's IPv6 address:
// a UDP link serves the one address it is bound to.
var v6 struct {
	once sync.Once
	dev  *roce.Device
	err  error
}

// setup returns the lab's Env and the device's UDP link, bound to rxeh0's
// IPv4 address; it fails the test if the device runs on any other link, or
// lists a GID its link cannot send from.
func setup(t *testing.T) (*qual.Env, *udplink.Link) {
	t.Helper()
	e := qual.Setup(t)
	if _, err := e.Dev.GIDIndex(e.Lab.PeerAddr6); err == nil {
		t.Errorf("the device on the IPv4 UDP link lists %v in its GID table: %v", e.Lab.PeerAddr6, e.Dev.GIDs())
	}
	return e, udpLink(t, e.Dev)
}

// setup6 returns e for the device on rxeh0's IPv6 address, both sides on
// their IPv6 GIDs, and that device's link.
func setup6(t *testing.T, e *qual.Env) (*qual.Env, *udplink.Link) {
	t.Helper()
	v6.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		v6.err = e.Lab.InPeerNS(func() error {
			var err error
			v6.dev, err = netdev.Open(ctx, e.Lab.PeerIf, netdev.Options{Link: netdev.LinkUDP, UDPAddr: e.Lab.PeerAddr6})
			return err
		})
	})
	if v6.err != nil {
		t.Fatalf("opening goroce on %v over UDP: %v", e.Lab.PeerAddr6, v6.err)
	}
	e6 := *e
	e6.Dev = v6.dev
	return e6.IPv6(t), udpLink(t, v6.dev)
}

func udpLink(t *testing.T, d *roce.Device) *udplink.Link {
	t.Helper()
	l, ok := d.Link().(*udplink.Link)
	if !ok {
		t.Fatalf("the device runs on %T, not the kernel UDP link", d.Link())
	}
	return l
}

// TestPingpong runs ibv_rc_pingpong and ibv_ud_pingpong against rocectl's
// pingpong, both roles: RC at path MTU 1024 and 4096 with messages of one
// to five packets, UD up to 4096 bytes, and a few cases again on IPv6 GIDs.
func TestPingpong(t *testing.T) {
	e, _ := setup(t)
	var cases []qual.PingpongCase
	for _, mtu := range []int{1024, 4096} {
		for _, size := range []int{1, 4096, 20000} {
			cases = append(cases, qual.PingpongCase{Type: roce.RC, Size: size, MTU: mtu, Iters: 50})
		}
	}
	cases = append(cases,
		qual.PingpongCase{Type: roce.RC, Size: 4096, MTU: 4096, Events: true, Iters: 50},
		qual.PingpongCase{Type: roce.UD, Size: 1024, Iters: 50},
		qual.PingpongCase{Type: roce.UD, Size: 4096, Iters: 50})
	cases6 := []qual.PingpongCase{
		{Type: roce.RC, Size: 20000, MTU: 4096, Iters: 50},
		{Type: roce.UD, Size: 4096, Iters: 50},
	}
	qual.PingpongBothRoles(t, e, cases)
	e6, _ := setup6(t, e)
	t.Run("ipv6", func(t *testing.T) { qual.PingpongBothRoles(t, e6, cases6) })
}

// TestPerftest runs perftest's BW and latency tests against rocectl perf,
// both roles, at path MTU 4096 (64 KiB messages: runs of 16 packets), the
// write test at 1024 too, and the bandwidth tests again on IPv6 GIDs.
func TestPerftest(t *testing.T) {
	e, _ := setup(t)
	cases := append(qual.PerfVerbs(4096, 65536, 100, 100), qual.PerfCase{Verb: perftest.Write, MTU: 1024, Size: 16384, Iters: 200})
	var cases6 []qual.PerfCase
	for _, v := range []perftest.Verb{perftest.Send, perftest.Write, perftest.Read} {
		cases6 = append(cases6, qual.PerfCase{Verb: v, MTU: 4096, Size: 65536, Iters: 100})
	}
	qual.PerfBothRoles(t, e, cases)
	e6, _ := setup6(t, e)
	t.Run("ipv6", func(t *testing.T) { qual.PerfBothRoles(t, e6, cases6) })
}

// TestGSORule runs ib_write_bw with goroce as the writer over each family
// and reads the link's counters: on IPv6 the 64 KiB WRITEs leave as runs
// the kernel cuts (and rxe, checking every segment's ICRC, completes the
// test); on IPv4 to a peer on a wire no run is sent. On IPv6 goroce checks
// the ICRC of every frame rxe sent, and none failed.
func TestGSORule(t *testing.T) {
	e, l := setup(t)
	e6, l6 := setup6(t, e)
	c := qual.PerfCase{Verb: perftest.Write, MTU: 4096, Size: 65536, Iters: 200}
	for _, fam := range []struct {
		name string
		env  *qual.Env
		link *udplink.Link
		runs bool
	}{{"ipv4", e, l, false}, {"ipv6", e6, l6, true}} {
		t.Run(fam.name, func(t *testing.T) {
			l := fam.link
			before := l.Stats()
			if !before.GSO {
				t.Skip("the kernel refused UDP GSO (UDP_SEGMENT needs Linux 4.18)")
			}
			qual.PerfGoroceClient(t, fam.env, c)
			after := l.Stats()
			sends, fallbacks := after.GSOSends-before.GSOSends, after.GSOFallbacks-before.GSOFallbacks
			t.Logf("%s: %d runs of %d datagrams, %d refused", fam.name, sends, after.GSODatagrams-before.GSODatagrams, fallbacks)
			if fallbacks != 0 {
				t.Errorf("%d runs refused by the kernel", fallbacks)
			}
			if fam.runs && sends == 0 {
				t.Errorf("no GSO run sent to an IPv6 peer")
			}
			if !fam.runs && sends != 0 {
				t.Errorf("%d GSO runs sent to an IPv4 peer on a wire", sends)
			}
			// Over IPv6 the device checks the ICRC of rxe's frames (sent
			// with UDP checksum 0) over the headers the link synthesizes.
			info, ctr := fam.env.Dev.Info().Link, fam.env.Dev.Counters()
			if info.UncheckedICRC == fam.runs {
				t.Errorf("UncheckedICRC %v on %s", info.UncheckedICRC, fam.name)
			}
			if ctr.ICRCErr != 0 || ctr.RcvdPkts == 0 {
				t.Errorf("counters: %v", ctr.Map())
			}
		})
	}
}
