package rsocket

import (
	"io"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// TestAllocs: a Write and the Read of its bytes allocate nothing, inline
// or from the send ring, in steady state.
func TestAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("slow")
	}
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	c, s, _ := connPair(t, da, db, nil, nil)
	for _, size := range []int{32, 64 << 10} {
		w := make([]byte, size)
		r := make([]byte, size)
		round := func() {
			if _, err := c.Write(w); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(s, r); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 50; i++ {
			round()
		}
		if a := testing.AllocsPerRun(200, round); a > 0 {
			t.Errorf("%d-byte Write+Read: %.2f allocations", size, a)
		}
	}
}

// TestKeepalive: with SO_KEEPALIVE an idle connection sends a zero-length
// RDMA WRITE every period (and the peer ACKs it without a completion);
// without it an idle connection is silent.
func TestKeepalive(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	o := Options{KeepAlive: true, KeepAliveIdle: 20 * time.Millisecond}
	c, s, _ := connPair(t, da, db, &Dialer{Options: o}, nil)
	time.Sleep(50 * time.Millisecond)
	before := da.Counters().SentPkts
	idle := db.Counters().SentPkts
	time.Sleep(300 * time.Millisecond)
	if n := da.Counters().SentPkts - before; n < 5 {
		t.Errorf("keepalive side sent %d packets in 300 ms at a 20 ms period", n)
	}
	// The other side only ACKs: nothing of its own. Its count may hold the
	// ACK of a keepalive sent just before the window opened.
	if n := db.Counters().SentPkts - idle; n > da.Counters().SentPkts-before+1 {
		t.Errorf("peer sent %d packets", n)
	}
	copyBoth(t, c, s, 100000)
	if c.Err() != nil || s.Err() != nil {
		t.Fatal(c.Err(), s.Err())
	}
}
