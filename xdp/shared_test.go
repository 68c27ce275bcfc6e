package xdp_test

import (
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/xdp"
)

// TestSharedUMEM binds two sockets on queues 0 and 1 of B to one UMEM and
// checks that each receives what A sends from the same queue.
func TestSharedUMEM(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500, Queues: 2})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var a, b [2]*side
	// A: a private UMEM per queue.
	progA, mA := redirectAll(t, false)
	progB, mB := redirectAll(t, false)
	umem, err := xdp.NewUMEM(xdp.UMEMConfig{NumFrames: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	err = p.A.Do(func() error {
		for q := range a {
			s, err := xdp.Open(p.VethA.Name, q, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 1024}})
			if err != nil {
				return err
			}
			t.Cleanup(func() { s.Close() })
			a[q] = &side{sock: s, mac: p.VethA.HardwareAddr}
			if err := mA.Put(uint32(q), uint32(s.FD())); err != nil {
				return err
			}
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: progA, Interface: p.VethA.Index, Flags: link.XDPDriverMode})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = p.B.Do(func() error {
		for q := range b {
			s, err := xdp.Open(p.VethB.Name, q, xdp.Config{UMEM: umem, Frames: 2048})
			if err != nil {
				return err
			}
			t.Cleanup(func() { s.Close() })
			b[q] = &side{sock: s, mac: p.VethB.HardwareAddr}
			if err := mB.Put(uint32(q), uint32(s.FD())); err != nil {
				return err
			}
		}
		// A third socket finds the UMEM exhausted.
		if _, err := xdp.Open(p.VethB.Name, 1, xdp.Config{UMEM: umem, Frames: 16}); err == nil {
			t.Error("third socket on an exhausted UMEM was accepted")
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: progB, Interface: p.VethB.Index, Flags: link.XDPDriverMode})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if umem.FreeFrames() != 0 {
		t.Fatalf("UMEM has %d unassigned frames, want 0", umem.FreeFrames())
	}
	for q := range 2 {
		n, nb, _, d := cross(t, a[q], b[q], 2000, 1514, 32)
		t.Logf("queue %d: %d frames, %d bytes into the shared UMEM in %v", q, n, nb, d.Round(time.Millisecond))
	}
	// Queue 1's socket still works after queue 0's (the registering one)
	// is closed; the kernel keeps the UMEM alive.
	if err := b[0].sock.Close(); err != nil {
		t.Fatal(err)
	}
	if n, _, _, _ := cross(t, a[1], b[1], 500, 1514, 32); n != 500 {
		t.Fatalf("after closing the owner: %d frames", n)
	}
}

// TestNoNeedWakeup runs without XDP_USE_NEED_WAKEUP: every TX and fill
// operation kicks the kernel.
func TestNoNeedWakeup(t *testing.T) {
	a, b := newPair(t, 1500, xdp.Config{NoNeedWakeup: true, Mode: xdp.ModeCopy})
	if a.sock.NeedWakeup() {
		t.Fatal("need_wakeup in use")
	}
	n, _, _, d := cross(t, a, b, 5000, 1514, 64)
	t.Logf("%d frames in %v", n, d.Round(time.Millisecond))
}
