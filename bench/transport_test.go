package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/roce/link"
)

var transLong = flag.Bool("transbench.long", os.Getenv("GOROCE_TRANSBENCH_LONG") != "",
	"TestTransportTable: run each case for seconds rather than a fraction of one (also GOROCE_TRANSBENCH_LONG=1)")

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
	client, server perfcmd.PerfResult
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
	srv, err := startServer(ctx, p.B, rocectlCmd(ctx, args(p.VethB.Name)...), perfcmd.DefaultPort)
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

// figure is one measured number, or why there is none.
type figure struct {
	v    float64
	err  error
	skip string
}

func (f figure) String() string {
	switch {
	case f.skip != "":
		return "skipped"
	case f.err != nil:
		return "failed"
	}
	return strconv.FormatFloat(f.v, 'f', 2, 64)
}

func (f figure) ok() bool { return f.err == nil && f.skip == "" }

// transportResults holds every figure of one TestTransportTable run.
type transportResults struct {
	bw, lat, latAvg                map[string]figure // by goroce link: "xdp", "udp"
	ceiling                        map[string]figure // raw link, payload Gb/s at roceFrame
	ceilingFrame                   map[string]figure // raw link, frame Gb/s
	ceilingMode                    string
	ceilingLoss                    map[string]float64 // percent of frames sent
	tcp, udp                       figure             // iperf3 Gb/s
	udpLoss                        float64
	sockMed, sockAvg               figure // sockperf one-way µs
	goMed, goAvg                   figure // Go UDP ping-pong one-way µs
	loadStart, loadEnd, goroceMTUs string
	checks                         []string // data check outcomes
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
// (sockperf), and prints one table. By default each case takes about a
// second (CI); -args -transbench.long (or GOROCE_TRANSBENCH_LONG=1) runs
// each for a few seconds. See README.md.
func TestTransportTable(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.SkipUnlessNetns(t)
	plan := quickPlan
	if *transLong {
		plan = longPlan
	}
	res := transportResults{
		bw: map[string]figure{}, lat: map[string]figure{}, latAvg: map[string]figure{},
		ceiling: map[string]figure{}, ceilingFrame: map[string]figure{}, ceilingLoss: map[string]float64{},
		loadStart: loadAvg(),
	}
	var mtus []string
	xdpMissing := ""

	// Raw link ceilings at the size of a full-MTU RoCE packet; the AF_XDP
	// one also tells whether AF_XDP works here at all.
	for _, kind := range []string{link.KindAFXDP, link.KindUDP} {
		t.Run("ceiling/"+kind, func(t *testing.T) {
			r := measure(t, kind, roceFrame, plan.link)
			name := goroceLink(kind)
			switch {
			case r.note != "" && kind == link.KindAFXDP:
				xdpMissing = r.note
				res.ceiling[name] = figure{skip: r.note}
				t.Skipf("AF_XDP link unavailable here: %s", r.note)
			case r.note != "":
				res.ceiling[name] = figure{err: fmt.Errorf("%s", r.note)}
				t.Fatal(r.note)
			case r.rx.Frames == 0 || r.tx.Elapsed <= 0:
				res.ceiling[name] = figure{err: fmt.Errorf("no frames")}
				t.Fatalf("sent %d, received %d frames (tx err %q, rx err %q)", r.tx.Frames, r.rx.Frames, r.tx.Err, r.rx.Err)
			}
			pps, frameGbps := rate(r.rx.Frames, roceFrame, r.tx.Elapsed)
			res.ceiling[name] = figure{v: pps * roceMTU * 8 / 1e9}
			res.ceilingFrame[name] = figure{v: frameGbps}
			if r.tx.Frames > 0 {
				res.ceilingLoss[name] = 100 * (1 - float64(r.rx.Frames)/float64(r.tx.Frames))
			}
			if kind == link.KindAFXDP {
				res.ceilingMode = r.mode
			}
		})
	}

	for _, l := range []string{"xdp", "udp"} {
		t.Run("goroce/write-bw/"+l, func(t *testing.T) {
			if l == "xdp" && xdpMissing != "" {
				res.bw[l] = figure{skip: xdpMissing}
				t.Skipf("AF_XDP link unavailable here: %s", xdpMissing)
			}
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			r, err := rocectlPerf(ctx, p, "write-bw", l, "-s", strconv.Itoa(bwSize), "-n", strconv.Itoa(plan.bwIters), "--report_gbits")
			if err == nil && (r.client.BW == nil || r.client.BW.BWAvg <= 0 || r.client.Iters != uint64(plan.bwIters) || r.client.Size != bwSize) {
				err = fmt.Errorf("no bandwidth figure: %+v", r.client)
			}
			if err != nil {
				res.bw[l] = figure{err: err}
				t.Fatal(err)
			}
			res.bw[l] = figure{v: r.client.BW.BWAvg}
			mtus = append(mtus, fmt.Sprintf("%s %d", l, r.client.MTU))
		})
		t.Run("goroce/send-lat/"+l, func(t *testing.T) {
			if l == "xdp" && xdpMissing != "" {
				res.lat[l] = figure{skip: xdpMissing}
				res.latAvg[l] = figure{skip: xdpMissing}
				t.Skipf("AF_XDP link unavailable here: %s", xdpMissing)
			}
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			r, err := rocectlPerf(ctx, p, "send-lat", l, "-s", strconv.Itoa(latSize), "-n", strconv.Itoa(plan.latIters))
			if err == nil {
				for _, e := range []perfcmd.PerfResult{r.client, r.server} {
					if e.Lat == nil || e.Lat.Typical <= 0 || e.Lat.Avg <= 0 || e.Iters != uint64(plan.latIters) || e.Size != latSize {
						err = fmt.Errorf("%s: no latency figure: %+v", e.Role, e)
					}
				}
			}
			if err != nil {
				res.lat[l] = figure{err: err}
				res.latAvg[l] = figure{err: err}
				t.Fatal(err)
			}
			res.lat[l] = figure{v: r.client.Lat.Typical}
			res.latAvg[l] = figure{v: r.client.Lat.Avg}
		})
		// perftest's bandwidth and latency tests do not look at the bytes
		// they move; this case does, on the same link and veth.
		t.Run("goroce/data-check/"+l, func(t *testing.T) {
			if l == "xdp" && xdpMissing != "" {
				t.Skipf("AF_XDP link unavailable here: %s", xdpMissing)
			}
			ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
			defer cancel()
			p := netnstest.NewPair(t, vethMTU)
			c, s, err := pingpongCheck(ctx, p, l, bwSize, plan.checkIters)
			if err != nil {
				res.checks = append(res.checks, fmt.Sprintf("%s failed", l))
				t.Fatal(err)
			}
			res.checks = append(res.checks, fmt.Sprintf("%s: client %d/%d, server %d/%d", l, c.Echoed, c.Received, s.Echoed, s.Received))
			for _, e := range []pingpongResult{c, s} {
				if e.Received != plan.checkIters || e.Echoed != e.Received {
					t.Fatalf("received %d of %d messages, %d with the bytes the peer sent", e.Received, plan.checkIters, e.Echoed)
				}
			}
		})
	}

	t.Run("iperf3/tcp", func(t *testing.T) {
		res.tcp = iperf3Case(t, plan, 0, nil)
	})
	t.Run("iperf3/udp", func(t *testing.T) {
		res.udp = iperf3Case(t, plan, roceMTU, &res.udpLoss)
	})
	t.Run("sockperf/udp", func(t *testing.T) {
		if _, err := exec.LookPath("sockperf"); err != nil {
			res.sockMed = figure{skip: "sockperf not installed"}
			res.sockAvg = res.sockMed
			t.Skip("sockperf not installed (Debian package sockperf)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
		defer cancel()
		p := netnstest.NewPair(t, vethMTU)
		r, err := sockperf(ctx, p, plan.tool, sockperfMinSize)
		if err == nil && (r.Median <= 0 || r.Avg <= 0 || r.Observations == 0) {
			err = fmt.Errorf("no latency figure: %+v", r)
		}
		if err != nil {
			res.sockMed = figure{err: err}
			res.sockAvg = res.sockMed
			t.Fatal(err)
		}
		res.sockMed, res.sockAvg = figure{v: r.Median}, figure{v: r.Avg}
	})
	t.Run("go-ping-pong/udp", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
		defer cancel()
		p := netnstest.NewPair(t, vethMTU)
		r, err := goUDPPing(ctx, p, plan.tool, latSize)
		if err == nil && (r.Median <= 0 || r.Avg <= 0 || r.Samples == 0) {
			err = fmt.Errorf("no latency figure: %+v", r)
		}
		if err != nil {
			res.goMed = figure{err: err}
			res.goAvg = res.goMed
			t.Fatal(err)
		}
		res.goMed, res.goAvg = figure{v: r.Median}, figure{v: r.Avg}
	})
	res.loadEnd = loadAvg()
	res.goroceMTUs = strings.Join(mtus, ", ")
	printTransportTable(res, plan)
}

// goroceLink maps a raw link kind to rocectl's --link name.
func goroceLink(kind string) string {
	if kind == link.KindAFXDP {
		return "xdp"
	}
	return "udp"
}

// iperf3Case runs iperf3 over a fresh veth pair: TCP, or UDP datagrams of
// udpLen bytes. The figure is what the receiver got, in Gb/s.
func iperf3Case(t *testing.T, plan transportPlan, udpLen int, loss *float64) figure {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed (Debian package iperf3)")
		return figure{skip: "iperf3 not installed"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	p := netnstest.NewPair(t, vethMTU)
	r, err := iperf3(ctx, p, plan.tool, udpLen)
	if err == nil && r.End.SumReceived.BitsPerSec <= 0 {
		err = fmt.Errorf("no throughput figure: %+v", r.End)
	}
	if err != nil {
		t.Error(err)
		return figure{err: err}
	}
	if loss != nil {
		*loss = r.End.SumReceived.LostPercent
	}
	return figure{v: r.End.SumReceived.BitsPerSec / 1e9}
}

func ratio(a, b figure) string {
	if !a.ok() || !b.ok() || b.v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a.v/b.v)
}

func printTransportTable(r transportResults, plan transportPlan) {
	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("\ngoroce to goroce between two network namespaces over veth (MTU %d), %d CPUs, kernel %s\n",
		vethMTU, runtime.NumCPU(), unix.ByteSliceToString(u.Release[:]))
	fmt.Printf("load average at start %s, at end %s\n", r.loadStart, r.loadEnd)
	fmt.Printf("rocectl perf: write-bw -s %d -n %d, send-lat -s %d -n %d (client and server separate processes; RoCE path MTU: %s)\n",
		bwSize, plan.bwIters, latSize, plan.latIters, r.goroceMTUs)
	fmt.Printf("raw link ceiling: %d-byte frames (a full-MTU RoCE packet) for %v, payload Gb/s = received frames/s x %d x 8\n",
		roceFrame, plan.link, roceMTU)
	fmt.Printf("iperf3 %v per run, receiver's figure (UDP: %d-byte datagrams, -b 0 -w %s, %.1f%% lost)\n",
		plan.tool, roceMTU, iperf3UDPBuf, r.udpLoss)
	fmt.Printf("sockperf ping-pong, UDP, %d-byte messages (its minimum), for %v; Go ping-pong: UDP, %d-byte messages, for %v\n",
		sockperfMinSize, plan.tool, latSize, plan.tool)
	fmt.Println("ratio = goroce / baseline (throughput: higher is better; latency: lower is better)")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "metric\tgoroce\tceiling/baseline\t\tratio")
	row := func(metric string, g figure, base string, b figure) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", metric, g, b, base, ratio(g, b))
	}
	row("write-bw 64 KiB, AF_XDP link (Gb/s)", r.bw["xdp"], "raw AF_XDP frames (payload)", r.ceiling["xdp"])
	row("", r.bw["xdp"], "kernel TCP (iperf3)", r.tcp)
	row("", r.bw["xdp"], "kernel UDP (iperf3)", r.udp)
	row("write-bw 64 KiB, UDP link (Gb/s)", r.bw["udp"], "raw UDP-link frames (payload)", r.ceiling["udp"])
	row("", r.bw["udp"], "kernel TCP (iperf3)", r.tcp)
	row("", r.bw["udp"], "kernel UDP (iperf3)", r.udp)
	for _, l := range []struct{ name, key string }{{"AF_XDP", "xdp"}, {"UDP", "udp"}} {
		row("send-lat 8 B, "+l.name+" link, median (us)", r.lat[l.key], "kernel UDP median (sockperf)", r.sockMed)
		row("", r.lat[l.key], "kernel UDP median (Go ping-pong)", r.goMed)
		row("send-lat 8 B, "+l.name+" link, average (us)", r.latAvg[l.key], "kernel UDP average (sockperf)", r.sockAvg)
		row("", r.latAvg[l.key], "kernel UDP average (Go ping-pong)", r.goAvg)
	}
	w.Flush()
	fmt.Printf("raw link received frame Gb/s (headers included): AF_XDP %s (%.1f%% of sent frames lost), UDP link %s (%.1f%% lost)\n",
		r.ceilingFrame["xdp"], r.ceilingLoss["xdp"], r.ceilingFrame["udp"], r.ceilingLoss["udp"])
	if r.ceilingMode != "" {
		fmt.Printf("AF_XDP: %s\n", r.ceilingMode)
	}
	fmt.Println("latencies are one-way (half the round trip), as perftest and sockperf report them")
	fmt.Printf("data check (RC ping-pong, %d B x %d, messages matching what the peer sent/received): %s\n",
		bwSize, plan.checkIters, strings.Join(r.checks, "; "))
}
