//go:build linux

package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
)

var (
	scLong = flag.Bool("scalebench.long", os.Getenv("GOROCE_SCALEBENCH_LONG") != "",
		"TestScaleTable: run each case for seconds rather than a fraction of one (also GOROCE_SCALEBENCH_LONG=1)")
	scRounds = flag.Int("scalebench.rounds", envInt("GOROCE_SCALEBENCH_ROUNDS", 1),
		"TestScaleTable: measure every case this many times, the cases taking turns, and show medians (also GOROCE_SCALEBENCH_ROUNDS)")
)

// scPlan is how long each TestScaleTable case runs.
type scPlan struct {
	rateIters, bwIters, latIters int
	tool                         time.Duration
}

var (
	scQuick = scPlan{rateIters: 2000, bwIters: 1000, latIters: 2000, tool: time.Second}
	scLongP = scPlan{rateIters: 200000, bwIters: 20000, latIters: 20000, tool: 3 * time.Second}
)

const (
	scaleQPs    = 8  // send-bw's QPs in parallel
	scaleBWQPs  = 2  // write-bw's
	scaleRate   = 64 // send-bw message
	scaleGoal   = 1.6
	scaleTCPMin = 1.0
)

// TestScaleTable measures the multi-core scale-out of rocectl perf
// --loopback in a fresh network namespace, the cases taking turns round by
// round (medians):
//
//	go test ./bench -run TestScaleTable -count=1 -v -args -scalebench.long -scalebench.rounds=3
//
// send-bw 64 B over 8 QPs in a process with GOMAXPROCS=1 and in one with
// GOMAXPROCS=2 (goal: the message rate at 2 at least 1.6 times that at 1),
// and at 2 with two receive queues per link (--queues 2, for the record);
// the same frames on the kernel UDP link alone, without the transport, at
// GOMAXPROCS 1 and 2 (stream_test.go: what a second CPU gives the link and
// the kernel, for the record);
// write-bw 64 KiB over 2 QPs against iperf3 TCP on the same loopback (goal:
// at least 1.0 times); send-lat 8 B over one QP, typical, for the record
// (a scale-out must not cost single-QP latency). A missed goal is a figure,
// not a failure.
func TestScaleTable(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t)
	plan := scQuick
	if *scLong {
		plan = scLongP
	}
	rounds := max(*scRounds, 1)
	fs := figures{}
	loadStart := loadAvg()
	runTurns(t, rounds, scaleCases(ns, plan, fs))
	fmt.Printf("rocectl perf --loopback (two devices in one process, kernel UDP on 127.0.0.1 and 127.0.0.2), scale-out over QPs and CPUs\n")
	fmt.Printf("load average at start %s, at end %s; %d round(s), cases taking turns, medians\n", loadStart, loadAvg(), rounds)
	fmt.Printf("send-bw -s %d -n %d -q %d (Mpps); write-bw -s %d -n %d -q %d --report_gbits; send-lat -s %d -n %d (t_typical); iperf3 TCP %v\n",
		scaleRate, plan.rateIters, scaleQPs, bwSize, plan.bwIters, scaleBWQPs, latSize, plan.latIters, plan.tool)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "metric\tgoroce\tbaseline\tratio\tgoal\tmet")
	// Message rates are a few tenths of a Mpps here: they take three
	// decimals.
	show := func(k string, prec int) string {
		if v, ok := fs.get(k).median(); ok {
			return strconv.FormatFloat(v, 'f', prec, 64)
		}
		return fs.get(k).String()
	}
	row := func(name, a, b string, prec int, goal float64) {
		ratio, met, goalS := "-", "-", "-"
		if goal > 0 {
			goalS = "≥ " + strconv.FormatFloat(goal, 'f', 1, 64)
		}
		x, okA := fs.get(a).median()
		y, okB := fs.get(b).median()
		if okA && okB && y > 0 {
			ratio = strconv.FormatFloat(x/y, 'f', 2, 64)
			if goal > 0 {
				met = map[bool]string{true: "met", false: "not met"}[x/y >= goal]
			}
		}
		base := "-"
		if b != "" {
			base = show(b, prec)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", name, show(a, prec), base, ratio, goalS, met)
	}
	row("send-bw 64 B -q 8, GOMAXPROCS=2 vs 1 (Mpps)", "rate2", "rate1", 3, scaleGoal)
	row("send-bw 64 B -q 8, GOMAXPROCS=2, --queues 2 vs 1 (Mpps)", "rate2q", "rate2", 3, 0)
	row("its frames on the UDP link alone, GOMAXPROCS=2 vs 1 (Mpps)", "stream2", "stream1", 3, 0)
	row("write-bw 64 KiB -q 2 vs iperf3 TCP (Gb/s)", "bw2", "tcp", 2, scaleTCPMin)
	row("send-lat 8 B -q 1, typical (us)", "lat", "", 2, 0)
	w.Flush()
	for _, k := range []string{"rate1", "rate2", "rate2q", "stream1", "stream2", "bw2", "tcp", "lat"} {
		if f := fs.get(k); f.skip == "" && f.err == nil && len(f.samples) > 0 {
			t.Logf("%s samples %v", k, f.samples)
		}
	}
}

// scaleCases are TestScaleTable's cases, in the order they take turns, all
// in ns. Figures go to fs: rate1 and rate2 (send-bw Mpps at GOMAXPROCS 1
// and 2), rate2q (at 2, on links of two receive queues), stream1 and
// stream2 (the link alone, Mpps at GOMAXPROCS 1 and 2), bw2 (write-bw Gb/s over two QPs), tcp (iperf3 Gb/s) and lat
// (send-lat typical, microseconds).
func scaleCases(ns *netnstest.NS, plan scPlan, fs figures) []benchCase {
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), caseTimeout)
	}
	rate := func(key string, procs, queues int) benchCase {
		name := "scale/send-bw-gomaxprocs-" + strconv.Itoa(procs)
		args := []string{"send-bw", "-s", strconv.Itoa(scaleRate), "-n", strconv.Itoa(plan.rateIters), "-q", strconv.Itoa(scaleQPs)}
		if queues > 1 {
			name += "-queues-" + strconv.Itoa(queues)
			args = append(args, "--queues", strconv.Itoa(queues))
		}
		return benchCase{name: name, fs: fs, keys: []string{key}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			res, _, err := rocectlLoEnv(ctx, ns, []string{"GOMAXPROCS=" + strconv.Itoa(procs)}, args[0], args[1:]...)
			if err == nil && (res.BW == nil || res.BW.MsgRate <= 0) {
				err = fmt.Errorf("no message rate in %+v", res)
			}
			if err != nil {
				return nil, err
			}
			return map[string]float64{key: res.BW.MsgRate}, nil
		}}
	}
	tcpSkip := ""
	if _, err := exec.LookPath("iperf3"); err != nil {
		tcpSkip = "iperf3 not installed"
	}
	stream := func(key string, procs int) benchCase {
		return benchCase{name: "scale/kernel-udp-stream-gomaxprocs-" + strconv.Itoa(procs), fs: fs, keys: []string{key}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			mpps, err := kernelStream(ctx, ns, procs, streamShape(plan.rateIters*scaleQPs))
			return map[string]float64{key: mpps}, err
		}}
	}
	return []benchCase{
		rate("rate1", 1, 1),
		rate("rate2", 2, 1),
		rate("rate2q", 2, 2),
		stream("stream1", 1),
		stream("stream2", 2),
		{name: "scale/iperf3-tcp", fs: fs, keys: []string{"tcp"}, skip: tcpSkip, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			gbps, _, err := iperf3Lo(ctx, ns, plan.tool)
			return map[string]float64{"tcp": gbps}, err
		}},
		{name: "scale/write-bw-q2", fs: fs, keys: []string{"bw2"}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			res, _, err := rocectlLo(ctx, ns, "write-bw", "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(plan.bwIters),
				"-q", strconv.Itoa(scaleBWQPs), "--report_gbits")
			if err == nil && (res.BW == nil || res.BW.BWAvg <= 0) {
				err = fmt.Errorf("no bandwidth in %+v", res)
			}
			if err != nil {
				return nil, err
			}
			return map[string]float64{"bw2": res.BW.BWAvg}, nil
		}},
		{name: "scale/send-lat", fs: fs, keys: []string{"lat"}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			res, _, err := rocectlLo(ctx, ns, "send-lat", "-s", strconv.Itoa(latSize), "-n", strconv.Itoa(plan.latIters))
			if err == nil && (res.Lat == nil || res.Lat.Typical <= 0) {
				err = fmt.Errorf("no latency in %+v", res)
			}
			if err != nil {
				return nil, err
			}
			return map[string]float64{"lat": res.Lat.Typical}, nil
		}},
	}
}
