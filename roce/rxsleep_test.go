//go:build linux

package roce

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/udplink"
)

// With Options.RxSleep on the kernel UDP link, the receive goroutine of a
// WRITE's target (which nobody waits on) sleeps in the kernel: a stream of
// WRITEs completes, and Close ends the sleep.
func TestRxSleepUDP(t *testing.T) {
	var links [2]*udplink.Link
	for i, addr := range []netip.Addr{loA, loB} {
		l, err := udplink.ListenOptions(netip.AddrPortFrom(addr, 0), udplink.Options{EphemeralPort: true})
		if err != nil {
			t.Skipf("no UDP socket on %v: %v", addr, err)
		}
		t.Cleanup(func() { l.Close() })
		links[i] = l
	}
	var devs [2]*Device
	for i, addr := range []netip.Addr{loA, loB} {
		// Each device sends to the other's port: the links are ephemeral.
		var err error
		devs[i], err = OpenLink(links[i], Options{Addrs: []netip.Addr{addr}, Port: links[1-i].LocalAddr().Port(), RxSleep: true})
		if err != nil {
			t.Fatal(err)
		}
	}
	da, db := devs[0], devs[1]
	if da.rxSleep == nil || db.rxSleep == nil {
		t.Fatal("RxSleep on the kernel UDP link did not take effect")
	}
	x := newEndpoint(t, da, RC, 1<<16)
	y := newEndpoint(t, db, RC, 1<<16)
	connect(t, x, y, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wr := SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, 4096)},
		RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}
	var wc [8]WorkCompletion
	for i := range 200 {
		if err := x.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		for {
			n := x.scq.Poll(wc[:])
			if n > 0 {
				if wc[0].Status != WCSuccess {
					t.Fatalf("write %d: %v", i, wc[0].Status)
				}
				break
			}
			if err := x.scq.Wait(ctx); err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
		}
	}
	closed := make(chan error, 2)
	go func() { closed <- da.Close() }()
	go func() { closed <- db.Close() }()
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Close did not end the receive goroutine's sleep")
		}
	}
}
