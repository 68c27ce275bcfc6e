package cmtest_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/cmtest"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestRTUsLost: a dial whose RTU is lost completes on the dialer's side
// while the listener's accept never does; the next dial, past n, is
// accepted.
func TestRTUsLost(t *testing.T) {
	addrA, addrB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	ma, mb := memlink.PairWithOptions(memlink.Options{})
	la := cmtest.Lossy(ma, cmtest.RTUs(1))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: mb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(mb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: ma.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ap := netip.AddrPortFrom(addrB, 7471)
	l, err := cm.Listen(ctx, db, ap, cm.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 2)
	go func() {
		for {
			req, err := l.Request(ctx)
			if err != nil {
				return
			}
			go func() {
				if c, err := req.Accept(ctx, cm.AcceptOptions{}); err == nil {
					accepted <- c
				}
			}()
		}
	}()
	first, err := cm.Dial(ctx, da, ap, cm.DialOptions{})
	if err != nil {
		t.Fatalf("the dial whose RTU is lost: %v", err)
	}
	defer first.Close()
	second, err := cm.Dial(ctx, da, ap, cm.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	c := <-accepted
	defer c.Close()
	if c.RemoteAddr() != second.LocalAddr() {
		t.Fatalf("accepted %v, want the second dialer %v", c.RemoteAddr(), second.LocalAddr())
	}
	if la.Lost() == 0 {
		t.Fatal("no RTU lost")
	}
}
