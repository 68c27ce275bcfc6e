package cm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// checkClosed asserts that err is a closed error of every layer.
func checkClosed(t *testing.T, what string, err error) {
	t.Helper()
	for _, target := range []error{ErrClosed, roce.ErrClosed, roce.ErrClosed, net.ErrClosed} {
		if !errors.Is(err, target) {
			t.Errorf("%s: %v does not match %v", what, err, target)
		}
	}
}

// Manager, Listener and Conn follow roce's rule (roce/doc.go): the first
// Close succeeds, a second Close and a use afterwards return ErrClosed, and
// calls after the device closed fail with an error matching ErrClosed,
// roce.ErrClosed and net.ErrClosed.
func TestClosedObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	port := uint16(7300)
	next := func() uint16 { port++; return port }
	for _, c := range []struct {
		name string
		open func(t *testing.T, da, db *roce.Device) (use, close func() error)
	}{
		{"Manager", func(t *testing.T, da, db *roce.Device) (func() error, func() error) {
			m, err := NewManager(da, ManagerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			use := func() error {
				_, err := m.Listen(ctx, netip.AddrPortFrom(devAddrA, next()), ListenOptions{})
				return err
			}
			return use, m.Close
		}},
		{"Listener", func(t *testing.T, da, db *roce.Device) (func() error, func() error) {
			l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, next()), ListenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			use := func() error { _, err := l.Accept(ctx); return err }
			return use, l.Close
		}},
		{"Conn", func(t *testing.T, da, db *roce.Device) (func() error, func() error) {
			addr := netip.AddrPortFrom(devAddrB, next())
			l, err := Listen(ctx, db, addr, ListenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			acc := make(chan *Conn, 1)
			go func() {
				c, _ := l.Accept(ctx)
				acc <- c
			}()
			c, err := Dial(ctx, da, addr, DialOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if sc := <-acc; sc != nil {
				t.Cleanup(func() { sc.Close() })
			}
			use := func() error { return c.Disconnect(ctx) }
			return use, c.Close
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
			use, closeFn := c.open(t, da, db)
			if err := closeFn(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			checkClosed(t, "second Close", closeFn())
			checkClosed(t, "use after Close", use())
		})
	}

	// After the device closed.
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	addr := netip.AddrPortFrom(devAddrB, next())
	l, err := Listen(ctx, db, addr, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The server keeps its side open, so that the only end the client can
	// see is its own device closing, not the peer's DREQ.
	accepted := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		accepted <- c
	}()
	c, err := Dial(ctx, da, addr, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sc := <-accepted; sc != nil {
		defer sc.Close()
	}
	if err := da.Close(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	checkClosed(t, "Conn.Err after the device closed", c.Err())
	checkClosed(t, "PostRecv after the device closed", c.QP().PostRecv(&roce.RecvWR{}))
	checkClosed(t, "Conn.Close after the device closed", c.Close())
	_, err = Dial(ctx, da, addr, DialOptions{})
	checkClosed(t, "Dial on a closed device", err)
	_, err = Listen(ctx, da, netip.AddrPortFrom(devAddrA, next()), ListenOptions{})
	checkClosed(t, "Listen on a closed device", err)

	// A Manager takes QP1 for itself, so it gets a device of its own.
	dm, _ := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	m, err := NewManager(dm, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dm.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = m.Dial(ctx, addr, DialOptions{})
	checkClosed(t, "Manager.Dial after the device closed", err)
	_, err = m.Listen(ctx, netip.AddrPortFrom(devAddrA, next()), ListenOptions{})
	checkClosed(t, "Manager.Listen after the device closed", err)
	// Closing releases what the Manager holds; the device being gone is
	// no failure of that.
	if err := m.Close(); err != nil {
		t.Errorf("Manager.Close after the device closed: %v", err)
	}
}
