package qp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
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

// chosenDrops streams msgs 64 KiB WRITEs from A's PSN first over a 10
// Gb/s path, 10 µs each way, losing A's packets as drop lists, and logs
// the run.
func chosenDrops(t *testing.T, first uint32, msgs int, drop map[ib.PSN]int) *lossRun {
	t.Helper()
	r := &lossRun{Rate: 10e9, Delay: 10 * time.Microsecond, Msgs: msgs, Depth: 16, checkData: true,
		drop: dropPSNs(drop)}
	r.psnA = first
	r.run(t)
	t.Logf("%v", r)
	return r
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
			r := chosenDrops(t, first, 40, c.drop)
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

// A READ whose responses come slower than the probe timeout (a response
// path far slower than the ACKs the round-trip estimate came from) is not
// probed: a resent READ request makes the responder stream the READ again.
// Over a device, whose responder builds that replay packet by packet as
// the link takes them, the replay outlives the READ's completion; an
// application that then deregisters the region (cuObject's client after a
// PUT) turns it into a remote access error that moves the responder's QP
// to the error state, and the next WRITE is never acknowledged although
// nothing was lost. qptest builds every packet at once, so here the replay
// shows as duplicate READ requests; the region is still deregistered and
// the WRITE after it checked.
func TestNoProbeOfSlowRead(t *testing.T) {
	n, err := qptest.NewNet(qptest.Options{
		AtoB: faultnet.Config{Delay: 20 * time.Microsecond},
		// A 1 KiB READ response takes 2 ms to leave, an ACK 100 µs.
		BtoA: faultnet.Config{Delay: 20 * time.Microsecond, Bandwidth: 4e6}})
	if err != nil {
		t.Fatal(err)
	}
	var readReqs int
	var pkt ib.Packet
	n.Tap = func(from string, b []byte) {
		if from == "A" && ib.ParseIB(b, &pkt) == nil && pkt.BTH.Opcode() == ib.RCReadRequest {
			readReqs++
		}
	}
	a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 8)
	b, _ := qptest.NewEndpoint(n.B.E, qp.RC, 8)
	if err := n.Connect(a.QP, b.QP, qptest.DefaultRC); err != nil {
		t.Fatal(err)
	}
	const size = 16 << 10
	local := make([]byte, 2*size)
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i * 7)
	}
	aMR, _ := a.PD.RegMR(local, 0x1000, qp.AccessLocalWrite)
	srcMR, _ := b.PD.RegMR(src, 0x7000_0000, allAccess)
	dstMR, _ := b.PD.RegMR(dst, 0x8000_0000, allAccess)
	var wcs [4]qp.WorkCompletion
	// wait runs the net until A's next completion and returns it.
	wait := func(what string) qp.WorkCompletion {
		t.Helper()
		var wc qp.WorkCompletion
		got := false
		if err := n.Run(func() bool {
			if k := a.SCQ.Poll(wcs[:1]); k > 0 {
				wc, got = wcs[0], true
			}
			return got
		}, 10*time.Second); err != nil {
			t.Fatalf("%s: %v (A %+v, B %+v)", what, err, n.A.E.Stats(), n.B.E.Stats())
		}
		return wc
	}
	post := func(wr qp.SendWR) {
		t.Helper()
		if err := a.QP.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	// A WRITE first: its ACK gives the requester a round-trip estimate of
	// a few hundred microseconds.
	post(qp.SendWR{ID: 1, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x1000 + size, Length: 1024, LKey: aMR.LKey()}}, RemoteAddr: 0x8000_0000, RKey: dstMR.RKey()})
	if wc := wait("WRITE"); wc.Status != qp.WCSuccess {
		t.Fatalf("WRITE: %+v", wc)
	}
	post(qp.SendWR{ID: 2, Opcode: qp.WRRDMARead, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x1000, Length: size, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: srcMR.RKey()})
	if wc := wait("READ"); wc.Status != qp.WCSuccess || !bytes.Equal(local[:size], src) {
		t.Fatalf("READ: %+v", wc)
	}
	// Done with the source, as cuObject's client is once its PUT completed.
	if err := srcMR.Dereg(); err != nil {
		t.Fatal(err)
	}
	post(qp.SendWR{ID: 3, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
		SGL: []qp.SGE{{Addr: 0x1000 + size, Length: size, LKey: aMR.LKey()}}, RemoteAddr: 0x8000_0000, RKey: dstMR.RKey()})
	if wc := wait("WRITE after the READ"); wc.Status != qp.WCSuccess {
		t.Fatalf("WRITE after the READ: %+v; B's QP %v", wc, b.QP.State())
	}
	st := n.A.E.Stats()
	t.Logf("%d READ requests, %d probes, %d timeouts, B saw %d duplicates", readReqs, st.Probes, st.Timeouts, n.B.E.Stats().DuplicateRequests)
	if readReqs != 1 || n.B.E.Stats().DuplicateRequests != 0 {
		t.Errorf("READ requested %d times, %d duplicates at the responder: want it once, nothing lost", readReqs, n.B.E.Stats().DuplicateRequests)
	}
	if b.QP.State() != qp.StateRTS {
		t.Errorf("responder QP in %v", b.QP.State())
	}
}

// A path that stalls now and then — a guest or process descheduled for a
// few milliseconds under load, as an rxe guest on a busy host is — answers
// late, not never. Once a stall has shown how long the path can take, later
// stalls no longer than it draw no probe: the probe waits at least the
// longest round trip the path showed.
//
// A single PSN in flight (a 64-byte ping-pong, as rstream's latency tests
// run) is answered by an ACK of that PSN whether the original or the probe
// got through; the responder's second ACK, for the probe it holds already,
// shows the probe was needless.
func TestStallsDrawNoProbes(t *testing.T) {
	for _, c := range []struct {
		name       string
		msg, depth int
	}{
		{"64KiB-x4", 64 << 10, 4},
		{"64B-x1", 64, 1},
	} {
		t.Run(c.name, func(t *testing.T) { testStallsDrawNoProbes(t, c.msg, c.depth) })
	}
}

func testStallsDrawNoProbes(t *testing.T, msg, depth int) {
	const (
		every = 20 * time.Millisecond // a stall starts every 20 ms …
		stall = 3 * time.Millisecond  // … and holds B's packets for 3 ms
		run   = 300 * time.Millisecond
	)
	n, a, b := slowRC(t, ib.MTU4096, ib.MTU4096, 2*depth)
	src, dst := make([]byte, msg), make([]byte, msg)
	aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	stalled := func() bool { return n.Clock.T%every >= every-stall }
	var held [][]byte
	n.Drop = func(from string, pkt []byte) bool {
		if from == "B" && stalled() {
			held = append(held, append([]byte(nil), pkt...))
			return true
		}
		return false
	}
	var wcs [16]qp.WorkCompletion
	posted, done, stalls := 0, 0, 0
	for n.Clock.T < run {
		for ; posted-done < depth; posted++ {
			wr := qp.SendWR{ID: uint64(posted), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: 0x1000, Length: uint32(msg), LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()}
			if err := a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
		}
		moved := n.Step()
		if len(held) > 0 && !stalled() {
			// The stall ends: what B sent meanwhile arrives at once, in order.
			stalls++
			held, moved = deliverToA(n, held), true
		}
		for k := a.SCQ.Poll(wcs[:]); k > 0; k = a.SCQ.Poll(wcs[:]) {
			for _, wc := range wcs[:k] {
				if wc.Status != qp.WCSuccess {
					t.Fatalf("WRITE %d: %v", wc.WRID, wc.Status)
				}
			}
			done += k
		}
		if !moved {
			n.Clock.T += 10 * time.Microsecond
			n.A.E.Advance(n.Clock.T)
			n.B.E.Advance(n.Clock.T)
		}
	}
	st := n.A.E.Stats()
	t.Logf("%d WRITEs of %d B through %d stalls of %v: %d probes (%d found spurious), %d timeouts, B saw %d duplicates",
		done, msg, stalls, stall, st.Probes, st.SpuriousProbes, st.Timeouts, n.B.E.Stats().DuplicateRequests)
	if stalls < 10 || done < 100 {
		t.Fatalf("the run did not happen as planned")
	}
	// The first stall may draw a probe and its back-off; the rest none.
	if st.Probes > maxProbesPerStall || st.Timeouts != 0 {
		t.Errorf("%d probes, %d timeouts in %d stalls: want at most %d probes (the first stall's), no timeout",
			st.Probes, st.Timeouts, stalls, maxProbesPerStall)
	}
}

// maxProbesPerStall is what one stall may draw: a probe and its back-off
// within the stall (probes double their wait).
const maxProbesPerStall = 4

// A path whose stalls raised the probe timeout near the probe span still
// gets a second probe before the local ACK timeout: a lost packet whose
// first probe is lost too is recovered by the probe at the span's end, not
// by the 67 ms timeout.
func TestLostProbeProbedAgain(t *testing.T) {
	const stall = 3500 * time.Microsecond // raises the floor to its cap (4 ms)
	n, a, b := slowRC(t, ib.MTU4096, 0, 4)
	src, dst := make([]byte, 64), make([]byte, 64)
	aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	var (
		hs    heldStall
		dropA int // A's next packets to lose
	)
	n.Drop = func(from string, p []byte) bool {
		switch {
		case from == "B" && hs.hold(p):
			return true
		case from == "A" && dropA > 0:
			dropA--
			return true
		}
		return false
	}
	write := func(id int) {
		writeAndWait(t, n, a, &hs, qp.SendWR{ID: uint64(id), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: 0x1000, Length: 64, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()})
	}
	id := 0
	for ; id < 50; id++ { // round-trip samples
		write(id)
	}
	for i := 0; i < 3; i++ { // stalls the probes learn to wait out
		hs.start(n.Clock.T + stall)
		write(id)
		id++
		for j := 0; j < 20; j++ {
			write(id)
			id++
		}
	}
	before := n.A.E.Stats()
	dropA = 2 // the WRITE and its first probe
	write(id)
	st := n.A.E.Stats()
	t.Logf("stalls: %d probes (%d spurious); the lost WRITE: %d probes, %d timeouts",
		before.Probes, before.SpuriousProbes, st.Probes-before.Probes, st.Timeouts-before.Timeouts)
	if before.SpuriousProbes == 0 {
		t.Fatal("the stalls raised no probe floor: the run did not happen as planned")
	}
	if st.Timeouts != before.Timeouts {
		t.Errorf("the lost WRITE waited for the local ACK timeout (%d probes)", st.Probes-before.Probes)
	}
}

// A loss among the resent packets of a go-back-N is a new gap: the
// responder NAKs it, and the requester goes back again at once, without
// waiting for a probe or the local ACK timeout. (rxe's requester ignores
// NAKs until a WQE completes and leaves such a gap to its timer.)
func TestGapInResendNAKed(t *testing.T) {
	const first = 0x100
	lost := ib.PSN(first).Add(500)
	for _, c := range []struct {
		name string
		drop map[ib.PSN]int
	}{
		// The original and the resend of lost+1: the resent lost is taken,
		// then lost+2 shows the next gap.
		{"next lost", map[ib.PSN]int{lost: 1, lost.Add(1): 2}},
		{"later lost", map[ib.PSN]int{lost: 1, lost.Add(7): 2}},
		{"twice", map[ib.PSN]int{lost: 1, lost.Add(3): 2, lost.Add(9): 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := chosenDrops(t, first, 80, c.drop)
			if r.Timeouts != 0 || r.Probes != 0 {
				t.Errorf("%d timeouts, %d probes: want each gap repaired by its NAK", r.Timeouts, r.Probes)
			}
			if r.Retries != r.SeqNAKs {
				t.Errorf("%d go-back-N for %d sequence NAKs", r.Retries, r.SeqNAKs)
			}
		})
	}
}

// On a lossy path a lost ACK is not a stall. A 64 KiB WRITE at a time:
// when its ACK is lost the requester has nothing more to send and probes;
// the responder, holding the message, answers with an ACK of it all, so
// the probe proves spurious. Here each probe's answer also comes late,
// 150 µs on a 40 µs round trip, as on a software path whose processes went
// idle during the wait (memlink: the runtime wakes a goroutine about 1 ms
// after a shorter timer), and data packets are lost too. Taken for a
// stall, each lost ACK would raise the probe timeout by its own wait and a
// quarter more, up to half the probe span: every later lost ACK would idle
// the path for 4 ms. Only the responder's second ACK of a PSN (the
// original's and the probe's) shows a stall there.
func TestLostAckIsNoStall(t *testing.T) {
	const (
		msg    = 64 << 10
		every  = 5 * time.Millisecond // an ACK is lost every 5 ms …
		late   = 150 * time.Microsecond
		run    = 200 * time.Millisecond
		maxGap = time.Millisecond // … and each costs about 350 µs
	)
	n, a, b := slowRC(t, ib.MTU4096, ib.MTU4096, 2)
	src, dst := make([]byte, msg), make([]byte, msg)
	aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	var (
		nextLoss = every
		nextData = every / 2 // and a data packet between them
		holdNext bool        // B's next packet, the probe's answer, comes late
		held     []byte
		heldTill time.Duration
		pkt      ib.Packet
	)
	n.Drop = func(from string, b []byte) bool {
		switch {
		case from == "A" && n.Clock.T >= nextData:
			nextData += every
			return true
		case from != "B":
		case holdNext:
			holdNext, held, heldTill = false, append(held[:0], b...), n.Clock.T+late
			return true
		case n.Clock.T >= nextLoss:
			nextLoss += every
			holdNext = true
			return true
		}
		return false
	}
	var wcs [4]qp.WorkCompletion
	posted, done, episodes := 0, 0, 0
	var last, gap time.Duration
	for n.Clock.T < run {
		if posted == done {
			wr := qp.SendWR{ID: uint64(posted), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
				SGL: []qp.SGE{{Addr: 0x1000, Length: msg, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()}
			if err := a.QP.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		moved := n.Step()
		if held != nil && n.Clock.T >= heldTill {
			if ib.ParseIB(held, &pkt) == nil {
				_ = n.A.E.Receive(&pkt, &qp.Source{SGID: n.B.GID, DGID: n.A.GID})
			}
			held, moved = nil, true
			episodes++
		}
		for k := a.SCQ.Poll(wcs[:]); k > 0; k = a.SCQ.Poll(wcs[:]) {
			for _, wc := range wcs[:k] {
				if wc.Status != qp.WCSuccess {
					t.Fatalf("WRITE %d: %v", wc.WRID, wc.Status)
				}
			}
			done += k
			gap, last = max(gap, n.Clock.T-last), n.Clock.T
		}
		if !moved {
			step := 10 * time.Microsecond
			if held != nil {
				step = min(step, heldTill-n.Clock.T)
			}
			n.Clock.T += step
			n.A.E.Advance(n.Clock.T)
			n.B.E.Advance(n.Clock.T)
		}
	}
	st := n.A.E.Stats()
	t.Logf("%d WRITEs, %d lost ACKs: %d probes (%d found spurious), %d timeouts; longest wait for a completion %v",
		done, episodes, st.Probes, st.SpuriousProbes, st.Timeouts, gap)
	if episodes < int(run/every)/2 || done < 1000 {
		t.Fatalf("the run did not happen as planned")
	}
	if gap > maxGap || st.Timeouts != 0 {
		t.Errorf("longest wait %v, %d timeouts: want every lost ACK repaired within %v", gap, st.Timeouts, maxGap)
	}
}

// On a path that both stalls and loses packets, the stalls must not make
// every loss wait the longest of them: stalls raise the probe timeout to
// its cap, then each loss a probe repairs (here a lost packet whose NAK is
// lost too, so nothing but a probe recovers it) halves what the stalls
// added, and the next loss is repaired sooner.
func TestLossLowersStallFloor(t *testing.T) {
	const (
		msg   = 64 << 10
		stall = 3500 * time.Microsecond // raises the floor to its cap (4 ms)
	)
	n, a, b := slowRC(t, ib.MTU4096, ib.MTU4096, 2)
	src, dst := make([]byte, msg), make([]byte, msg)
	aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
	bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
	var (
		hs    heldStall
		dropA = -1 // A's packets to pass before the next loss, -1 for none
		dropB bool
	)
	n.Drop = func(from string, b []byte) bool {
		switch {
		case from == "B" && hs.hold(b):
			return true
		case from == "B" && dropB:
			dropB = false // the NAK
			return true
		case from == "A" && dropA == 0:
			dropA, dropB = -1, true
			return true
		case from == "A" && dropA > 0:
			dropA--
		}
		return false
	}
	id := 0
	// write sends one WRITE and returns how long it took.
	write := func() time.Duration {
		id++
		return writeAndWait(t, n, a, &hs, qp.SendWR{ID: uint64(id - 1), Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: 0x1000, Length: msg, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()})
	}
	for i := 0; i < 50; i++ { // round-trip samples
		write()
	}
	for i := 0; i < 3; i++ { // stalls the probes learn to wait out
		hs.start(n.Clock.T + stall)
		write()
		for j := 0; j < 20; j++ {
			write()
		}
	}
	before := n.A.E.Stats()
	if before.SpuriousProbes == 0 {
		t.Fatal("the stalls raised no probe floor: the run did not happen as planned")
	}
	var took []time.Duration
	for i := 0; i < 6; i++ {
		dropA = 5 // the sixth packet of the next WRITE and its NAK
		took = append(took, write())
		for j := 0; j < 5; j++ {
			write()
		}
	}
	st := n.A.E.Stats()
	t.Logf("stalls: %d probes (%d spurious); the losses: %d probes, %d timeouts, each repaired in %v",
		before.Probes, before.SpuriousProbes, st.Probes-before.Probes, st.Timeouts-before.Timeouts, took)
	if st.Timeouts != before.Timeouts || took[0] < 2*time.Millisecond || took[len(took)-1] > time.Millisecond {
		t.Errorf("the losses were repaired in %v: want the first after the stall floor (over 2 ms), the last within 1 ms, no timeout", took)
	}
}

// slowRC connects an RC pair of depth work requests over a fake path of
// 20 µs each way, as the window tests run it: port MTU portMTU (0 for the
// engine's default) and path MTU pathMTU (0 for qptest.DefaultRC's).
func slowRC(t *testing.T, portMTU, pathMTU ib.MTU, depth int) (*qptest.Net, *qptest.Endpoint, *qptest.Endpoint) {
	t.Helper()
	n, err := qptest.NewNet(qptest.Options{PortMTU: portMTU,
		AtoB: faultnet.Config{Delay: 20 * time.Microsecond}, BtoA: faultnet.Config{Delay: 20 * time.Microsecond}})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := qptest.NewEndpoint(n.A.E, qp.RC, depth)
	b, _ := qptest.NewEndpoint(n.B.E, qp.RC, depth)
	p := qptest.DefaultRC
	if pathMTU != 0 {
		p.MTU = pathMTU
	}
	if err := n.Connect(a.QP, b.QP, p); err != nil {
		t.Fatal(err)
	}
	return n, a, b
}

// heldStall holds what B sends from start until end, then hands it to A
// (deliverToA) as writeAndWait steps past end.
type heldStall struct {
	on   bool
	end  time.Duration
	held [][]byte
}

func (s *heldStall) start(end time.Duration) { s.on, s.end = true, end }

// hold keeps a copy of p if the stall is on, and reports whether it did.
func (s *heldStall) hold(p []byte) bool {
	if s.on {
		s.held = append(s.held, append([]byte(nil), p...))
	}
	return s.on
}

// writeAndWait posts wr on a and steps n until it completes, ending the
// stall s at its end; it returns how long the WRITE took.
func writeAndWait(t *testing.T, n *qptest.Net, a *qptest.Endpoint, s *heldStall, wr qp.SendWR) time.Duration {
	t.Helper()
	var wcs [4]qp.WorkCompletion
	if err := a.QP.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	for start := n.Clock.T; ; {
		moved := n.Step()
		if s.on && n.Clock.T >= s.end {
			s.on = false
			s.held, moved = deliverToA(n, s.held), true
		}
		if k := a.SCQ.Poll(wcs[:]); k > 0 {
			if wcs[0].Status != qp.WCSuccess {
				t.Fatalf("WRITE %d: %v", wr.ID, wcs[0].Status)
			}
			return n.Clock.T - start
		}
		if n.Clock.T-start > time.Second {
			t.Fatalf("WRITE %d: no completion in a second", wr.ID)
		}
		if !moved {
			n.Clock.T += 10 * time.Microsecond
			n.A.E.Advance(n.Clock.T)
			n.B.E.Advance(n.Clock.T)
		}
	}
}

// deliverToA hands A, in order, the packets B sent while they were held
// (a stall), and returns held emptied for reuse.
func deliverToA(n *qptest.Net, held [][]byte) [][]byte {
	var pkt ib.Packet
	for _, h := range held {
		if ib.ParseIB(h, &pkt) == nil {
			_ = n.A.E.Receive(&pkt, &qp.Source{SGID: n.B.GID, DGID: n.A.GID})
		}
	}
	return held[:0]
}
