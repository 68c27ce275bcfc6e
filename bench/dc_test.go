//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"text/tabwriter"

	"github.com/goroce/goroce/internal/netnstest"
)

// TestDCTable measures DC against RC on the same pair in one run: rocectl
// perf write-bw 64 KiB and send-lat 8 B with --connection RC and DC, over
// the AF_XDP and the kernel UDP link. The DC tests keep one target, so they
// show what DC costs when the target does not change; the cost of a target
// switch is in qp's BenchmarkDCSend8Switch.
func TestDCTable(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.SkipUnlessNetns(t)
	plan := quickPlan
	if *transLong {
		plan = longPlan
	}
	rounds := max(*transRounds, 1)
	fs := figures{}
	start := loadAvg()
	for _, l := range []string{"xdp", "udp"} {
		for _, conn := range []string{"RC", "DC"} {
			bw, lat := "bw/"+conn+"/"+l, "lat/"+conn+"/"+l
			fs.run(t, "write-bw/"+conn+"/"+l, rounds, "", []string{bw}, func(t *testing.T) (map[string]float64, error) {
				ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
				defer cancel()
				p := netnstest.NewPair(t, vethMTU)
				r, err := rocectlPerf(ctx, p, "write-bw", l, "-c", conn, "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(plan.bwIters), "--report_gbits")
				if err != nil {
					return nil, err
				}
				if r.client.BW == nil || r.client.BW.BWAvg <= 0 {
					return nil, fmt.Errorf("no bandwidth figure: %+v", r.client)
				}
				return map[string]float64{bw: r.client.BW.BWAvg}, nil
			})
			fs.run(t, "send-lat/"+conn+"/"+l, rounds, "", []string{lat}, func(t *testing.T) (map[string]float64, error) {
				ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
				defer cancel()
				p := netnstest.NewPair(t, vethMTU)
				r, err := rocectlPerf(ctx, p, "send-lat", l, "-c", conn, "-s", strconv.Itoa(latSize), "-n", strconv.Itoa(plan.latIters))
				if err != nil {
					return nil, err
				}
				if r.client.Lat == nil || r.client.Lat.Typical <= 0 {
					return nil, fmt.Errorf("no latency figure: %+v", r.client)
				}
				return map[string]float64{lat: r.client.Lat.Typical}, nil
			})
		}
	}
	fmt.Printf("\nDC against RC, goroce to goroce between two network namespaces over veth (MTU %d), %d CPUs\n", vethMTU, runtime.NumCPU())
	fmt.Printf("load average at start %s, at end %s; %d round(s) per case, medians; write-bw -s %d -n %d, send-lat -s %d -n %d (typical)\n",
		start, loadAvg(), rounds, bwSize, plan.bwIters, latSize, plan.latIters)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "metric\tRC\tDC\tDC/RC")
	for _, l := range []struct{ name, key string }{{"AF_XDP", "xdp"}, {"UDP", "udp"}} {
		rc, dc := fs.get("bw/RC/"+l.key), fs.get("bw/DC/"+l.key)
		fmt.Fprintf(w, "write-bw 64 KiB, %s link (Gb/s)\t%s\t%s\t%s\n", l.name, rc, dc, ratio(dc, rc))
		rc, dc = fs.get("lat/RC/"+l.key), fs.get("lat/DC/"+l.key)
		fmt.Fprintf(w, "send-lat 8 B, %s link, typical (us)\t%s\t%s\t%s\n", l.name, rc, dc, ratio(dc, rc))
	}
	w.Flush()
}
