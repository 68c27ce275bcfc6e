package qp_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/qp"
)

// dropPSNs loses A's request packets with the given PSNs, each as many
// times as listed.
func dropPSNs(times map[ib.PSN]int) func(from string, b []byte) bool {
	return dropFrom("A", times)
}

// dropFrom loses side's packets with the given PSNs, each as many times
// as listed.
func dropFrom(side string, times map[ib.PSN]int) func(from string, b []byte) bool {
	var p ib.Packet
	return func(from string, b []byte) bool {
		if from != side || ib.ParseIB(b, &p) != nil {
			return false
		}
		psn := p.BTH.PSN()
		if times[psn] > 0 {
			times[psn]--
			return true
		}
		return false
	}
}

// One lost packet narrows the window of a requester that had filled the
// path's queue, and lossless traffic afterwards opens it again to the full
// window; the loss is repaired by one go-back-N, without a timeout.
func TestWindowShrinksAndRecovers(t *testing.T) {
	const first = 0xFFFF00 // the stream crosses the PSN wrap
	lost := ib.PSN(first).Add(3000)
	minW, before, after := qp.MaxSendWindow, 0, 0
	lossSeen := false
	r := lossRun{Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: 1500, Depth: 16, checkData: true,
		drop: dropPSNs(map[ib.PSN]int{lost: 1})}
	r.observe = func(a *qp.QP) {
		w := qp.SendWindow(a)
		if r.SeqNAKs == 0 && !lossSeen {
			before = max(before, w)
		}
		if w < qp.MaxSendWindow {
			lossSeen = true
		}
		if lossSeen {
			minW = min(minW, w)
			after = w
		}
	}
	r.run(t)
	t.Logf("%v; window before the loss %d, smallest %d, at the end %d", &r, before, minW, after)
	if before != qp.MaxSendWindow {
		t.Errorf("window before any loss %d, want %d", before, qp.MaxSendWindow)
	}
	if !lossSeen || minW > qp.MaxSendWindow/2 {
		t.Errorf("window after the loss went down to %d, want at most %d", minW, qp.MaxSendWindow/2)
	}
	if after != qp.MaxSendWindow {
		t.Errorf("window at the end %d, want it back at %d", after, qp.MaxSendWindow)
	}
	if r.Retries != 1 || r.Timeouts != 0 || r.Probes != 0 {
		t.Errorf("one loss took %d go-back-N, %d timeouts, %d probes", r.Retries, r.Timeouts, r.Probes)
	}
}

// A loss that provokes no NAK — the resend of a NAK'd packet lost too (the
// responder NAKs a gap once), or the last packet of the stream — is repaired
// by a probe within a few round trips, not by the local ACK timeout.
func TestProbeRepairsSilentLoss(t *testing.T) {
	const first = 0x100
	for _, c := range []struct {
		name string
		drop map[ib.PSN]int
	}{
		{"resend lost", map[ib.PSN]int{ib.PSN(first).Add(500): 2}},
		{"tail lost", map[ib.PSN]int{ib.PSN(first).Add(40*16 - 1): 1}},
		{"tail resend lost", map[ib.PSN]int{ib.PSN(first).Add(40*16 - 1): 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := lossRun{Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: 40, Depth: 16, checkData: true,
				drop: dropPSNs(c.drop)}
			r.psnA = first
			r.run(t)
			t.Logf("%v", &r)
			if r.Timeouts != 0 || r.Probes == 0 {
				t.Errorf("%d timeouts, %d probes: want the probe to repair the loss", r.Timeouts, r.Probes)
			}
			if rto := 4096 * time.Nanosecond << 14; r.Elapsed >= rto {
				t.Errorf("took %v, longer than the local ACK timeout %v", r.Elapsed, rto)
			}
		})
	}
}

// A probe that finds nothing lost — here the last ACK went missing, so the
// responder holds everything and answers the probe with an ACK of it all —
// gives the window back: the path was slow, not congested.
func TestSpuriousProbeKeepsWindow(t *testing.T) {
	const first = 0x100
	const msgs = 40
	var w []int
	r := lossRun{Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: msgs, Depth: 16, checkData: true,
		drop: dropFrom("B", map[ib.PSN]int{ib.PSN(first).Add(msgs*16 - 1): 1})}
	r.psnA = first
	r.observe = func(a *qp.QP) { w = append(w, qp.SendWindow(a)) }
	r.run(t)
	t.Logf("%v; window at the end %d", &r, w[len(w)-1])
	if r.Probes != 1 || r.Timeouts != 0 || r.Dups != 1 {
		t.Errorf("%d probes, %d timeouts, %d duplicates: want one probe answered as a duplicate", r.Probes, r.Timeouts, r.Dups)
	}
	if got := w[len(w)-1]; got != qp.MaxSendWindow {
		t.Errorf("window after a spurious probe %d, want %d", got, qp.MaxSendWindow)
	}
	if r.Sent != r.Needed+1 {
		t.Errorf("%d request packets sent for %d: want only the probe resent", r.Sent, r.Needed)
	}
}

// A lossy stream allocates nothing per message: the window, the round-trip
// samples and the probes are plain fields.
func TestLossyStreamAllocs(t *testing.T) {
	r := lossRun{Loss: 0.02, Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: 1 << 30, Depth: 4}
	step := r.stepper(t)
	for i := 0; i < 50; i++ {
		step()
	}
	if a := testing.AllocsPerRun(200, step); a != 0 {
		t.Errorf("%v allocations per message under loss", a)
	}
}
