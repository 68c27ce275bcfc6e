//go:build linux

package bench

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	lossDuration = flag.Duration("lossbench.duration", 300*time.Millisecond,
		"TestLossGoodputMem: how long each case sends")
	lossRounds = flag.Int("lossbench.rounds", 1, "TestLossGoodputMem: rounds of each case (the table shows medians)")
)

// lossCase is one RC WRITE stream between two goroce devices joined by the
// in-memory link, with random frame loss in both directions.
type lossCase struct {
	loss    float64
	goodput float64 // message bytes per second
	ratio   float64 // request frames on the wire per frame a lossless run needs
	c       roce.Counters
}

const (
	lossMsgSize = 65536
	lossDepth   = 16
	lossMTU     = 4096
)

func runLossCase(t *testing.T, loss float64, seed uint64, d time.Duration) lossCase {
	t.Helper()
	addrA, addrB := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 9, 1}, net.HardwareAddr{2, 0, 0, 0, 9, 2}
	la, lb := memlink.PairWithOptions(memlink.Options{MTU: 9000, HardwareAddrA: macA, HardwareAddrB: macB,
		AtoB: faultnet.Config{Seed: seed, Loss: loss}, BtoA: faultnet.Config{Seed: seed + 1, Loss: loss}})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: macB}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: macA}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := rcConnect(t, ctx, da, db, addrA, addrB)
	sent0 := la.TxStats().Pushed
	done, el, err := a.writeStream(ctx, b, func(int) bool { return false }, d)
	if err != nil {
		t.Fatal(err)
	}
	// The CM-free connect above sends no frames on A→B, so every frame
	// pushed is a request packet.
	sent := la.TxStats().Pushed - sent0
	needed := uint64(done) * lossMsgSize / lossMTU
	return lossCase{loss: loss, goodput: float64(done) * lossMsgSize / el.Seconds(),
		ratio: float64(sent) / float64(needed), c: da.Counters()}
}

// rcEnd is one end of an RC connection between two devices: its QP, the
// CQ of both its queues and a registered buffer of lossDepth 64 KiB slots.
type rcEnd struct {
	cq *roce.CQ
	qp *roce.QP
	mr *roce.MR
}

// rcConnect connects an RC QP on da (at addrA) to one on db (at addrB),
// without the CM, at path MTU 4096.
func rcConnect(t *testing.T, ctx context.Context, da, db *roce.Device, addrA, addrB netip.Addr) (a, b rcEnd) {
	t.Helper()
	mk := func(dev *roce.Device) rcEnd {
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := dev.CreateCQ(4 * lossDepth)
		if err != nil {
			t.Fatal(err)
		}
		q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq,
			Cap: roce.QPCap{MaxSendWR: lossDepth, MaxRecvWR: lossDepth}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegisterMR(make([]byte, lossDepth*lossMsgSize), roce.AccessLocalWrite|roce.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		return rcEnd{cq, q, mr}
	}
	a, b = mk(da), mk(db)
	if err := a.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: addrB, LocalPSN: 1, RemotePSN: 2, PathMTU: ib.MTU4096}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: addrA, LocalPSN: 2, RemotePSN: 1, PathMTU: ib.MTU4096}); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// writeStream keeps lossDepth RDMA WRITEs of 64 KiB from a into b's buffer
// in flight until stop (given the number posted) says so or d has passed,
// then waits for the last; it returns how many completed and how long it
// took.
func (a rcEnd) writeStream(ctx context.Context, b rcEnd, stop func(posted int) bool, d time.Duration) (int, time.Duration, error) {
	posted, done := 0, 0
	var wcs [32]roce.WorkCompletion
	// One work request, rewritten for each post: the stream itself
	// allocates nothing, so the CPU it is measured by is the devices'.
	var sge [1]roce.SGE
	wr := roce.SendWR{Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled, SGL: sge[:], RKey: b.mr.RKey()}
	start := time.Now()
	for {
		end := stop(posted) || time.Since(start) >= d
		for !end && posted-done < lossDepth {
			slot := uint64(posted%lossDepth) * lossMsgSize
			sge[0] = a.mr.SGE(int(slot), lossMsgSize)
			wr.ID, wr.RemoteAddr = uint64(posted), b.mr.Addr()+slot
			if err := a.qp.PostSend(&wr); err != nil {
				return done, 0, err
			}
			posted++
			end = stop(posted)
		}
		if end && done == posted {
			return done, time.Since(start), nil
		}
		n := a.cq.Poll(wcs[:])
		for _, wc := range wcs[:n] {
			if wc.Status != roce.WCSuccess {
				return done, 0, fmt.Errorf("completion %+v", wc)
			}
			done++
		}
		if n == 0 {
			if err := a.cq.Wait(ctx); err != nil {
				return done, 0, fmt.Errorf("%d of %d WRITEs done: %w", done, posted, err)
			}
		}
	}
}

// lossMemRound runs round r of TestLossGoodputMem: the lossless case, then
// the one with 1 % loss, each for d, and logs them.
func lossMemRound(t *testing.T, r int, d time.Duration) (clean, lossy lossCase) {
	clean = runLossCase(t, 0, uint64(r)+1, d)
	lossy = runLossCase(t, 0.01, uint64(r)+1, d)
	t.Logf("round %d: lossless %.2f Gb/s (%.2f frames per frame), 1%% loss %.2f Gb/s (%.2f frames per frame; go-back-N %d, timeouts %d, seq NAKs %d, probes %d of which spurious %d), ratio %.2f",
		r, clean.goodput*8/1e9, clean.ratio, lossy.goodput*8/1e9, lossy.ratio,
		lossy.c.CompleterRetryErr, lossy.c.Timeouts, lossy.c.RcvdSeqErr, lossy.c.Probes, lossy.c.SpuriousProbes, lossy.goodput/clean.goodput)
	if clean.goodput <= 0 || lossy.goodput <= 0 {
		t.Fatal("no goodput")
	}
	return clean, lossy
}

// TestLossGoodputMem measures RC WRITE goodput (64 KiB messages, 16 in
// flight, path MTU 4096) between two goroce devices over the in-memory link
// with 1 % random frame loss in both directions, beside the same run without
// loss, and the request frames put on the wire per frame a lossless run
// needs. Real time, so CPU-bound: the figures are for this machine.
//
//	go test ./bench -run TestLossGoodputMem -count=1 -v -args -lossbench.duration=3s -lossbench.rounds=3
func TestLossGoodputMem(t *testing.T) {
	var clean, lossy []float64
	for r := 0; r < *lossRounds; r++ {
		c, l := lossMemRound(t, r, *lossDuration)
		clean = append(clean, c.goodput)
		lossy = append(lossy, l.goodput)
	}
	mc, ml := median(clean), median(lossy)
	fmt.Printf("RC WRITE 64 KiB ×%d over memlink, %v per case, median of %d: lossless %.2f Gb/s, 1%% loss %.2f Gb/s, ratio %.2f\n",
		lossDepth, *lossDuration, *lossRounds, mc*8/1e9, ml*8/1e9, ml/mc)
}
