//go:build linux

package netdev

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/roce"
)

// readyVeths is a veth pair across two namespaces, 10.99.0.1/24 and
// 10.99.0.2/24, both up.
func readyVeths(t *testing.T) *netnstest.Pair {
	t.Helper()
	p := netnstest.NewPair(t, 1500) // skips unless root with netns support
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// waitFor polls cond for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestNetnsNeighbour(t *testing.T) {
	p := readyVeths(t)
	var w *host
	if err := p.VethA.NS.Do(func() (err error) { w, err = openHost(p.VethA.Name); return err }); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// No entry yet: the kernel is asked and answers.
	mac, _, err := w.Resolve(ctx, netip.MustParseAddr("10.99.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mac[:], p.VethB.HardwareAddr) {
		t.Fatalf("resolved %v, want %v", net.HardwareAddr(mac[:]), p.VethB.HardwareAddr)
	}
	// Nobody answers for .77: the error comes within the context deadline.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, _, err = w.Resolve(ctx2, netip.MustParseAddr("10.99.0.77"))
	if !errors.Is(err, roce.ErrNoNeighbour) {
		t.Fatalf("unresolvable neighbour: %v", err)
	}
	if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("resolution past the deadline: %v is not a net.Error timeout", err)
	}
	// Without the context the kernel's probes would run their two rounds,
	// about 6 s; the bound leaves a busy machine room past the deadline.
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("failure took %v, far beyond the 700 ms deadline", el)
	}
	t.Log(err)
	// An address routed elsewhere (here: nowhere) is refused at once.
	if _, _, err := w.Resolve(ctx, netip.MustParseAddr("192.0.2.1")); !errors.Is(err, roce.ErrNoNeighbour) {
		t.Fatalf("unroutable address: %v", err)
	}
}

// A neighbour whose MAC changes in the kernel's table is reported with its
// new MAC (the device then moves its cached entries: roce's
// TestHostNeighbourChanged), without a new resolution.
func TestNetnsNeighbourChange(t *testing.T) {
	p := readyVeths(t)
	var w *host
	if err := p.VethA.NS.Do(func() (err error) { w, err = openHost(p.VethA.Name); return err }); err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ipB := p.VethB.Addr.Addr()
	var mu sync.Mutex
	seen := map[netip.Addr][6]byte{}
	if err := w.watchNeigh(ctx, func(ip netip.Addr, mac [6]byte) {
		mu.Lock()
		seen[ip] = mac
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.Resolve(ctx, ipB); err != nil {
		t.Fatal(err)
	}
	newMAC := net.HardwareAddr{2, 0x11, 0x22, 0x33, 0x44, 0x55}
	if err := p.A.Netlink().NeighSet(&netlink.Neigh{LinkIndex: p.VethA.Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: net.IP(ipB.AsSlice()), HardwareAddr: newMAC}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new MAC to be reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		m, ok := seen[ipB]
		return ok && bytes.Equal(m[:], newMAC)
	})
}

// When the kernel gives up on a neighbour (ARP unanswered), resolution fails
// with that reason before the caller's deadline.
func TestNetnsNeighbourFailed(t *testing.T) {
	p := readyVeths(t)
	var w *host
	err := p.VethA.NS.Do(func() (err error) {
		// One probe, 100 ms apart: the kernel reaches FAILED quickly.
		for file, v := range map[string]string{"mcast_solicit": "1", "ucast_solicit": "1", "retrans_time_ms": "100"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/neigh/"+p.VethA.Name+"/"+file, []byte(v), 0o644); err != nil {
				return err
			}
		}
		w, err = openHost(p.VethA.Name)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err = w.Resolve(ctx, netip.MustParseAddr("10.99.0.77"))
	if !errors.Is(err, roce.ErrNoNeighbour) || ctx.Err() != nil || !strings.Contains(err.Error(), "failed") {
		t.Fatalf("after %v: %v (ctx %v)", time.Since(start), err, ctx.Err())
	}
	t.Logf("after %v: %v", time.Since(start), err)
}
