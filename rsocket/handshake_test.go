package rsocket

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/cmtest"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestHandshakesDoNotFillBacklog: more handshakes that never complete
// than the listener's backlog hold no backlog slot: the next dialer is
// accepted at once (well before any stuck handshake ends; with slots
// held it waited for them), and the stuck handshakes end within the CM's
// half-open bound, counted.
func TestHandshakesDoNotFillBacklog(t *testing.T) {
	const stuck = 6
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	drop := cmtest.Lossy(la, cmtest.RTUs(stuck))
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

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lc := ListenConfig{Backlog: 2}
	l, err := lc.Listen(ctx, db, "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := netip.AddrPortFrom(addrB, uint16(l.Addr().(*net.TCPAddr).Port)).String()
	timeoutsBefore := stats.handshakeTimeouts.Load()

	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.AcceptRsocket(ctx)
		acc <- res{c, err}
	}()
	for i := range stuck {
		c, err := Dial(ctx, da, "tcp", addr)
		if err != nil {
			t.Fatalf("dial %d, whose RTU will be lost: %v", i, err)
		}
		// Not closed: with no peer, Close would wait out the QP's retry
		// timeout; closing the devices ends it.
		_ = c
	}
	start := time.Now()
	c, err := Dial(ctx, da, "tcp", addr)
	if err != nil {
		t.Fatalf("dial behind %d stuck handshakes (backlog 2): %v", stuck, err)
	}
	defer c.Close()
	r := <-acc
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	defer r.c.Close()
	took := time.Since(start)
	t.Logf("accepted %v after %v behind %d stuck handshakes", r.c.RemoteAddr(), took, stuck)
	if took > 5*time.Second {
		t.Errorf("accepted after %v, as if behind the stuck handshakes", took)
	}
	if got, want := r.c.RemoteAddr().String(), c.LocalAddr().String(); got != want {
		t.Fatalf("accepted %s, want the last dialer %s", got, want)
	}
	deadline := time.Now().Add(30 * time.Second)
	for stats.handshakeTimeouts.Load()-timeoutsBefore < stuck {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stuck handshakes counted as timed out", stats.handshakeTimeouts.Load()-timeoutsBefore, stuck)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
