package qp_test

import (
	"math"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// QPs that share a path share its queue and its stalls. This is what a
// loopback perftest with several QPs sees ("write-bw -q 2"): the responder
// reads a socket that holds every QP's window, at its own rate, in batches
// (one coalesced ACK per QP per batch), and now and then not at all for
// milliseconds (its goroutine descheduled). Nothing is lost.
//
// After a stall the responder reads the backlog in batches, so the first
// ACK after a probe may acknowledge only part of what was sent before the
// probe. On a path that delivers in order that ACK was sent before the
// responder reached the probe: the wait for it was a stall, which the
// probe timeout must learn, or every stall costs each QP a probe and a
// go-back-N restart.
func TestSharedPathStallsDrawNoProbes(t *testing.T) {
	for _, nqp := range []int{1, 2} {
		t.Run(map[int]string{1: "1QP", 2: "2QPs"}[nqp], func(t *testing.T) { testSharedPathStalls(t, nqp) })
	}
}

func testSharedPathStalls(t *testing.T, nqp int) {
	const (
		msg   = 64 << 10
		depth = 16
		every = 20 * time.Millisecond // a stall starts every 20 ms …
		stall = 3 * time.Millisecond  // … and B reads nothing for 3 ms
		run   = 400 * time.Millisecond
		tick  = 10 * time.Microsecond
		rate  = 3  // B reads 3 packets a tick (about 1.2 GB/s at MTU 4096) …
		batch = 64 // … and what a stall held in batches of up to 64 a tick
	)
	n, err := qptest.NewNet(qptest.Options{PortMTU: ib.MTU4096})
	if err != nil {
		t.Fatal(err)
	}
	type pair struct {
		a, b   *qptest.Endpoint
		wr     qp.SendWR
		posted int
	}
	pairs := make([]*pair, nqp)
	for i := range pairs {
		a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 2*depth)
		b, _ := qptest.NewEndpoint(n.B.E, qp.RC, 2*depth)
		if err := n.Connect(a.QP, b.QP, qptest.DefaultRC); err != nil {
			t.Fatal(err)
		}
		src, dst := make([]byte, msg), make([]byte, msg)
		aMR, _ := a.PD.RegMR(src, 0x1000, qp.AccessLocalWrite)
		bMR, _ := b.PD.RegMR(dst, 0x7000_0000, allAccess)
		pairs[i] = &pair{a: a, b: b, wr: qp.SendWR{Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: 0x1000, Length: msg, LKey: aMR.LKey()}}, RemoteAddr: 0x7000_0000, RKey: bMR.RKey()}}
	}
	stalled := func() bool { return n.Clock.T%every >= every-stall }
	// B's receive socket: every packet A sends waits here, in order.
	var queue [][]byte
	n.Drop = func(from string, pkt []byte) bool {
		if from == "A" {
			queue = append(queue, append([]byte(nil), pkt...))
			return true
		}
		return false
	}
	var pkt ib.Packet
	src := qp.Source{SGID: n.A.GID, DGID: n.B.GID}
	var wcs [16]qp.WorkCompletion
	const learn = 3 // stalls the probe timeout may take to learn
	done, stalls, wasStalled, backlog, early := 0, 0, false, math.MaxInt, uint64(0)
	for n.Clock.T < run {
		for _, p := range pairs {
			for ; p.posted-done/nqp < depth; p.posted++ {
				p.wr.ID = uint64(p.posted)
				if err := p.a.QP.PostSend(&p.wr); err != nil {
					t.Fatal(err)
				}
			}
		}
		n.Step() // A sends into the queue; B's ACKs reach A
		if s := stalled(); s != wasStalled {
			if s {
				if stalls++; stalls == learn+1 {
					early = n.A.E.Stats().Probes
				}
				backlog = len(queue) // what was queued when the stall began
			}
			wasStalled = s
		}
		if !stalled() && len(queue) > 0 {
			k := min(len(queue), rate)
			if len(queue) > backlog {
				k = min(len(queue)-backlog, batch) // what the stall held
			}
			for _, h := range queue[:k] {
				if ib.ParseIB(h, &pkt) == nil {
					_ = n.B.E.Receive(&pkt, &src)
				}
			}
			queue = append(queue[:0], queue[k:]...)
			n.Step() // B's coalesced ACKs of the batch
		}
		for _, p := range pairs {
			for k := p.a.SCQ.Poll(wcs[:]); k > 0; k = p.a.SCQ.Poll(wcs[:]) {
				for _, wc := range wcs[:k] {
					if wc.Status != qp.WCSuccess {
						t.Fatalf("WRITE %d: %v", wc.WRID, wc.Status)
					}
				}
				done += k
			}
		}
		n.Clock.T += tick
		n.A.E.Advance(n.Clock.T)
		n.B.E.Advance(n.Clock.T)
	}
	st, bst := n.A.E.Stats(), n.B.E.Stats()
	t.Logf("%d QPs, %d WRITEs of %d B through %d stalls of %v: %d probes (%d found spurious), %d go-back-N, %d timeouts, B saw %d duplicates",
		nqp, done, msg, stalls, stall, st.Probes, st.SpuriousProbes, st.Retransmits, st.Timeouts, bst.DuplicateRequests)
	if stalls < 15 || done < 200 {
		t.Fatalf("the run did not happen as planned")
	}
	// The first stalls may draw each QP probes; once the probe timeout
	// has learnt them, the rest draw none.
	if late := st.Probes - early; late != 0 || st.Timeouts != 0 {
		t.Errorf("%d probes (%d go-back-N, %d timeouts) in %d stalls, %d of them after the first %d: want none after those",
			st.Probes, st.Retransmits, st.Timeouts, stalls, late, learn)
	}
}
