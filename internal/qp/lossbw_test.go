package qp_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
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
	Dups      uint64 // duplicate requests the responder saw
	SeqNAKs   uint64
	checkData bool
	psnA      uint32 // A's first PSN (default just before the wrap)
	// drop, if set, loses the packets it returns true for (qptest.Net.Drop).
	drop func(from string, b []byte) bool
	// observe, if set, sees the sending QP at every completion check.
	observe func(a *qp.QP)
}

const lossMsg = 64 << 10

// lossStream is a lossRun set up: the net, both QPs and the stream's progress.
type lossStream struct {
	n            *qptest.Net
	src, dst     []byte
	posted, done int
	target       int // check reports done once this many messages completed
	check        func() bool
}

func (r *lossRun) setup(tb testing.TB) *lossStream {
	tb.Helper()
	if r.MTU == 0 {
		r.MTU = ib.MTU4096
	}
	if r.Timeout == 0 {
		r.Timeout = 14
	}
	if r.psnA == 0 {
		r.psnA = 0xFFFF00
	}
	n, err := qptest.NewNet(qptest.Options{PortMTU: r.MTU,
		AtoB: faultnet.Config{Seed: r.Seed, Loss: r.Loss, Bandwidth: r.Rate, Delay: r.Delay},
		BtoA: faultnet.Config{Seed: r.Seed + 1000, Loss: r.Loss, Delay: r.Delay}})
	if err != nil {
		tb.Fatal(err)
	}
	n.Drop = r.drop
	a, _ := qptest.NewEndpoint(n.A.E, qp.RC, r.Depth)
	b, _ := qptest.NewEndpoint(n.B.E, qp.RC, r.Depth)
	prm := qptest.DefaultRC
	prm.MTU, prm.Timeout, prm.PSNA, prm.PSNB = r.MTU, r.Timeout, r.psnA, 7
	if err := n.Connect(a.QP, b.QP, prm); err != nil {
		tb.Fatal(err)
	}
	s := &lossStream{n: n, src: make([]byte, r.Depth*lossMsg), target: r.Msgs}
	for i := range s.src {
		s.src[i] = byte(i*31 + i>>16)
	}
	s.dst = make([]byte, len(s.src))
	aMR, _ := a.PD.RegMR(s.src, 0x10000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(s.dst, 0x7000_0000, allAccess)
	var wcs [32]qp.WorkCompletion
	sgl := []qp.SGE{{Length: lossMsg, LKey: aMR.LKey()}}
	wr := qp.SendWR{Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled, SGL: sgl, RKey: bMR.RKey()}
	post := func() {
		for s.posted < r.Msgs && s.posted-s.done < r.Depth {
			slot := uint64(s.posted%r.Depth) * lossMsg
			wr.ID, sgl[0].Addr, wr.RemoteAddr = uint64(s.posted), 0x10000+slot, 0x7000_0000+slot
			if err := a.QP.PostSend(&wr); err != nil {
				tb.Fatal(err)
			}
			s.posted++
		}
	}
	post()
	s.check = func() bool {
		for {
			k := a.SCQ.Poll(wcs[:])
			for _, wc := range wcs[:k] {
				if wc.Status != qp.WCSuccess || wc.WRID != uint64(s.done) {
					tb.Fatalf("completion %d: %+v", s.done, wc)
				}
				s.done++
			}
			if k < len(wcs) {
				break
			}
		}
		post()
		if r.observe != nil {
			r.observe(a.QP)
		}
		return s.done >= s.target
	}
	return s
}

func (r *lossRun) run(tb testing.TB) {
	tb.Helper()
	s := r.setup(tb)
	n := s.n
	start := n.Clock.T
	if err := n.Run(s.check, time.Hour); err != nil {
		tb.Fatalf("%d/%d messages: %v", s.done, r.Msgs, err)
	}
	r.Elapsed = n.Clock.T - start
	r.Goodput = float64(r.Msgs) * lossMsg / r.Elapsed.Seconds()
	ab, _ := n.Pipes()
	r.Sent = ab.Stats().Pushed
	if r.drop != nil {
		r.Sent = n.A.E.Stats().TxPackets
	}
	r.Needed = uint64(r.Msgs) * uint64((lossMsg+r.MTU.Bytes()-1)/r.MTU.Bytes())
	r.Dups = n.B.E.Stats().DuplicateRequests
	st := n.A.E.Stats()
	r.Retries, r.Probes, r.Timeouts, r.SeqNAKs = st.Retransmits, st.Probes, st.Timeouts, st.SeqNAKsRcvd
	if r.checkData && !bytes.Equal(s.src, s.dst) {
		tb.Fatal("data differs")
	}
}

// stepper sets the stream up for step, which runs it until one more
// message completes.
func (r *lossRun) stepper(tb testing.TB) (step func()) {
	s := r.setup(tb)
	return func() {
		s.target = s.done + 1
		if err := s.n.Run(s.check, time.Hour); err != nil {
			tb.Fatal(err)
		}
	}
}

func (r *lossRun) String() string {
	what := fmt.Sprintf("loss %.1f%%", r.Loss*100)
	if r.drop != nil {
		what = "chosen drops"
	}
	return fmt.Sprintf("%s: %7.2f Gb/s in %v, %.2f wire frames per frame delivered, %d go-back-N, %d probes, %d timeouts, %d seq NAKs, %d duplicates",
		what, r.Goodput*8/1e9, r.Elapsed.Round(time.Microsecond), float64(r.Sent)/float64(r.Needed), r.Retries, r.Probes, r.Timeouts, r.SeqNAKs, r.Dups)
}

// TestLossGoodput reports RC WRITE goodput with 1 % random frame loss in
// both directions beside the lossless figure on the same modelled path
// (10 Gb/s, 10 µs one way, 64 KiB messages, 16 in flight, path MTU 4096).
// The figures are in fake time, so they are the same on every machine.
func TestLossGoodput(t *testing.T) {
	msgs := 2000
	seeds := []uint64{1, 2, 3}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, delay := range []time.Duration{10 * time.Microsecond, 50 * time.Microsecond} {
		base := lossRun{Rate: 10e9, Delay: delay, Msgs: msgs, Depth: 16, checkData: true}
		for _, seed := range seeds {
			clean, lossy := base, base
			clean.Seed, lossy.Seed, lossy.Loss = seed, seed, 0.01
			clean.run(t)
			lossy.run(t)
			ratio := lossy.Goodput / clean.Goodput
			t.Logf("delay %v seed %d\n  %v\n  %v\n  ratio %.2f", delay, seed, &clean, &lossy, ratio)
			// The goal: bounding what is in flight when loss appears keeps
			// at least half the lossless goodput, and resends below half
			// of what is delivered.
			if ratio < 0.5 || lossy.Sent*2 > lossy.Needed*3 || lossy.Timeouts != 0 {
				t.Errorf("1 %% loss: goodput ratio %.2f (want ≥ 0.5), %.2f frames per frame (want ≤ 1.5), %d timeouts",
					ratio, float64(lossy.Sent)/float64(lossy.Needed), lossy.Timeouts)
			}
		}
	}
}
