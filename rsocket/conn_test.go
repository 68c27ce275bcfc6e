package rsocket

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
)

// devPair opens two devices joined by an in-memory link.
func devPair(t testing.TB, ab, ba faultnet.Config) (*roce.Device, *roce.Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: ab, BtoA: ba})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// connPair returns a dialled and an accepted connection between two devices.
func connPair(t testing.TB, da, db *roce.Device, d *Dialer, lc *ListenConfig) (*Conn, *Conn, *Listener) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if lc == nil {
		lc = &ListenConfig{}
	}
	if d == nil {
		d = &Dialer{}
	}
	l, err := lc.Listen(ctx, db, "tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.AcceptRsocket(ctx)
		acc <- res{c, err}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	c, err := d.Dial(ctx, da, "tcp", netip.AddrPortFrom(addrB, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { c.Close(); r.c.Close() })
	return c, r.c, l
}

func TestDialAcceptEcho(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	c, s, _ := connPair(t, da, db, nil, nil)
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := s.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if _, err := s.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	n, err = io.ReadFull(c, buf[:5])
	if err != nil || string(buf[:n]) != "world" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Read(buf); err != io.EOF {
		t.Fatalf("after peer close: %d %v, want EOF", n, err)
	}
	if _, err := c.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on closed conn: %v", err)
	}
	s.Close()
	// The CM keeps QP1 (and its PD, CQs, MR, AH) a little longer; the
	// rsocket's QP is gone.
	if r := da.Resources(); r.QP > 1 {
		t.Fatalf("resources after close %+v", r)
	}
}

// copyBoth streams size random bytes each way at once and checks them.
func copyBoth(t *testing.T, a, b net.Conn, size int) {
	t.Helper()
	data := [2][]byte{make([]byte, size), make([]byte, size)}
	rand.Read(data[0])
	rand.Read(data[1])
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	got := [2][]byte{}
	for i, c := range []net.Conn{a, b} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := io.Copy(c, bytes.NewReader(data[i]))
			if err == nil {
				err = c.(interface{ CloseWrite() error }).CloseWrite()
			}
			errs <- err
		}()
		go func() {
			defer wg.Done()
			var buf bytes.Buffer
			_, err := io.Copy(&buf, c)
			got[1-i] = buf.Bytes()
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range data {
		if sha256.Sum256(got[i]) != sha256.Sum256(data[i]) {
			t.Fatalf("direction %d: %d bytes arrived of %d, or corrupted", i, len(got[i]), size)
		}
	}
}

func TestCopyBothWays(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	c, s, _ := connPair(t, da, db, nil, nil)
	copyBoth(t, c, s, 8<<20+12345)
}

func TestCopySmallBuffers(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	o := Options{SQSize: 16, RQSize: 16, SendBuffer: 2048, ReceiveBuffer: 4096, Inline: NoInline}
	c, s, _ := connPair(t, da, db, &Dialer{Options: o}, &ListenConfig{Options: o})
	copyBoth(t, c, s, 3<<20+7)
}

func TestCopyLossy(t *testing.T) {
	da, db := devPair(t, faultnet.Config{Loss: 0.01, Seed: 1}, faultnet.Config{Loss: 0.01, Seed: 2})
	c, s, _ := connPair(t, da, db, nil, nil)
	copyBoth(t, c, s, 256<<10+1)
}
