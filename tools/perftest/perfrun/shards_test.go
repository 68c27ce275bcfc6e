package perfrun

import (
	"context"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestShardsLimit: the command line's limit on --shards is the device's.
func TestShardsLimit(t *testing.T) {
	for _, n := range []int{cliflag.MaxShards, cliflag.MaxShards + 1} {
		la, _ := memlink.PairWithOptions(memlink.Options{})
		d, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Shards: n})
		if err == nil {
			d.Close()
		}
		if (err == nil) != (n <= cliflag.MaxShards) {
			t.Errorf("Shards %d: %v", n, err)
		}
	}
}

// Spinning waiters leave a P to the device's goroutines, unless a lone
// QP's waiter does the device's work itself.
func TestParkLanes(t *testing.T) {
	for _, c := range []struct {
		lanes, procs int
		park         bool
	}{{1, 1, false}, {1, 2, false}, {2, 1, true}, {2, 2, true}, {2, 4, false}, {3, 4, false}, {4, 4, true}, {8, 2, true}} {
		if got := parkLanes(c.lanes, c.procs); got != c.park {
			t.Errorf("%d QPs on %d Ps: park %v, want %v", c.lanes, c.procs, got, c.park)
		}
	}
}

type countProgress struct{ n int }

func (c *countProgress) Progress() { c.n++ }

// A waiter that busy-polls drives the peer's device too, and one that
// parks at once does not; Loopback gives each end the other's device.
func TestPollWaitDrivesPeer(t *testing.T) {
	la, _ := memlink.PairWithOptions(memlink.Options{})
	d, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	cq, err := d.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the wait ends once the busy poll is over
	var wc [1]roce.WorkCompletion
	for _, events := range []bool{false, true} {
		var peer countProgress
		if _, err := pollWait(ctx, cq, wc[:], events, &peer); err == nil {
			t.Fatal("an empty CQ gave a completion")
		}
		if (peer.n > 0) == events {
			t.Errorf("events %v: the peer was driven %d times", events, peer.n)
		}
	}
	var a, b countProgress
	c, s := peered(PerfConfig{}, &a, &b)
	if c.peer != &b || s.peer != &a {
		t.Fatal("the client's peer must be the server's device, and the server's the client's")
	}
}
