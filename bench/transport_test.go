//go:build linux

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

var (
	transLong = flag.Bool("transbench.long", os.Getenv("GOROCE_TRANSBENCH_LONG") != "",
		"TestTransportTable: run each case for seconds rather than a fraction of one (also GOROCE_TRANSBENCH_LONG=1)")
	transRounds = flag.Int("transbench.rounds", envInt("GOROCE_TRANSBENCH_ROUNDS", 1),
		"TestTransportTable: measure every case this many times and show medians (also GOROCE_TRANSBENCH_ROUNDS)")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// transportPlan is how long each TestTransportTable case runs. perftest's
// tests are bounded by iterations, the other tools by time.
type transportPlan struct {
	bwIters, latIters int           // rocectl perf -n
	checkIters        int           // RC ping-pongs of bwSize checked
	link              time.Duration // raw link ceiling
	tool              time.Duration // iperf3, sockperf
}

var (
	quickPlan = transportPlan{bwIters: 1000, latIters: 1000, checkIters: 200, link: 300 * time.Millisecond, tool: time.Second}
	longPlan  = transportPlan{bwIters: 5000, latIters: 10000, checkIters: 2000, link: 3 * time.Second, tool: 3 * time.Second}
)

const (
	bwSize  = 65536 // write-bw message
	latSize = 8     // send-lat message
	// roceMTU is the path MTU goroce picks on the MTU-9000 veth (the
	// largest IB MTU that fits).
	roceMTU = 4096
	// roceFrame is a full-MTU RoCEv2 middle packet on the wire: Ethernet
	// 14 + IPv4 20 + UDP 8 + BTH 12 + 4096 payload + ICRC 4. A 64 KiB RDMA
	// WRITE is 16 such packets (the first also carries a 16-byte RETH).
	roceFrame = 14 + 20 + 8 + 12 + roceMTU + 4
	// caseTimeout bounds every process of one case.
	caseTimeout = 90 * time.Second
)

// perfRun is both ends' results of one rocectl perf test.
type perfRun struct {
	client, server perfrun.PerfResult
}

// rocectlPerf runs "rocectl perf <test>" with the server in B and the
// client in A, each a separate process on its veth end, over linkKind
// ("xdp" or "udp").
func rocectlPerf(ctx context.Context, p *netnstest.Pair, test, linkKind string, extra ...string) (perfRun, error) {
	var r perfRun
	args := func(ifname string) []string {
		a := []string{"perf", test, "-d", ifname, "--link", linkKind, "--json", "--timeout", caseTimeout.String()}
		return append(a, extra...)
	}
	srv, err := startServer(ctx, p.B, rocectlCmd(ctx, args(p.VethB.Name)...), perfrun.DefaultPort)
	if err != nil {
		return r, fmt.Errorf("server: %w", err)
	}
	out, cerr := runClient(p.A, rocectlCmd(ctx, append(args(p.VethA.Name), p.VethB.Addr.Addr().String())...))
	if cerr != nil {
		srv.kill()
		return r, fmt.Errorf("client: %w", cerr)
	}
	if err := srv.wait(); err != nil {
		return r, fmt.Errorf("server: %w", err)
	}
	if err := lastJSONLine(out, &r.client); err != nil {
		return r, fmt.Errorf("client: %w", err)
	}
	if err := lastJSONLine(srv.out.Bytes(), &r.server); err != nil {
		return r, fmt.Errorf("server: %w", err)
	}
	return r, nil
}

// fig is one figure of the table: its samples over the rounds, or why
// there are none.
type fig struct {
	samples []float64
	err     error
	skip    string
}

// median is the figure the table shows.
func (f *fig) median() (float64, bool) {
	if f == nil || f.err != nil || f.skip != "" || len(f.samples) == 0 {
		return 0, false
	}
	s := slices.Clone(f.samples)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

func (f *fig) String() string {
	switch {
	case f == nil:
		return "-"
	case f.skip != "":
		return "skipped"
	case f.err != nil:
		return "failed"
	}
	v, ok := f.median()
	if !ok {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// figures holds every figure of one TestTransportTable run by name.
type figures map[string]*fig

func (fs figures) get(k string) *fig {
	f := fs[k]
	if f == nil {
		f = &fig{}
		fs[k] = f
	}
	return f
}

// run runs case name as a subtest: fn once per round, each time returning
// the case's figures by name (keys lists them all, for marking them failed
// or skipped). A non-empty skip skips the case with that reason.
func (fs figures) run(t *testing.T, name string, rounds int, skip string, keys []string, fn func(t *testing.T) (map[string]float64, error)) {
	c := benchCase{name: name, fs: fs, keys: keys, skip: skip, fn: fn}
	t.Run(name, func(t *testing.T) {
		for i := 0; i < rounds; i++ {
			c.measure(t, i)
		}
	})
}

// benchCase is one measurement of a table: fn measures it once and returns
// its figures by name, which go to fs (keys lists them all, for marking
// them failed or skipped). A non-empty skip skips the case with that
// reason, as does fn returning a skipError; a once case is measured in the
// first round only.
type benchCase struct {
	name string
	fs   figures
	keys []string
	skip string
	once bool
	fn   func(t *testing.T) (map[string]float64, error)
}

// skipError is what a case's fn returns when what it measures is absent
// here (a tool, a kernel feature): the case is skipped, saying why.
type skipError string

func (e skipError) Error() string { return string(e) }

// measure runs round i of c in t, which it ends (Skip, Fatal) when the
// case is skipped or fails.
func (c *benchCase) measure(t *testing.T, i int) {
	if c.skip != "" {
		for _, k := range c.keys {
			c.fs.get(k).skip = c.skip
		}
		t.Skip(c.skip)
	}
	// fn may skip by itself (a helper finding a capability absent).
	defer func() {
		if t.Skipped() {
			for _, k := range c.keys {
				if f := c.fs.get(k); f.skip == "" {
					f.skip = "skipped"
				}
			}
		}
	}()
	v, err := c.fn(t)
	if s, ok := err.(skipError); ok {
		c.skip = string(s)
		for _, k := range c.keys {
			c.fs.get(k).skip = c.skip
		}
		t.Skip(c.skip)
	}
	for _, k := range c.keys {
		if _, ok := v[k]; !ok && err == nil {
			err = fmt.Errorf("no %s figure", k)
		}
	}
	if err != nil {
		for _, k := range c.keys {
			c.fs.get(k).err = err
		}
		t.Fatalf("round %d: %v", i+1, err)
	}
	for _, k := range c.keys {
		c.fs.get(k).samples = append(c.fs.get(k).samples, v[k])
	}
}

// runTurns measures every case rounds times, the cases taking turns: all
// of them once, then all again, so that a change of the machine's load
// hits both sides of a ratio alike. Each measurement is a subtest named
// after its case; a case that is skipped or fails is not measured again.
func runTurns(t *testing.T, rounds int, cases []benchCase) {
	done := make([]bool, len(cases))
	for r := 0; r < rounds; r++ {
		for i := range cases {
			c := &cases[i]
			if done[i] || (c.once && r > 0) {
				continue
			}
			ok := t.Run(c.name, func(t *testing.T) {
				defer func() { done[i] = done[i] || t.Skipped() || t.Failed() }()
				c.measure(t, r)
			})
			done[i] = done[i] || !ok
		}
	}
}

// pickCases returns the cases of cs named in names, in the order of cs.
func pickCases(cs []benchCase, names ...string) []benchCase {
	var out []benchCase
	for _, c := range cs {
		if slices.Contains(names, c.name) {
			out = append(out, c)
		}
	}
	return out
}

// notes are the run's facts the table prints under it.
type notes struct {
	loadStart, loadEnd string
	mtus               []string
	xdpMode            string
	checks             []string
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// TestTransportTable measures goroce against goroce between two network
// namespaces over veth (rocectl perf write-bw at 64 KiB and send-lat at
// 8 B, over the AF_XDP link and the kernel UDP link) beside, in the same
// run and on the same kind of veth, the raw AF_XDP and UDP link frame
// ceilings, kernel TCP and UDP throughput (iperf3) and kernel UDP latency
// (sockperf, and a Go ping-pong at 8 B), and prints one table. An RC
// ping-pong of 64 KiB messages checks the bytes that cross on each link.
// By default each case takes about a second (CI);
// -args -transbench.long (or GOROCE_TRANSBENCH_LONG=1) runs each for a few
// seconds, and -transbench.rounds repeats every case, the table showing
// medians. See README.md.
func TestTransportTable(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.SkipUnlessNetns(t)
	plan := quickPlan
	if *transLong {
		plan = longPlan
	}
	rounds := max(*transRounds, 1)
	fs := figures{}
	n := notes{loadStart: loadAvg()}
	runTurns(t, rounds, transportCases(plan, fs, &n, xdpProbe(t)))
	n.loadEnd = loadAvg()
	printTransportTable(fs, n, plan, rounds)
}

// xdpProbe tells whether the AF_XDP link works here: "" if it does, else
// why not (a missing AF_XDP is a skip, not a failure). It runs as a
// subtest outside the figures.
func xdpProbe(t *testing.T) string {
	missing := ""
	t.Run("ceiling/probe", func(t *testing.T) {
		if r := measure(t, link.KindAFXDP, roceFrame, 50*time.Millisecond); r.note != "" {
			missing = "AF_XDP link unavailable here: " + r.note
			t.Skip(missing)
		}
	})
	return missing
}

// transportCases are TestTransportTable's cases, in the order they take
// turns: the raw link ceilings at the size of a full-MTU RoCE packet,
// goroce over each link (write-bw, send-lat, the data check), iperf3 TCP
// and UDP, sockperf and the Go ping-pong, each on a fresh veth pair.
// Figures go to fs, the run's facts to n; a non-empty xdpMissing (from
// xdpProbe) skips the AF_XDP cases with that reason.
func transportCases(plan transportPlan, fs figures, n *notes, xdpMissing string) []benchCase {
	var cs []benchCase
	add := func(name, skip string, keys []string, fn func(t *testing.T) (map[string]float64, error)) {
		cs = append(cs, benchCase{name: name, fs: fs, keys: keys, skip: skip, fn: fn})
	}
	for _, kind := range []string{link.KindAFXDP, link.KindUDP} {
		l := goroceLink(kind)
		skip := ""
		if kind == link.KindAFXDP {
			skip = xdpMissing
		}
		add("ceiling/"+kind, skip, []string{"ceil/" + l, "ceilframe/" + l, "ceilloss/" + l},
			func(t *testing.T) (map[string]float64, error) {
				r := measure(t, kind, roceFrame, plan.link)
				payload, frameGbps, loss, err := ceilingFigures(r)
				if err != nil {
					return nil, err
				}
				if kind == link.KindAFXDP {
					n.xdpMode = r.mode
				}
				return map[string]float64{"ceil/" + l: payload, "ceilframe/" + l: frameGbps, "ceilloss/" + l: loss}, nil
			})
	}

	for _, l := range []string{"xdp", "udp"} {
		skip := ""
		if l == "xdp" {
			skip = xdpMissing
		}
		add("goroce/write-bw/"+l, skip, []string{"bw/" + l}, func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			r, err := rocectlPerf(ctx, p, "write-bw", l, "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(plan.bwIters), "--report_gbits")
			if err != nil {
				return nil, err
			}
			if r.client.BW == nil || r.client.BW.BWAvg <= 0 || r.client.Iters != uint64(plan.bwIters) || r.client.Size != bwSize {
				return nil, fmt.Errorf("no bandwidth figure: %+v", r.client)
			}
			n.mtus = appendOnce(n.mtus, fmt.Sprintf("%s %d", l, r.client.MTU))
			return map[string]float64{"bw/" + l: r.client.BW.BWAvg}, nil
		})
		add("goroce/send-lat/"+l, skip, []string{"lat/" + l, "latavg/" + l, "latmin/" + l, "latp999/" + l}, func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			r, err := rocectlPerf(ctx, p, "send-lat", l, "-s", strconv.Itoa(latSize), "-n", strconv.Itoa(plan.latIters))
			if err != nil {
				return nil, err
			}
			for _, e := range []perfrun.PerfResult{r.client, r.server} {
				if e.Lat == nil || e.Lat.Typical <= 0 || e.Lat.Avg <= 0 || e.Iters != uint64(plan.latIters) || e.Size != latSize {
					return nil, fmt.Errorf("%s: no latency figure: %+v", e.Role, e)
				}
			}
			return map[string]float64{"lat/" + l: r.client.Lat.Typical, "latavg/" + l: r.client.Lat.Avg, "latmin/" + l: r.client.Lat.Min,
				"latp999/" + l: r.client.Lat.P999}, nil
		})
		// perftest's bandwidth and latency tests do not look at the bytes
		// they move; this case does, on the same link and veth, once.
		add("goroce/data-check/"+l, skip, nil, func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			c, s, err := pingpongCheck(ctx, p, l, bwSize, plan.checkIters)
			if err != nil {
				n.checks = append(n.checks, l+" failed")
				return nil, err
			}
			n.checks = append(n.checks, fmt.Sprintf("%s: client %d/%d, server %d/%d", l, c.Echoed, c.Received, s.Echoed, s.Received))
			for _, e := range []pingpongResult{c, s} {
				if e.Received != plan.checkIters || e.Echoed != e.Received {
					return nil, fmt.Errorf("received %d of %d messages, %d with the bytes the peer sent", e.Received, plan.checkIters, e.Echoed)
				}
			}
			return nil, nil
		})
		cs[len(cs)-1].once = true
	}

	for _, c := range []struct {
		name, key string
		udpLen    int
	}{{"iperf3/tcp", "tcp", 0}, {"iperf3/udp", "udp", roceMTU}} {
		skip := ""
		if _, err := exec.LookPath("iperf3"); err != nil {
			skip = "iperf3 not installed (Debian package iperf3)"
		}
		add(c.name, skip, []string{c.key, c.key + "loss"}, func(t *testing.T) (map[string]float64, error) {
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			r, err := iperf3(ctx, p, plan.tool, c.udpLen)
			if err != nil {
				return nil, err
			}
			if r.End.SumReceived.BitsPerSec <= 0 {
				return nil, fmt.Errorf("no throughput figure: %+v", r.End)
			}
			return map[string]float64{c.key: r.End.SumReceived.BitsPerSec / 1e9, c.key + "loss": r.End.SumReceived.LostPercent}, nil
		})
	}

	skip := ""
	if _, err := exec.LookPath("sockperf"); err != nil {
		skip = "sockperf not installed (Debian package sockperf)"
	}
	add("sockperf/udp", skip, []string{"sock/med", "sock/avg", "sock/min", "sock/p999"}, func(t *testing.T) (map[string]float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
		defer cancel()
		p := netnstest.NewPair(t, vethMTU)
		r, err := sockperf(ctx, p, plan.tool, sockperfMinSize)
		if err != nil {
			return nil, err
		}
		if r.Median <= 0 || r.Avg <= 0 || r.Observations == 0 {
			return nil, fmt.Errorf("no latency figure: %+v", r)
		}
		return map[string]float64{"sock/med": r.Median, "sock/avg": r.Avg, "sock/min": r.Min, "sock/p999": r.P999}, nil
	})
	add("go-ping-pong/udp", "", []string{"go/med", "go/avg", "go/min", "go/p999"}, func(t *testing.T) (map[string]float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
		defer cancel()
		p := netnstest.NewPair(t, vethMTU)
		// A lost datagram ends the run: none may wait on ARP.
		p.Resolve(t)
		r, err := goUDPPing(ctx, p, plan.tool, latSize)
		if err != nil {
			return nil, err
		}
		if r.Median <= 0 || r.Avg <= 0 || r.Samples == 0 {
			return nil, fmt.Errorf("no latency figure: %+v", r)
		}
		return map[string]float64{"go/med": r.Median, "go/avg": r.Avg, "go/min": r.Min, "go/p999": r.P999}, nil
	})
	return cs
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// goroceLink maps a raw link kind to rocectl's --link name.
func goroceLink(kind string) string {
	if kind == link.KindAFXDP {
		return "xdp"
	}
	return "udp"
}

func ratio(a, b *fig) string {
	x, ok1 := a.median()
	y, ok2 := b.median()
	if !ok1 || !ok2 || y == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x/y)
}

func printTransportTable(fs figures, n notes, plan transportPlan, rounds int) {
	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("\ngoroce to goroce between two network namespaces over veth (MTU %d), %d CPUs, kernel %s\n",
		vethMTU, runtime.NumCPU(), unix.ByteSliceToString(u.Release[:]))
	fmt.Printf("load average at start %s, at end %s; %d round(s) per case, figures are medians\n", n.loadStart, n.loadEnd, rounds)
	fmt.Printf("rocectl perf: write-bw -s %d -n %d --report_gbits, send-lat -s %d -n %d (client and server separate processes; RoCE path MTU: %s)\n",
		bwSize, plan.bwIters, latSize, plan.latIters, strings.Join(n.mtus, ", "))
	fmt.Printf("raw link ceiling: %d-byte frames (a full-MTU RoCE packet) for %v, payload Gb/s = received frames/s x %d x 8\n",
		roceFrame, plan.link, roceMTU)
	lossOf := func(k string) float64 { v, _ := fs.get(k).median(); return v }
	fmt.Printf("iperf3 %v per run, receiver's figure (UDP: %d-byte datagrams, -b 0 -w %s, %.1f%% lost)\n",
		plan.tool, roceMTU, iperf3UDPBuf, lossOf("udploss"))
	fmt.Printf("sockperf ping-pong, UDP, %d-byte messages (its minimum), for %v; Go ping-pong: UDP, %d-byte messages, for %v\n",
		sockperfMinSize, plan.tool, latSize, plan.tool)
	fmt.Println("ratio = goroce / baseline (throughput: higher is better; latency: lower is better)")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "metric\tgoroce\tceiling/baseline\t\tratio")
	row := func(metric, g, base, b string) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", metric, fs.get(g), fs.get(b), base, ratio(fs.get(g), fs.get(b)))
	}
	row("write-bw 64 KiB, AF_XDP link (Gb/s)", "bw/xdp", "raw AF_XDP frames (payload)", "ceil/xdp")
	row("", "bw/xdp", "kernel TCP (iperf3)", "tcp")
	row("", "bw/xdp", "kernel UDP (iperf3)", "udp")
	row("write-bw 64 KiB, UDP link (Gb/s)", "bw/udp", "raw UDP-link frames (payload)", "ceil/udp")
	row("", "bw/udp", "kernel TCP (iperf3)", "tcp")
	row("", "bw/udp", "kernel UDP (iperf3)", "udp")
	for _, l := range []struct{ name, key string }{{"AF_XDP", "xdp"}, {"UDP", "udp"}} {
		row("send-lat 8 B, "+l.name+" link, median (us)", "lat/"+l.key, "kernel UDP median (sockperf)", "sock/med")
		row("", "lat/"+l.key, "kernel UDP median (Go ping-pong)", "go/med")
		row("send-lat 8 B, "+l.name+" link, average (us)", "latavg/"+l.key, "kernel UDP average (sockperf)", "sock/avg")
		row("", "latavg/"+l.key, "kernel UDP average (Go ping-pong)", "go/avg")
		row("send-lat 8 B, "+l.name+" link, minimum (us)", "latmin/"+l.key, "kernel UDP minimum (sockperf)", "sock/min")
		row("", "latmin/"+l.key, "kernel UDP minimum (Go ping-pong)", "go/min")
		row("send-lat 8 B, "+l.name+" link, p99.9 (us)", "latp999/"+l.key, "kernel UDP p99.9 (sockperf)", "sock/p999")
	}
	w.Flush()
	fmt.Printf("raw link received frame Gb/s (headers included): AF_XDP %s (%.1f%% of sent frames lost), UDP link %s (%.1f%% lost)\n",
		fs.get("ceilframe/xdp"), lossOf("ceilloss/xdp"), fs.get("ceilframe/udp"), lossOf("ceilloss/udp"))
	if n.xdpMode != "" {
		fmt.Printf("AF_XDP: %s\n", n.xdpMode)
	}
	fmt.Println("latencies are one-way (half the round trip), as perftest and sockperf report them")
	fmt.Printf("data check (RC ping-pong, %d B x %d, messages matching what the peer sent/received): %s\n",
		bwSize, plan.checkIters, strings.Join(n.checks, "; "))
}

// ceilingFigures are a raw link run's figures at full-MTU RoCE frames:
// the payload and frame Gb/s received over the sender's interval, and the
// percent of sent frames lost.
func ceilingFigures(r row) (payloadGbps, frameGbps, loss float64, err error) {
	switch {
	case r.note != "":
		return 0, 0, 0, errors.New(r.note)
	case r.rx.Frames == 0 || r.tx.Elapsed <= 0:
		return 0, 0, 0, fmt.Errorf("sent %d, received %d frames (tx err %q, rx err %q)", r.tx.Frames, r.rx.Frames, r.tx.Err, r.rx.Err)
	}
	pps, frameGbps := rate(r.rx.Frames, roceFrame, r.tx.Elapsed)
	return pps * roceMTU * 8 / 1e9, frameGbps, 100 * (1 - float64(r.rx.Frames)/float64(max(r.tx.Frames, 1))), nil
}
