package roce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/memlink"
)

// fakeHost is a Host whose interface the test changes by calling the events
// it was given.
type fakeHost struct {
	addrs     []netip.Addr
	followErr error

	mu       sync.Mutex
	ev       HostEvents
	neigh    map[netip.Addr][6]byte // next hop → MAC
	gw       map[netip.Addr]netip.Addr
	resolves int
	closes   int
}

func (h *fakeHost) Follow(ctx context.Context, ev HostEvents) error {
	if h.followErr != nil {
		return h.followErr
	}
	h.mu.Lock()
	h.ev = ev
	h.mu.Unlock()
	ev.AddrsChanged(h.addrs)
	return nil
}

func (h *fakeHost) Resolve(ctx context.Context, dst netip.Addr) ([6]byte, netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.resolves++
	nh := dst
	if gw, ok := h.gw[dst]; ok {
		nh = gw
	}
	m, ok := h.neigh[nh]
	if !ok {
		return m, nh, fmt.Errorf("%w: %v: nobody answers", ErrNoNeighbour, nh)
	}
	return m, nh, nil
}

func (h *fakeHost) Close() error {
	h.mu.Lock()
	h.closes++
	h.mu.Unlock()
	return nil
}

func (h *fakeHost) counts() (resolves, closes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resolves, h.closes
}

// A device follows its Host: the GID table its addresses, the port its MTU
// and carrier; it resolves through it, moves cached neighbours when the
// Host reports a new MAC for their next hop, and closes it.
func TestHostFollow(t *testing.T) {
	a1, a2 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.7")
	peer, far, gw := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("192.0.2.9"), netip.MustParseAddr("10.0.0.254")
	macPeer, macGW, macGW2 := [6]byte{2, 0, 0, 0, 0, 2}, [6]byte{2, 0, 0, 0, 0, 0xfe}, [6]byte{2, 0, 0, 0, 1, 0xfe}
	h := &fakeHost{addrs: []netip.Addr{a1},
		neigh: map[netip.Addr][6]byte{peer: macPeer, gw: macGW},
		gw:    map[netip.Addr]netip.Addr{far: gw}}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	defer lb.Close()
	d, err := OpenLink(la, Options{Interface: "eth9", Host: h})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Info().Name != "eth9" {
		t.Fatalf("name %q", d.Info().Name)
	}
	// Follow reported the addresses before OpenLink returned.
	if g, err := d.GID(1); err != nil || g != ib.GIDFromAddr(a1) {
		t.Fatalf("GID 1 = %v (%v); table %v", g, err, d.GIDs())
	}
	h.ev.AddrsChanged([]netip.Addr{a2, a1})
	if i, err := d.GIDIndex(a2); err != nil || i != 2 {
		t.Fatalf("new address at %d (%v); table %v", i, err, d.GIDs())
	}
	if i, _ := d.GIDIndex(a1); i != 1 {
		t.Fatalf("an address that stayed moved to %d", i)
	}

	h.ev.LinkChanged(9000, true)
	if pa := d.QueryPort(); pa.ActiveMTU != ib.MTU4096 || pa.NetdevMTU != 9000 || pa.State != PortActive {
		t.Fatalf("port after MTU 9000: %+v", pa)
	}
	h.ev.LinkChanged(9000, false)
	if pa := d.QueryPort(); pa.State != PortDown {
		t.Fatalf("port after carrier loss: %+v", pa)
	}
	h.ev.LinkChanged(1500, true)
	if pa := d.QueryPort(); pa.ActiveMTU != ib.MTU1024 || pa.State != PortActive {
		t.Fatalf("port after MTU 1500, carrier back: %+v", pa)
	}

	ctx := context.Background()
	for dst, want := range map[netip.Addr][6]byte{peer: macPeer, far: macGW} {
		m, err := d.ResolveNeighbour(ctx, dst)
		if err != nil || !bytes.Equal(m, want[:]) {
			t.Fatalf("%v: %v (%v), want %v", dst, m, err, net.HardwareAddr(want[:]))
		}
	}
	if _, err := d.ResolveNeighbour(ctx, netip.MustParseAddr("10.0.0.99")); !errors.Is(err, ErrNoNeighbour) {
		t.Fatalf("a neighbour the host cannot resolve: %v", err)
	}
	resolves, _ := h.counts()
	// The gateway's MAC changes: the destination behind it follows from the
	// cache, with no new resolution; the other stays.
	h.ev.NeighbourChanged(gw, macGW2)
	if m, err := d.ResolveNeighbour(ctx, far); err != nil || !bytes.Equal(m, macGW2[:]) {
		t.Fatalf("behind the gateway: %v (%v), want %v", m, err, net.HardwareAddr(macGW2[:]))
	}
	if m, _ := d.ResolveNeighbour(ctx, peer); !bytes.Equal(m, macPeer[:]) {
		t.Fatalf("peer moved to %v", m)
	}
	if r, _ := h.counts(); r != resolves {
		t.Fatalf("%d resolutions after the change, want none", r-resolves)
	}

	d.Close()
	if _, closes := h.counts(); closes != 1 {
		t.Fatalf("host closed %d times by Close", closes)
	}
}

// A Host that cannot follow fails OpenLink and stays the caller's, as the
// link does.
func TestHostFollowFails(t *testing.T) {
	boom := errors.New("no such interface")
	h := &fakeHost{followErr: boom}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	defer la.Close()
	defer lb.Close()
	if _, err := OpenLink(la, Options{Host: h}); !errors.Is(err, boom) {
		t.Fatalf("OpenLink: %v, want %v", err, boom)
	}
	if _, closes := h.counts(); closes != 0 {
		t.Fatalf("host closed %d times by a failed OpenLink", closes)
	}
}
