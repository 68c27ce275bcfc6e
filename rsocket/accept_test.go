package rsocket

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/cmtest"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestAcceptConcurrent: a peer whose handshake never completes does not
// hold up the next one. The first dialer's RTU is lost for good, and the
// handshake timeout is far beyond the test: Accept must return the second
// connection while the first handshake is still open.
func TestAcceptConcurrent(t *testing.T) {
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	drop := cmtest.Lossy(la, cmtest.RTUs(1))
	da, err := roce.OpenLink(drop, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	// A hang guard only: the serial accept this tests against would wait
	// for the first handshake's REP retries to run out.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lc := ListenConfig{HandshakeTimeout: time.Hour}
	l, err := lc.Listen(ctx, db, "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := netip.AddrPortFrom(addrB, uint16(l.Addr().(*net.TCPAddr).Port)).String()
	failedBefore := stats.acceptFail.Load()

	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.AcceptRsocket(ctx)
		acc <- res{c, err}
	}()
	c1, err := Dial(ctx, da, "tcp", addr)
	if err != nil {
		t.Fatalf("first dial: %v", err)
	}
	defer c1.Close()
	// Dial returns as it sends the RTU; the second request must come
	// after the first's RTU was lost.
	for drop.Lost() == 0 {
		if ctx.Err() != nil {
			t.Fatal("the first connection's RTU was never sent")
		}
		time.Sleep(time.Millisecond)
	}
	c2, err := Dial(ctx, da, "tcp", addr)
	if err != nil {
		t.Fatalf("second dial, behind a handshake that never completes: %v", err)
	}
	defer c2.Close()
	r := <-acc
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	defer r.c.Close()
	if n := stats.acceptFail.Load() - failedBefore; n != 0 {
		t.Fatalf("%d handshakes failed before the second connection was accepted", n)
	}
	if got, want := r.c.RemoteAddr().String(), c2.LocalAddr().String(); got != want {
		t.Fatalf("accepted %s, want the second dialer %s", got, want)
	}
	if _, err := c2.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(r.c, buf); err != nil || string(buf) != "second" {
		t.Fatalf("read %q, %v", buf, err)
	}
}
