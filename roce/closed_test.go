package roce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/link/udplink"
)

// closeable is one object of the table: how to make it, use it and close it.
type closeable struct {
	name string
	// open makes a fresh object on d (a fresh device when it is the object).
	open func(t *testing.T, d *Device) (use func() error, close func() error)
}

func closeables() []closeable {
	ctx := context.Background()
	pdOf := func(t *testing.T, d *Device) *PD {
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		return pd
	}
	cqOf := func(t *testing.T, d *Device) *CQ {
		cq, err := d.CreateCQ(8)
		if err != nil {
			t.Fatal(err)
		}
		return cq
	}
	qpOf := func(t *testing.T, d *Device) *QP {
		cq := cqOf(t, d)
		q, err := pdOf(t, d).CreateQP(&QPInitAttr{Type: RC, SendCQ: cq, RecvCQ: cq})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	recv := func() *RecvWR { return &RecvWR{ID: 1} }
	return []closeable{
		{"Device", func(t *testing.T, d *Device) (func() error, func() error) {
			use := func() error { _, err := d.AllocPD(); return err }
			return use, d.Close
		}},
		{"PD", func(t *testing.T, d *Device) (func() error, func() error) {
			pd := pdOf(t, d)
			use := func() error { _, err := pd.RegisterMR(make([]byte, 64), AccessLocalWrite); return err }
			return use, pd.Close
		}},
		{"MR", func(t *testing.T, d *Device) (func() error, func() error) {
			mr, err := pdOf(t, d).RegisterMR(make([]byte, 64), AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			return nil, mr.Close
		}},
		{"CQ", func(t *testing.T, d *Device) (func() error, func() error) {
			cq := cqOf(t, d)
			use := func() error {
				ctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				return cq.Wait(ctx)
			}
			return use, cq.Close
		}},
		{"SRQ", func(t *testing.T, d *Device) (func() error, func() error) {
			s, err := pdOf(t, d).CreateSRQ(SRQAttr{MaxWR: 8, MaxSGE: 1})
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return s.PostRecv(recv()) }, s.Close
		}},
		{"AH", func(t *testing.T, d *Device) (func() error, func() error) {
			ah, err := pdOf(t, d).CreateAH(ctx, AddressVector{DGID: ib.GIDFromAddr(addrB)})
			if err != nil {
				t.Fatal(err)
			}
			return nil, ah.Close
		}},
		{"QP", func(t *testing.T, d *Device) (func() error, func() error) {
			q := qpOf(t, d)
			use := func() error {
				return q.Modify(ctx, &QPAttr{State: StateInit, Port: 1}, AttrState|AttrPKeyIndex|AttrPort)
			}
			return use, q.Close
		}},
		{"QP.PostRecv", func(t *testing.T, d *Device) (func() error, func() error) {
			q := qpOf(t, d)
			return func() error { return q.PostRecv(recv()) }, q.Close
		}},
		{"RecvSlab", func(t *testing.T, d *Device) (func() error, func() error) {
			q := qpOf(t, d)
			if err := q.Modify(ctx, &QPAttr{State: StateInit, Port: 1}, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
				t.Fatal(err)
			}
			s, err := pdOf(t, d).NewRecvSlab(q, 4, 64)
			if err != nil {
				t.Fatal(err)
			}
			use := func() error { return s.Repost(&WorkCompletion{WRID: s.tag}) }
			return use, s.Close
		}},
		{"EventSub", func(t *testing.T, d *Device) (func() error, func() error) {
			s, err := d.SubscribeEvents(1)
			if err != nil {
				t.Fatal(err)
			}
			return nil, s.Close
		}},
	}
}

// checkClosed asserts the closed-error rule of doc.go: the error matches
// every layer's ErrClosed and net.ErrClosed, and reads as this package's.
func checkClosed(t *testing.T, what string, err error) {
	t.Helper()
	for _, target := range []error{ErrClosed, net.ErrClosed, qp.ErrClosed, link.ErrClosed} {
		if !errors.Is(err, target) {
			t.Errorf("%s: %v does not match %v", what, err, target)
		}
	}
	if err != nil && !strings.HasPrefix(err.Error(), "roce: ") {
		t.Errorf("%s: %q is not the device's error", what, err)
	}
}

// Every closeable object of the device: the first Close succeeds, a second
// Close and any use afterwards return ErrClosed; after the device closes,
// the same holds for objects that were never closed.
func TestClosedObjects(t *testing.T) {
	for _, c := range closeables() {
		t.Run(c.name, func(t *testing.T) {
			d, _ := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
			use, closeFn := c.open(t, d)
			if err := closeFn(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			checkClosed(t, "second Close", closeFn())
			if use != nil {
				checkClosed(t, "use after Close", use())
			}
			if c.name == "Device" {
				return
			}
			d, _ = memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
			use, closeFn = c.open(t, d)
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			if use != nil {
				checkClosed(t, "use after the device closed", use())
			}
			checkClosed(t, "Close after the device closed", closeFn())
		})
	}
}

// The links follow the same rule: a second Close and a read or write after
// Close return link.ErrClosed, which matches net.ErrClosed and the
// device's ErrClosed.
func TestClosedLinks(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	for _, c := range []struct {
		name string
		open func(t *testing.T) link.Link
	}{
		{"memlink", func(t *testing.T) link.Link { a, _ := memlink.Pair(faultnet.Config{}, faultnet.Config{}); return a }},
		{"udplink", func(t *testing.T) link.Link {
			l, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), udplink.Options{EphemeralPort: true})
			if err != nil {
				t.Skip(err)
			}
			return l
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.open(t)
			if err := l.Close(); err != nil {
				t.Fatalf("first Close: %v", err)
			}
			check := func(what string, err error) {
				t.Helper()
				for _, target := range []error{link.ErrClosed, net.ErrClosed, ErrClosed, qp.ErrClosed} {
					if !errors.Is(err, target) {
						t.Errorf("%s: %v does not match %v", what, err, target)
					}
				}
			}
			check("second Close", l.Close())
			_, err := l.WriteBatch([][]byte{make([]byte, 60)})
			check("write after Close", err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = l.ReadBatch(ctx, func([][]byte) {})
			check("read after Close", err)
		})
	}
}
