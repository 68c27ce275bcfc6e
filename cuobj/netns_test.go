//go:build linux

package cuobj

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/xdp"
)

// TestGetPutNetns runs GET and PUT between two network namespaces over a
// veth pair, on the kernel UDP link and on AF_XDP (root only).
func TestGetPutNetns(t *testing.T) {
	for _, kind := range []netdev.LinkKind{netdev.LinkUDP, netdev.LinkXDP} {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			p := netnstest.NewPair(t, 9000) // skips unless root with netns support
			for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
				if err := v.WaitReady(5 * time.Second); err != nil {
					t.Fatal(err)
				}
			}
			open := func(v *netnstest.Veth) *roce.Device {
				var d *roce.Device
				err := v.NS.Do(func() (err error) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					d, err = netdev.Open(ctx, v.Name, netdev.Options{Link: kind, Device: roce.Options{Logger: quietLog()}})
					return err
				})
				if err != nil {
					if errors.Is(err, xdp.ErrNotSupported) {
						t.Skipf("AF_XDP unavailable: %v", err)
					}
					t.Fatal(err)
				}
				t.Cleanup(func() { d.Close() })
				return d
			}
			sdev, cdev := open(p.VethA), open(p.VethB)
			const max = 64 << 20
			r := newRigAt(t, sdev, cdev, p.VethA.Addr.Addr(), max, nil, nil)
			ctx := ctxT(t, 120*time.Second)
			for i, size := range []int{1, 4095, 1 << 20, max} {
				start := time.Now()
				r.roundTrip(ctx, size, uint64(i))
				if size == max {
					el := time.Since(start)
					t.Logf("%v: %d MiB GET + PUT in %v (%.0f MB/s each way)", kind, size>>20, el.Round(time.Millisecond),
						2*float64(size)/el.Seconds()/1e6)
				}
			}
		})
	}
}
