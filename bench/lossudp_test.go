//go:build linux

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"

	"github.com/goroce/goroce/internal/netnstest"
)

// TestLossGoodputUDP runs rocectl perf write-bw (64 KiB) over the kernel
// UDP link between two namespaces, once as is and once with 1 % of the
// RoCEv2 frames dropped at random on the egress of both veth ends (the
// interop lab's tc-BPF loss injector: the kernel may lack sch_netem), and
// prints both figures, their ratio and the request frames put on the wire
// per frame a lossless run needs. The AF_XDP link is left out: its frames
// bypass tc on the way out and XDP takes them before tc on the way in.
//
//	go test ./bench -run TestLossGoodputUDP -count=1 -v -args -lossbench.rounds=3
func TestLossGoodputUDP(t *testing.T) {
	iters := 1000
	if !testing.Short() && *lossRounds > 1 {
		iters = 3000
	}
	var clean, lossy []float64
	for r := 0; r < *lossRounds; r++ {
		for _, loss := range []float64{0, 0.01} {
			gbps, err := lossUDPRun(t, r, loss, iters)
			if s, ok := err.(skipError); ok {
				t.Skip(string(s))
			}
			if err != nil {
				t.Fatal(err)
			}
			if loss > 0 {
				lossy = append(lossy, gbps)
			} else {
				clean = append(clean, gbps)
			}
		}
	}
	mc, ml := median(clean), median(lossy)
	fmt.Printf("rocectl perf write-bw -s %d -n %d over the UDP link between namespaces (veth MTU %d), median of %d: lossless %.2f Gb/s, 1%% loss %.2f Gb/s, ratio %.2f\n",
		bwSize, iters, vethMTU, *lossRounds, mc, ml, ml/mc)
}

// lossUDPRun runs rocectl perf write-bw -s 65536 -n iters over the UDP link
// between two fresh namespaces, with the given loss on both veth egresses,
// logs it as round r and returns its Gb/s. A missing loss injector is a
// skipError.
func lossUDPRun(t *testing.T, r int, loss float64, iters int) (float64, error) {
	a, b := netnstest.NewNamed(t, ""), netnstest.NewNamed(t, "")
	va, vb := netnstest.NewVeth(t, a, b, netnstest.VethConfig{MTU: vethMTU,
		Addr: netip.MustParsePrefix("10.99.0.1/24"), PeerAddr: netip.MustParsePrefix("10.99.0.2/24")})
	p := &netnstest.Pair{A: a, B: b, VethA: va, VethB: vb}
	var inj *netnstest.LossInjector
	if loss > 0 {
		var err error
		if inj, err = netnstest.NewLoss(a.Name(), []string{va.Name}, loss); err != nil {
			return 0, skipError(fmt.Sprintf("no loss injector: %v", err))
		}
		defer inj.Close()
		injB, err := netnstest.NewLoss(b.Name(), []string{vb.Name}, loss)
		if err != nil {
			return 0, skipError(fmt.Sprintf("no loss injector: %v", err))
		}
		defer injB.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	res, err := rocectlPerf(ctx, p, "write-bw", "udp", "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(iters), "--report_gbits")
	cancel()
	if err != nil {
		return 0, fmt.Errorf("loss %v: %w", loss, err)
	}
	if res.client.BW == nil || res.client.BW.BWAvg <= 0 {
		return 0, fmt.Errorf("loss %v: no bandwidth figure: %+v", loss, res.client)
	}
	line := fmt.Sprintf("round %d, loss %.0f %%: %.2f Gb/s (path MTU %d)", r, loss*100, res.client.BW.BWAvg, res.client.MTU)
	if inj != nil {
		passed, dropped, err := inj.Counts()
		if err == nil && res.client.MTU > 0 {
			need := float64(iters) * float64((bwSize+res.client.MTU-1)/res.client.MTU)
			line += fmt.Sprintf(", %d frames dropped, %.2f request frames on the wire per frame needed", dropped, float64(passed+dropped)/need)
		}
	}
	t.Log(line)
	return res.client.BW.BWAvg, nil
}
