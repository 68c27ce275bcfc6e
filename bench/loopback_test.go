//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

var (
	loLong = flag.Bool("lobench.long", os.Getenv("GOROCE_LOBENCH_LONG") != "",
		"TestLoopbackTable: run each case for seconds rather than a fraction of one (also GOROCE_LOBENCH_LONG=1)")
	loRounds = flag.Int("lobench.rounds", envInt("GOROCE_LOBENCH_ROUNDS", 1),
		"TestLoopbackTable: measure every case this many times, the cases taking turns, and show medians (also GOROCE_LOBENCH_ROUNDS)")
)

// loPlan is how long each TestLoopbackTable case runs.
type loPlan struct {
	bwIters, latIters int
	tool              time.Duration
}

var (
	loQuick = loPlan{bwIters: 2000, latIters: 2000, tool: time.Second}
	loLongP = loPlan{bwIters: 20000, latIters: 20000, tool: 3 * time.Second}
)

// TestLoopbackTable measures the main job, rocectl perf --loopback (both
// devices in one process, on kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2), beside the kernel on the same loopback in the same run:
// write-bw 64 KiB against iperf3 TCP (throughput and CPU time per byte, the
// processes' own user+system time) and send-lat 8 B against sockperf's UDP
// ping-pong (median and p99.9). Everything runs in a fresh network
// namespace, so the tools' fixed ports cannot clash with anything else on
// the host. The cases take turns round by round, so a change of load hits
// both sides of a ratio alike.
func TestLoopbackTable(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.New(t)
	plan := loQuick
	if *loLong {
		plan = loLongP
	}
	rounds := max(*loRounds, 1)
	fs := figures{}
	loadStart := loadAvg()
	runTurns(t, rounds, loopbackCases(ns, plan, fs))
	fmt.Printf("rocectl perf --loopback (two devices in one process, kernel UDP on 127.0.0.1 and 127.0.0.2) beside the kernel on loopback\n")
	fmt.Printf("load average at start %s, at end %s; %d round(s), cases taking turns, medians\n", loadStart, loadAvg(), rounds)
	fmt.Printf("write-bw -s %d -n %d --report_gbits; send-lat -s %d -n %d (t_typical, p99.9); iperf3 TCP %v; sockperf ping-pong UDP %d B %v\n",
		bwSize, plan.bwIters, latSize, plan.latIters, plan.tool, sockperfMinSize, plan.tool)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "metric\tgoroce\tkernel\tratio")
	row := func(name, a, b string, higherBetter bool) {
		ratio := "-"
		x, okA := fs.get(a).median()
		y, okB := fs.get(b).median()
		if okA && okB && y > 0 {
			ratio = strconv.FormatFloat(x/y, 'f', 2, 64)
		}
		_ = higherBetter
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", name, fs.get(a), fs.get(b), ratio)
	}
	row("write-bw 64 KiB vs iperf3 TCP (Gb/s)", "bw", "tcp", true)
	row("write-bw 64 KiB vs raw UDP-link frames (payload Gb/s)", "bw", "ceil", true)
	row("raw UDP-link frames vs iperf3 TCP (Gb/s)", "ceil", "tcp", true)
	row("CPU seconds per GB (both ends)", "bw-cpu", "tcp-cpu", false)
	row("send-lat 8 B vs sockperf UDP, median (us)", "lat", "udp-lat", false)
	row("send-lat 8 B vs sockperf UDP, p99.9 (us)", "lat-p999", "udp-p999", false)
	row("send-lat 8 B vs sockperf UDP, minimum (us)", "lat-min", "udp-min", false)
	w.Flush()
	for _, k := range []string{"bw", "tcp", "lat", "udp-lat"} {
		if f := fs.get(k); f.skip == "" && f.err == nil && len(f.samples) > 0 {
			t.Logf("%s samples %v", k, f.samples)
		}
	}
}

// loopbackCases are TestLoopbackTable's cases, in the order they take
// turns, all in ns: iperf3 TCP, rocectl perf write-bw --loopback (64 KiB),
// the UDP link's own ceiling (a sender process blasting full-MTU RoCE
// frames from 127.0.0.1 to a receiver process on 127.0.0.2, with GSO and
// GRO as the device uses them, no transport), sockperf's UDP ping-pong and
// rocectl perf send-lat --loopback (8 B). Figures go to fs: tcp, tcp-cpu,
// bw, bw-cpu (CPU seconds per GB), ceil (payload Gb/s of the frames
// received), ceilloss (percent of sent frames lost), udp-lat, udp-p999,
// udp-min, lat, lat-p999 and lat-min (microseconds, one way).
func loopbackCases(ns *netnstest.NS, plan loPlan, fs figures) []benchCase {
	noTool := func(name string) string {
		if _, err := exec.LookPath(name); err != nil {
			return name + " not installed"
		}
		return ""
	}
	ctx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), caseTimeout)
	}
	return []benchCase{
		{name: "lo/iperf3-tcp", fs: fs, keys: []string{"tcp", "tcp-cpu"}, skip: noTool("iperf3"), fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			gbps, cpu, err := iperf3Lo(ctx, ns, plan.tool)
			return map[string]float64{"tcp": gbps, "tcp-cpu": cpu}, err
		}},
		{name: "lo/write-bw", fs: fs, keys: []string{"bw", "bw-cpu"}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			res, cpu, err := rocectlLo(ctx, ns, "write-bw", "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(plan.bwIters), "--report_gbits")
			if err == nil && (res.BW == nil || res.BW.BWAvg <= 0) {
				err = fmt.Errorf("no bandwidth in %+v", res)
			}
			if err != nil {
				return nil, err
			}
			return map[string]float64{"bw": res.BW.BWAvg, "bw-cpu": cpu / (float64(bwSize) * float64(plan.bwIters) / 1e9)}, nil
		}},
		{name: "lo/ceiling-udp", fs: fs, keys: []string{"ceil", "ceilloss"}, fn: func(t *testing.T) (map[string]float64, error) {
			payload, _, loss, err := ceilingFigures(measureLo(t, ns, roceFrame, plan.tool))
			if err != nil {
				return nil, err
			}
			return map[string]float64{"ceil": payload, "ceilloss": loss}, nil
		}},
		{name: "lo/sockperf-udp", fs: fs, keys: []string{"udp-lat", "udp-p999", "udp-min"}, skip: noTool("sockperf"), fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			med, p999, minimum, err := sockperfLo(ctx, ns, plan.tool)
			return map[string]float64{"udp-lat": med, "udp-p999": p999, "udp-min": minimum}, err
		}},
		{name: "lo/send-lat", fs: fs, keys: []string{"lat", "lat-p999", "lat-min"}, fn: func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := ctx()
			defer cancel()
			res, _, err := rocectlLo(ctx, ns, "send-lat", "-s", strconv.Itoa(latSize), "-n", strconv.Itoa(plan.latIters))
			if err == nil && (res.Lat == nil || res.Lat.Typical <= 0) {
				err = fmt.Errorf("no latency in %+v", res)
			}
			if err != nil {
				return nil, err
			}
			return map[string]float64{"lat": res.Lat.Typical, "lat-p999": res.Lat.P999, "lat-min": res.Lat.Min}, nil
		}},
	}
}

// cpuOf is the user+system time of a finished process, in seconds.
func cpuOf(c *exec.Cmd) float64 {
	if c.ProcessState == nil {
		return 0
	}
	return (c.ProcessState.UserTime() + c.ProcessState.SystemTime()).Seconds()
}

// rocectlLo runs "rocectl perf <test> --loopback --json" in ns and returns
// the client's result and the process's CPU time.
func rocectlLo(ctx context.Context, ns *netnstest.NS, test string, extra ...string) (perfrun.PerfResult, float64, error) {
	return rocectlLoEnv(ctx, ns, nil, test, extra...)
}

// rocectlLoEnv is rocectlLo with env ("NAME=value") added to the process's
// environment, overriding what the test inherited (GOMAXPROCS).
func rocectlLoEnv(ctx context.Context, ns *netnstest.NS, env []string, test string, extra ...string) (perfrun.PerfResult, float64, error) {
	var r perfrun.PerfResult
	cmd := rocectlCmd(ctx, append([]string{"perf", test, "--loopback", "--json", "--timeout", caseTimeout.String()}, extra...)...)
	cmd.Env = append(cmd.Env, env...)
	out, err := runClient(ns, cmd)
	if err != nil {
		return r, 0, err
	}
	// The client's result is printed first; the server's follows.
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "{") {
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				return r, 0, err
			}
			if r.Role == "client" || r.Role == "" {
				return r, cpuOf(cmd), nil
			}
		}
	}
	if err := lastJSONLine(out, &r); err != nil {
		return r, 0, err
	}
	return r, cpuOf(cmd), nil
}

// iperf3Lo runs iperf3 TCP over 127.0.0.1 in ns for d and returns the
// receiver's Gb/s and both processes' CPU seconds per GB received.
func iperf3Lo(ctx context.Context, ns *netnstest.NS, d time.Duration) (gbps, cpuPerGB float64, err error) {
	srv, err := startServer(ctx, ns, exec.CommandContext(ctx, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", strconv.Itoa(iperf3Port)), iperf3Port)
	if err != nil {
		return 0, 0, err
	}
	secs := strconv.FormatFloat(max(d.Seconds(), 1), 'f', -1, 64)
	cmd := exec.CommandContext(ctx, "iperf3", "-c", "127.0.0.1", "-p", strconv.Itoa(iperf3Port), "-t", secs, "-J")
	out, cerr := runClient(ns, cmd)
	var res iperf3Result
	if jerr := json.Unmarshal(out, &res); jerr != nil && cerr == nil {
		cerr = jerr
	}
	if serr := srv.wait(); serr != nil && cerr == nil {
		cerr = serr
	}
	if cerr == nil && res.Error != "" {
		cerr = fmt.Errorf("iperf3: %s", res.Error)
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	s := res.End.SumReceived
	if s.Bytes == 0 {
		return 0, 0, fmt.Errorf("iperf3 received nothing")
	}
	return s.BitsPerSec / 1e9, (cpuOf(cmd) + cpuOf(srv.cmd)) / (float64(s.Bytes) / 1e9), nil
}

// sockperfLo runs a sockperf UDP ping-pong over 127.0.0.1 in ns for d and
// returns its one-way median and p99.9 in microseconds.
func sockperfLo(ctx context.Context, ns *netnstest.NS, d time.Duration) (med, p999, minimum float64, err error) {
	port := strconv.Itoa(sockperfPort)
	srv, err := startServerProto(ctx, ns, exec.CommandContext(ctx, "sockperf", "sr", "-i", "127.0.0.1", "-p", port), "udp", sockperfPort)
	if err != nil {
		return 0, 0, 0, err
	}
	defer srv.kill()
	secs := strconv.Itoa(max(int(d.Round(time.Second)/time.Second), 1))
	out, err := runClient(ns, exec.CommandContext(ctx, "sockperf", "pp", "-i", "127.0.0.1", "-p", port, "-m", strconv.Itoa(sockperfMinSize), "-t", secs))
	if err != nil {
		return 0, 0, 0, err
	}
	res, err := parseSockperf(out)
	if err != nil {
		return 0, 0, 0, err
	}
	p999, ok := sockperfPercentile(out, "99.900")
	if !ok {
		return 0, 0, 0, fmt.Errorf("no p99.9 in sockperf output %q", out)
	}
	return res.Median, p999, res.Min, nil
}

// sockperfPercentile reads "percentile <p> = <value>" from sockperf's
// summary.
func sockperfPercentile(out []byte, p string) (float64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if _, rest, ok := strings.Cut(sc.Text(), "percentile "+p+" ="); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
