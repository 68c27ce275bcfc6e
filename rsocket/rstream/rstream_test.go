package rstream

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

func devPair(t *testing.T) (*roce.Device, *roce.Device) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

func TestSizeStr(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{64, "64"}, {1000, "1000"}, {1024, "1k"}, {1536, "1.5k"}, {1 << 20, "1m"}, {3 << 19, "1.5m"}, {2000000, "1.9m"}, {12 << 20, "12m"}} {
		if got := SizeStr(c.n); got != c.want {
			t.Errorf("SizeStr(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	if got := CntStr(100000); got != "100k" {
		t.Errorf("CntStr = %q", got)
	}
}

func TestGoToGo(t *testing.T) {
	da, db := devPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []Config{
		{Size: 100000, Count: 20, Iterations: 2, Custom: true, Verify: true},
		{Size: 1, Count: 100, Custom: true, Verify: true, BufferSize: 4096},
		{Size: 70001, Count: 30, Custom: true, Verify: true, BufferSize: 65536, Keepalive: 1},
	} {
		var sout, cout bytes.Buffer
		srv := c
		srv.Server, srv.Port, srv.Out = true, "7500", &sout
		done := make(chan error, 1)
		go func() { done <- Run(ctx, db, srv) }()
		cl := c
		cl.Dst, cl.Port, cl.Out = "10.0.0.2", "7500", &cout
		var err error
		for i := 0; i < 50; i++ {
			if err = Run(ctx, da, cl); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("client: %v\n%s", err, cout.String())
		}
		if err := <-done; err != nil {
			t.Fatalf("server: %v\n%s", err, sout.String())
		}
		line := regexp.MustCompile(`(?m)^custom\s+\S+\s+\S+\s+\S+\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+$`)
		if !line.MatchString(cout.String()) || !line.MatchString(sout.String()) {
			t.Fatalf("output\n%s\n%s", cout.String(), sout.String())
		}
		t.Logf("\n%s%s", cout.String(), sout.String())
	}
}

// TestGoToGoSeries: without -S/-C/-I both sides run rstream's default
// series, a latency run of each size on one connection and a bandwidth
// run on a second, and print the same result lines.
func TestGoToGoSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("the default series moves about 870 MB")
	}
	da, db := devPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var sout, cout bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- Run(ctx, db, Config{Server: true, Port: "7501", Out: &sout}) }()
	var err error
	for i := 0; i < 50; i++ {
		cout.Reset()
		if err = Run(ctx, da, Config{Dst: "10.0.0.2", Port: "7501", Out: &cout}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("client: %v\n%s", err, cout.String())
	}
	if err := <-done; err != nil {
		t.Fatalf("server: %v\n%s", err, sout.String())
	}
	t.Logf("\n%s%s", cout.String(), sout.String())
	names := func(out string) []string {
		var n []string
		for _, l := range regexp.MustCompile(`(?m)^(\S+)\s+\S+\s+\S+\s+\S+\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+$`).FindAllStringSubmatch(out, -1) {
			n = append(n, l[1])
		}
		return n
	}
	want := "[64_lat 4k_lat 64k_lat 1m_lat 64_bw 4k_bw 64k_bw 1m_bw]"
	if c, s := fmt.Sprint(names(cout.String())), fmt.Sprint(names(sout.String())); c != want || s != want {
		t.Fatalf("result lines: client %s, server %s; want %s", c, s, want)
	}
}
