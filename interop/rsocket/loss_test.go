package rsocket

import (
	"errors"
	"fmt"
	"github.com/goroce/goroce/internal/netnstest"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/rsocket"
)

// TestLoss: with 1 % and 5 % of the RoCEv2 frames dropped on the lab path
// in both directions, rstream streams arrive intact (-T v checks every
// byte on both sides) in both roles; the RC retransmissions of both stacks
// recover every drop.
func TestLoss(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	for _, pct := range []int{1, 5} {
		t.Run(fmt.Sprintf("loss%d%%", pct), func(t *testing.T) {
			l, err := netnstest.NewLoss(lab.NS, []string{"rxt-" + g.Name, lab.PeerIf + "-br"}, float64(pct)/100)
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
				t.Skipf("cannot inject loss: clsact/cls_bpf missing: %v", err)
			}
			if err != nil {
				t.Fatalf("attaching the loss program: %v", err)
			}
			defer l.Close()
			c0, s0 := dev.Counters(), rsocket.ReadStats()
			c := rstreamCase{size: 100000, count: 10, iters: 2, verify: true}
			if pct >= 5 {
				// Each drop the fast path misses costs an RC timeout of
				// about 2 s (rdma_cm's packet life time) on both stacks:
				// less data keeps 5 % within the case's time on TCG.
				c = rstreamCase{size: 20000, count: 10, iters: 2, verify: true}
			}
			t.Run("goroce-client", func(t *testing.T) { rstreamGuestServer(t, g.Addr, c) })
			t.Run("goroce-server", func(t *testing.T) { rstreamGuestClient(t, lab.PeerAddr, c) })
			passed, dropped, err := l.Counts()
			if err != nil {
				t.Fatal(err)
			}
			c1 := dev.Counters()
			t.Logf("loss %d%%: %d of %d RoCEv2 frames dropped; goroce timeouts %d, sequence NAKs received %d, duplicates %d",
				pct, dropped, passed+dropped, c1.Timeouts-c0.Timeouts, c1.RcvdSeqErr-c0.RcvdSeqErr, c1.DuplicateRequest-c0.DuplicateRequest)
			if dropped == 0 {
				t.Error("no frame was dropped: the loss was not applied")
			}
			if c1.RetryExceededErr != c0.RetryExceededErr {
				t.Error("goroce gave up retrying")
			}
			// Every Close saw its DISCONNECT acknowledged or the peer's DREQ.
			if n := rsocket.ReadStats().CloseTimeouts - s0.CloseTimeouts; n != 0 {
				t.Errorf("%d goroce Close gave up waiting for the peer", n)
			}
		})
	}
}
