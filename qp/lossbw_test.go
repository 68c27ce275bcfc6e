package qp_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/faultnet"
	"github.com/goroce/goroce/qp"
	"github.com/goroce/goroce/qp/qptest"
)

// lossRun is one RC WRITE stream through a modelled path: a serializing
// A→B link of a given rate and a one-way delay each way, with random loss,
// all in the fake time of qptest (no CPU in the figure: it measures the
// transport's reaction to loss alone, the same on every machine).
type lossRun struct {
	Loss      float64       // per frame, each direction
	Rate      int64         // A→B bits per second
	Delay     time.Duration // one way
	Msgs      int           // 64 KiB messages
	Depth     int           // WRITEs posted at once
	Seed      uint64
	MTU       ib.MTU
	Timeout   uint8
	Goodput   float64 // message bytes per fake second
	Elapsed   time.Duration
	Sent      uint64 // request frames A put on the wire
	Needed    uint64 // request frames a lossless run needs
	Retries   uint64
	Timeouts  uint64
	Probes    uint64
	SeqNAKs   uint64
	checkData bool
}

const lossMsg = 64 << 10

func (r *lossRun) run(tb testing.TB) {
	tb.Helper()
	if r.MTU == 0 {
		r.MTU = ib.MTU4096
	}
	if r.Timeout == 0 {
		r.Timeout = 14
	}
	n, err := qptest.NewNet(qptest.Options{PortMTU: r.MTU,
		AtoB: faultnet.Config{Seed: r.Seed, Loss: r.Loss, Bandwidth: r.Rate, Delay: r.Delay},
		BtoA: faultnet.Config{Seed: r.Seed + 1000, Loss: r.Loss, Delay: r.Delay}})
	if err != nil {
		tb.Fatal(err)
	}
	a, _ := qptest.NewEndpoint(n.A.E, qp.RC, r.Depth)
	b, _ := qptest.NewEndpoint(n.B.E, qp.RC, r.Depth)
	prm := qptest.DefaultRC
	prm.MTU, prm.Timeout, prm.PSNA, prm.PSNB = r.MTU, r.Timeout, 0xFFFF00, 7
	if err := n.Connect(a.QP, b.QP, prm); err != nil {
		tb.Fatal(err)
	}
	src := make([]byte, r.Depth*lossMsg)
	for i := range src {
		src[i] = byte(i*31 + i>>16)
	}
	dst := make([]byte, len(src))
	aMR, _ := a.PD.RegMR(src, 0x10000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	posted, done := 0, 0
	var wcs [32]qp.WorkCompletion
	post := func() {
		for posted < r.Msgs && posted-done < r.Depth {
			slot := uint64(posted%r.Depth) * lossMsg
			wr := qp.SendWR{ID: uint64(posted), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL:        []qp.SGE{{Addr: 0x10000 + slot, Length: lossMsg, LKey: aMR.LKey()}},
				RemoteAddr: 0x7000_0000 + slot, RKey: bMR.RKey()}
			if err := a.QP.PostSend(&wr); err != nil {
				tb.Fatal(err)
			}
			posted++
		}
	}
	post()
	start := n.Clock.T
	if err := n.Run(func() bool {
		for {
			k := a.SCQ.Poll(wcs[:])
			for _, wc := range wcs[:k] {
				if wc.Status != qp.WCSuccess || wc.WRID != uint64(done) {
					tb.Fatalf("completion %d: %+v", done, wc)
				}
				done++
			}
			if k < len(wcs) {
				break
			}
		}
		post()
		return done == r.Msgs
	}, time.Hour); err != nil {
		tb.Fatalf("%d/%d messages: %v", done, r.Msgs, err)
	}
	r.Elapsed = n.Clock.T - start
	r.Goodput = float64(r.Msgs) * lossMsg / r.Elapsed.Seconds()
	ab, _ := n.Pipes()
	r.Sent = ab.Stats().Pushed
	r.Needed = uint64(r.Msgs) * uint64((lossMsg+r.MTU.Bytes()-1)/r.MTU.Bytes())
	s := n.A.E.Stats()
	r.Retries, r.Probes, r.Timeouts, r.SeqNAKs = s.Retransmits, s.Probes, s.Timeouts, s.SeqNAKsRcvd
	if r.checkData && !bytes.Equal(src, dst) {
		tb.Fatal("data differs")
	}
}

func (r *lossRun) String() string {
	return fmt.Sprintf("loss %.1f%%: %7.2f Gb/s in %v, %.2f wire frames per frame delivered, %d go-back-N, %d probes, %d timeouts, %d seq NAKs",
		r.Loss*100, r.Goodput*8/1e9, r.Elapsed.Round(time.Microsecond), float64(r.Sent)/float64(r.Needed), r.Retries, r.Probes, r.Timeouts, r.SeqNAKs)
}

// TestLossGoodput reports RC WRITE goodput with 1 % random frame loss in
// both directions beside the lossless figure on the same modelled path
// (10 Gb/s, 10 µs one way, 64 KiB messages, 16 in flight, path MTU 4096).
// The figures are in fake time, so they are the same on every machine.
func TestLossGoodput(t *testing.T) {
	msgs := 2000
	if testing.Short() {
		msgs = 300
	}
	base := lossRun{Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: msgs, Depth: 16, checkData: true}
	for _, seed := range []uint64{1, 2, 3} {
		clean, lossy := base, base
		clean.Seed, lossy.Seed, lossy.Loss = seed, seed, 0.01
		clean.run(t)
		lossy.run(t)
		t.Logf("seed %d\n  %v\n  %v\n  ratio %.2f", seed, &clean, &lossy, lossy.Goodput/clean.Goodput)
	}
}
