package cm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// TestReleaseFreesPrepared: what Prepare registered in the connection's
// PD is handed back through Release when the handshake fails and at Close,
// so neither the PD nor the MRs outlive the connection (before Release,
// a failed handshake's PD refused to close with the MRs in it).
func TestReleaseFreesPrepared(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7184), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Done(); c.Close() }()
		}
	}()
	// A listener on A keeps A's CM, and with it QP1's objects, alive
	// between dials: without one the CM may stop as soon as a dial ends.
	la, err := Listen(ctx, da, netip.AddrPortFrom(devAddrA, 7186), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	var prepared, released atomic.Int32
	var regs sync.Map
	opts := DialOptions{QP: QPOptions{
		Prepare: func(c *Conn) error {
			prepared.Add(1)
			mr, err := c.PD().RegisterMR(make([]byte, 64), roce.AccessLocalWrite)
			if err != nil {
				return err
			}
			c.QP().PostRecv(&roce.RecvWR{SGL: []roce.SGE{mr.SGE(0, 64)}})
			regs.Store(c, mr)
			return nil
		},
		Release: func(c *Conn) {
			released.Add(1)
			if mr, ok := regs.LoadAndDelete(c); ok {
				if err := mr.(*roce.MR).Close(); err != nil {
					t.Errorf("deregister in Release: %v", err)
				}
			}
		},
	}}
	// No listener on 7185: REJ, the attempt fails after Prepare.
	if _, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7185), opts); !errors.Is(err, mad.RejInvalidServiceID) {
		t.Fatalf("dial without listener: %v", err)
	}
	if p, r := prepared.Load(), released.Load(); p != 1 || r != 1 {
		t.Fatalf("after a refused dial: prepared %d, released %d", p, r)
	}
	// The CM's own QP1 objects now exist; the attempt's are gone.
	base := da.Resources()
	if base.PD != 1 || base.MR != 1 || base.QP != 1 {
		t.Fatalf("after a refused dial: %+v, want only QP1's PD, QP and receive slab", base)
	}
	c, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7184), opts)
	if err != nil {
		t.Fatal(err)
	}
	if r := released.Load(); r != 1 {
		t.Fatalf("released %d times while connected", r)
	}
	c.Close()
	if p, r := prepared.Load(), released.Load(); p != 2 || r != 2 {
		t.Fatalf("after Close: prepared %d, released %d", p, r)
	}
	if got := da.Resources(); got.PD != base.PD || got.MR != base.MR || got.QP != base.QP {
		t.Fatalf("resources %+v after the connections, %+v before", got, base)
	}
}

// TestHalfOpenVictim: when the half-open table is full, a handshake whose
// REP went out (its peer resolved, its RTU on the way) is kept, and the
// oldest one still waiting for its peer's address goes; with none waiting
// the oldest goes, never the newcomer.
func TestHalfOpenVictim(t *testing.T) {
	l := &Listener{opts: ListenOptions{MaxHalfOpen: 3}}
	l.ctx = context.Background()
	mk := func(rep bool) *Request {
		r := &Request{l: l, slotFreed: true}
		l.startLocked(r, context.Background())
		r.repQueued = rep
		return r
	}
	real := mk(true)
	spoof1, spoof2 := mk(false), mk(false)
	n := mk(false) // full: one must go
	if real.halfOpen == nil || spoof1.halfOpen != nil || spoof2.halfOpen == nil || n.halfOpen == nil {
		t.Fatalf("victim: want the oldest unanswered (spoof1) gone; real %v spoof1 %v spoof2 %v new %v",
			real.halfOpen != nil, spoof1.halfOpen != nil, spoof2.halfOpen != nil, n.halfOpen != nil)
	}
	if !errors.Is(context.Cause(spoof1.hctx), ErrHalfOpenDropped) {
		t.Fatalf("dropped handshake's cause %v", context.Cause(spoof1.hctx))
	}
	spoof2.repQueued, n.repQueued = true, true
	newest := mk(false)
	if real.halfOpen != nil || newest.halfOpen == nil {
		t.Fatalf("all answered: want the oldest (real) gone and the newcomer kept")
	}
	if d, n := l.stats.HalfOpenDropped, l.halfOpen.Len(); d != 2 || n != 3 {
		t.Fatalf("%d dropped, %d half-open", d, n)
	}
}
