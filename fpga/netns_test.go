//go:build linux

package fpga_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/xdp"
)

// openIn opens a device on v inside its namespace (the one place these
// tests open an interface by name).
func openIn(t testing.TB, v *netnstest.Veth, kind netdev.LinkKind) *roce.Device {
	t.Helper()
	var d *roce.Device
	err := v.NS.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err = netdev.Open(ctx, v.Name, netdev.Options{Link: kind, Device: roce.Options{Logger: quiet}})
		return err
	})
	if err != nil {
		if kind == netdev.LinkXDP && errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP unavailable: %v", err)
		}
		t.Fatalf("open %s (%v): %v", v.Name, kind, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// netnsDevices opens the host in one namespace and the FPGA emulator in
// another, joined by a veth pair at MTU 9000 (PMTU 4096). The emulator's
// address is its interface's, so the kernel answers ARP for it.
func netnsDevices(t testing.TB, kind netdev.LinkKind) (host, fdev *roce.Device, fpgaIP *netnstest.Veth) {
	if kind == netdev.LinkXDP {
		netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	}
	p := netnstest.NewPair(t, 9000) // skips unless root with netns support
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return openIn(t, p.VethA, kind), openIn(t, p.VethB, kind), p.VethB
}

// A veth under load drops frames (AF_XDP rings overrun), so the emulator
// retries forever here instead of the firmware's 3 times.
//
// Frames from the emulator over AF_XDP (and the kernel UDP link) between
// namespaces: in order, byte-exact, sizes 1..4096, both data paths; then
// a consumer holding every slot makes RNR NAKs and loses nothing.
func TestNetns(t *testing.T) {
	for _, kind := range []netdev.LinkKind{netdev.LinkXDP, netdev.LinkUDP} {
		t.Run(kind.String(), func(t *testing.T) {
			for _, write := range []bool{false, true} {
				host, fdev, fv := netnsDevices(t, kind)
				s, e := bringUpAt(t, host, fdev, fv.Addr.Addr(), 4096, 64, emulator.Config{PMTU: ib.MTU4096, Write: write, RetryCnt: 7, Timeout: 12}, 1)
				const n = 3000
				c := newChecker(4096, n)
				if write {
					c.counterMod = uint32(s.Depth())
				}
				go s.Serve(context.Background(), c.check)
				sendAll(t, e, n, 4096)
				c.wait(t, s, 20*time.Second)
				if hc := host.Counters(); hc.ICRCErr != 0 || hc.BadFrame != 0 {
					t.Fatalf("host counters %v", hc.Map())
				}
				s.Stop()
			}

			host, fdev, fv := netnsDevices(t, kind)
			s, e := bringUpAt(t, host, fdev, fv.Addr.Addr(), 4096, 8, emulator.Config{RetryCnt: 7, Timeout: 12}, 1)
			const n = 500
			c := newChecker(4096, n)
			var mu sync.Mutex
			var held []fpga.Frame
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(3 * time.Millisecond):
					}
					mu.Lock()
					h := held
					held = nil
					mu.Unlock()
					for _, f := range h {
						f.Release()
					}
				}
			}()
			go s.Serve(context.Background(), func(f fpga.Frame) {
				c.check(f)
				f.Retain()
				mu.Lock()
				held = append(held, f)
				mu.Unlock()
			})
			sendAll(t, e, n, 4096)
			c.wait(t, s, 20*time.Second)
			if host.Counters().SendRNRErr == 0 {
				t.Fatalf("no RNR NAKs with a slow consumer; host %v", host.Counters().Map())
			}
			t.Logf("%v: RNR NAKs %d, emulator %+v", kind, host.Counters().SendRNRErr, e.Stats())
		})
	}
}
