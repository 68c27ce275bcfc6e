package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

// naaiceRun against the example routines: every function code, one and
// several regions, several RPCs.
func TestNAAICECallChecks(t *testing.T) {
	a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	la, lb := memlink.PairWithOptions(memlink.Options{})
	host, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	naa, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer naa.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := naaice.NewServer(naa, naaice.ServerOptions{})
	naaice.ExampleRoutines(srv)
	go srv.ListenAndServe(ctx, netip.AddrPortFrom(netip.IPv4Unspecified(), mrsp.ServerPort))
	time.Sleep(50 * time.Millisecond)
	remote := netip.AddrPortFrom(b, mrsp.ServerPort)
	for _, c := range []struct {
		fn    uint8
		sizes []int
		rpcs  int
	}{{3, []int{1024, 1024, 1024}, 1}, {1, []int{64}, 5}, {2, []int{10, 5000, 300}, 3}} {
		params := make([][]byte, len(c.sizes))
		for i, s := range c.sizes {
			params[i] = bytes.Repeat([]byte{byte(10 + i)}, s)
		}
		var out bytes.Buffer
		if err := naaiceRun(ctx, host, netip.Addr{}, remote, params, c.fn, c.rpcs, 0, &out); err != nil {
			t.Fatalf("fn %d sizes %v: %v", c.fn, c.sizes, err)
		}
		if !strings.HasPrefix(out.String(), "Output of the last MR:") {
			t.Errorf("printed %q", out.String())
		}
	}
	// An unknown function code is not verified.
	if err := naaiceRun(ctx, host, netip.Addr{}, remote, [][]byte{{1}}, 9, 1, 0, &bytes.Buffer{}); err == nil {
		t.Error("function 9 verified")
	}
}

func TestNAAICEUsage(t *testing.T) {
	var o, e bytes.Buffer
	if code := run([]string{"naaice"}, &o, &e); code != 2 {
		t.Errorf("no subcommand: exit %d", code)
	}
	if code := run([]string{"naaice", "call", "10.0.0.1"}, &o, &e); code != 2 {
		t.Errorf("missing arguments: exit %d", code)
	}
}
