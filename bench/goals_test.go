//go:build linux

package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

var (
	goalsLong = flag.Bool("goals.long", os.Getenv("GOROCE_GOALS_LONG") != "",
		"TestGoalsTable: the tables' longer plans (-transbench.long, -lobench.long, 2 s loss cases; also GOROCE_GOALS_LONG=1)")
	goalsRounds = flag.Int("goals.rounds", envInt("GOROCE_GOALS_ROUNDS", 1),
		"TestGoalsTable: measure every case this many times, the cases taking turns, and show medians (also GOROCE_GOALS_ROUNDS)")
)

// goalsPlan is how long each TestGoalsTable case runs: the plans of the
// tables its cases come from, and its own for the in-process ones.
type goalsPlan struct {
	trans     transportPlan
	lo        loPlan
	lossMem   time.Duration // each memlink loss case sends for this long
	lossIters int           // write-bw -n of each UDP-link loss case
	devMsgs   int           // 64 KiB WRITEs streamed for a device's CPU per packet
	idle      time.Duration // how long an idle device pair is watched
}

var (
	goalsQuick = goalsPlan{trans: quickPlan, lo: loQuick, lossMem: 300 * time.Millisecond, lossIters: 1000, devMsgs: 2000, idle: time.Second}
	goalsLongP = goalsPlan{trans: longPlan, lo: loLongP, lossMem: 2 * time.Second, lossIters: 3000, devMsgs: 20000, idle: time.Second}
)

// idleWakeLimit is the most thread wake-ups per second an idle device
// pair may add to the process for goal 5 ("no tick"): a 100 Hz tick in
// either device would add 100 or more.
const idleWakeLimit = 10

// idleCPULimit is the most CPU time, in microseconds per second, an idle
// device pair may add to the process for goal 5: a tenth of a percent of
// one CPU.
const idleCPULimit = 1000

// allocLimit is the most allocations per packet a path may show for goal
// 5: under one per thousand packets. A data path that allocated would
// show one or more per message (0.05 or more per packet here); what this
// admits is the Go runtime's own, made in whichever goroutine meets them
// (a new thread when a system call blocks, a wait-queue entry when a lock
// is contended), which the lowest of three windows mostly leaves out.
const allocLimit = 0.001

// TestGoalsTable measures every goal of the performance issue in one run,
// side by side with its baseline, and prints one table: goal, measured,
// baseline, ratio, target, met. Goals 1 and 3 come from TestTransportTable's
// cases (send-lat and write-bw over AF_XDP between namespaces, the raw
// AF_XDP ceiling, iperf3 TCP, sockperf and the Go UDP ping-pong on the same
// kind of veth), goals 2 and 4 from TestLoopbackTable's (rocectl perf
// --loopback beside iperf3 TCP and sockperf on loopback), goal 6 from
// TestLossGoodputMem's and TestLossGoodputUDP's rounds; goal 5 is measured
// in this process: allocations and CPU time per packet of the engine
// (qptest.Wire, the loop of package qp's engine benchmarks) and of a pair
// of devices on the UDP link (loopback) and on the AF_XDP link (veth), and
// the thread wake-ups and CPU time of the idle pair beside those of the
// process without devices. The cases take turns round by round
// (-goals.rounds); -goals.long takes the tables' longer plans. An unmet
// goal is a figure, not a failure: the test fails only when a measurement
// does. See README.md.
//
//	go test ./bench -run TestGoalsTable -count=1 -v -args -goals.long -goals.rounds=3
func TestGoalsTable(t *testing.T) {
	netnstest.RequireRoot(t)
	netnstest.SkipUnlessNetns(t)
	plan := goalsQuick
	if *goalsLong {
		plan = goalsLongP
	}
	rounds := max(*goalsRounds, 1)
	trans, lo, own := figures{}, figures{}, figures{}
	n := notes{loadStart: loadAvg()}

	var cases []benchCase
	tcs := transportCases(plan.trans, trans, &n, xdpProbe(t))
	want := []string{"ceiling/" + link.KindAFXDP, "goroce/write-bw/xdp", "goroce/send-lat/xdp", "iperf3/tcp", "sockperf/udp", "go-ping-pong/udp"}
	if picked := pickCases(tcs, want...); len(picked) != len(want) {
		t.Fatalf("transport cases: found %d of %q", len(picked), want)
	} else {
		cases = append(cases, picked...)
	}
	cases = append(cases, loopbackCases(netnstest.New(t), plan.lo, lo)...)
	cases = append(cases, goalsLossCases(plan, own)...)
	cases = append(cases, goalsCostCases(plan, own)...)
	runTurns(t, rounds, cases)
	n.loadEnd = loadAvg()
	printGoalsTable(trans, lo, own, n, plan, rounds)
}

// goalsLossCases are goal 6's cases: one round of TestLossGoodputMem and
// one of TestLossGoodputUDP, each the lossless run and the one with 1 %
// loss.
func goalsLossCases(plan goalsPlan, fs figures) []benchCase {
	rMem, rUDP := 0, 0
	return []benchCase{
		{name: "loss/memlink", fs: fs, keys: []string{"lossmem/clean", "lossmem/lossy"}, fn: func(t *testing.T) (map[string]float64, error) {
			clean, lossy := lossMemRound(t, rMem, plan.lossMem)
			rMem++
			return map[string]float64{"lossmem/clean": clean.goodput * 8 / 1e9, "lossmem/lossy": lossy.goodput * 8 / 1e9}, nil
		}},
		{name: "loss/udp-link", fs: fs, keys: []string{"lossudp/clean", "lossudp/lossy"}, fn: func(t *testing.T) (map[string]float64, error) {
			v := map[string]float64{}
			defer func() { rUDP++ }()
			for _, c := range []struct {
				loss float64
				key  string
			}{{0, "lossudp/clean"}, {0.01, "lossudp/lossy"}} {
				gbps, err := lossUDPRun(t, rUDP, c.loss, plan.lossIters)
				if err != nil {
					return nil, err
				}
				v[c.key] = gbps
			}
			return v, nil
		}},
	}
}

// goalsCostCases are goal 5's cases: the engine's cost per packet (SEND
// 8 B and RDMA WRITE 64 KiB through qptest.Wire) and a device pair's on
// each link, idle cost included.
func goalsCostCases(plan goalsPlan, fs figures) []benchCase {
	var cs []benchCase
	for _, e := range []struct {
		name string
		op   qp.WROpcode
		size int
	}{{"send8", qp.WRSend, latSize}, {"write64k", qp.WRRDMAWrite, bwSize}} {
		cs = append(cs, benchCase{name: "cost/engine/" + e.name, fs: fs, keys: []string{"eng/" + e.name + "/cpu", "eng/" + e.name + "/allocs"},
			fn: func(t *testing.T) (map[string]float64, error) {
				cpu, allocs, err := engineCost(e.op, e.size)
				return map[string]float64{"eng/" + e.name + "/cpu": cpu, "eng/" + e.name + "/allocs": allocs}, err
			}})
	}
	for _, l := range []string{"udp", "xdp"} {
		p := "dev/" + l + "/"
		cs = append(cs, benchCase{name: "cost/device/" + l, fs: fs,
			keys: []string{p + "allocs", p + "cpu", p + "idlewakes", p + "idlecpu", p + "basewakes", p + "basecpu"},
			fn: func(t *testing.T) (map[string]float64, error) {
				return deviceCost(t, l, plan)
			}})
	}
	return cs
}

// engineCost runs testing.Benchmark over qptest.Wire messages of op and
// size, the loop of package qp's engine benchmarks (BenchmarkRCSend64 and
// the like), and returns the CPU time per packet of the benchmark's thread
// (locked to it, so a busy machine's waits do not count) and the
// allocations per packet of the whole process.
func engineCost(op qp.WROpcode, size int) (cpuNs, allocs float64, err error) {
	w, err := qptest.NewWire(op, size)
	if err != nil {
		return 0, 0, err
	}
	var cpu time.Duration
	var pkts int
	res := testing.Benchmark(func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for i := 0; i < 100 && err == nil; i++ {
			err = w.One()
		}
		w.Packets = 0
		b.ReportAllocs()
		c0 := threadCPU()
		b.ResetTimer()
		for i := 0; i < b.N && err == nil; i++ {
			err = w.One()
		}
		b.StopTimer()
		cpu, pkts = threadCPU()-c0, w.Packets
	})
	if err != nil {
		return 0, 0, err
	}
	if pkts == 0 || res.N == 0 {
		return 0, 0, fmt.Errorf("engine benchmark moved no packet")
	}
	return float64(cpu.Nanoseconds()) / float64(pkts), float64(res.MemAllocs) / float64(pkts), nil
}

// threadCPU is the calling thread's user and system time.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// idleCost watches this process for d and returns its voluntary context
// switches (each one a thread that ran and went back to sleep: a wake-up)
// and its CPU time, both per second.
func idleCost(d time.Duration) (wakes, cpuUs float64) {
	// The runtime's own background work after a busy spell (a collection,
	// the scavenger returning memory to the OS) is done first, so that
	// what is watched is what the devices do.
	debug.FreeOSMemory()
	var r0, r1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &r0)
	start := time.Now()
	time.Sleep(d)
	unix.Getrusage(unix.RUSAGE_SELF, &r1)
	s := time.Since(start).Seconds()
	cpu := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()) - time.Duration(r0.Utime.Nano()+r0.Stime.Nano())
	return float64(r1.Nvcsw-r0.Nvcsw) / s, float64(cpu.Microseconds()) / s
}

// devicePair opens two goroce devices in this process joined by linkKind:
// "udp" is the main job's link, kernel UDP sockets on 127.0.0.1 and
// 127.0.0.2 (kernel-chosen ports, as rocectl perf --loopback); "xdp" the
// AF_XDP link on the veth pair p (skipped where AF_XDP is missing). They
// close when t ends.
func devicePair(t *testing.T, linkKind string, p *netnstest.Pair) (da, db *roce.Device, addrA, addrB netip.Addr) {
	t.Helper()
	if linkKind == "xdp" {
		return openXDP(t, p.VethA), openXDP(t, p.VethB), p.VethA.Addr.Addr(), p.VethB.Addr.Addr()
	}
	addrA, addrB = netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	la, err := udplink.ListenOptions(netip.AddrPortFrom(addrA, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(addrB, 0), udplink.Options{EphemeralPort: true})
	if err != nil {
		la.Close()
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if da, err = roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Port: lb.LocalAddr().Port(), Logger: quiet}); err != nil {
		la.Close()
		lb.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	if db, err = roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{addrB}, Port: la.LocalAddr().Port(), Logger: quiet}); err != nil {
		lb.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db, addrA, addrB
}

// waitSettled waits until no address of v is tentative (IPv6 duplicate
// address detection, which for the automatic link-local address lasts a
// few seconds after the interface comes up).
func waitSettled(v *netnstest.Veth, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tentative := false
		if err := v.NS.Do(func() error {
			l, err := netlink.LinkByIndex(v.Index)
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
			for _, a := range addrs {
				tentative = tentative || a.Flags&unix.IFA_F_TENTATIVE != 0
			}
			return err
		}); err != nil {
			return fmt.Errorf("addresses of %s: %w", v.Name, err)
		}
		if !tentative {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: an address still tentative after %v", v.Name, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deviceCost measures goal 5 on a device pair over linkKind: the process's
// wake-ups and CPU time while it has no device (the baseline), then, with
// an RC QP connected between the pair, the allocations per packet of a
// SEND of 8 B plus an RDMA WRITE of 64 KiB (the lowest of three windows,
// as steadyAllocs, counted exactly rather than per run), the process's CPU
// time per packet while streaming 64 KiB WRITEs, and its wake-ups and CPU
// time while the connected pair sits idle.
func deviceCost(t *testing.T, linkKind string, plan goalsPlan) (map[string]float64, error) {
	p := "dev/" + linkKind + "/"
	v := map[string]float64{}
	var pair *netnstest.Pair
	if linkKind == "xdp" {
		// The veth pair is made before the baseline is watched, and the
		// devices open once no address of it is tentative: a new
		// interface's first seconds end with the kernel's IPv6 address
		// events (duplicate address detection of the link-local address),
		// which would wake the devices' netlink watchers in the idle
		// watch. That is the kernel settling, not the device's idle cost.
		pair = readyPair(t)
	}
	v[p+"basewakes"], v[p+"basecpu"] = idleCost(plan.idle)
	if pair != nil {
		for _, e := range []*netnstest.Veth{pair.VethA, pair.VethB} {
			if err := waitSettled(e, 10*time.Second); err != nil {
				return nil, err
			}
		}
	}

	da, db, addrA, addrB := devicePair(t, linkKind, pair)
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	a, b := rcConnect(t, ctx, da, db, addrA, addrB)
	sent := func() uint64 { return da.Counters().SentPkts + db.Counters().SentPkts }

	send := roce.SendWR{ID: 1, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{a.mr.SGE(0, latSize)}}
	write := roce.SendWR{ID: 2, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled, SGL: []roce.SGE{a.mr.SGE(0, bwSize)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	recv := roce.RecvWR{ID: 3, SGL: []roce.SGE{b.mr.SGE(0, latSize)}}
	var wcs [4]roce.WorkCompletion
	reap := func(cq *roce.CQ, want int) error {
		for got := 0; got < want; {
			n := cq.Poll(wcs[:want-got])
			for _, wc := range wcs[:n] {
				if wc.Status != roce.WCSuccess {
					return fmt.Errorf("completion %+v", wc)
				}
			}
			got += n
			if n == 0 {
				if err := cq.Wait(ctx); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// One SEND and one WRITE, A's two completions and B's receive reaped.
	round := func() error {
		if err := b.qp.PostRecv(&recv); err != nil {
			return err
		}
		if err := a.qp.PostSend(&send); err != nil {
			return err
		}
		if err := a.qp.PostSend(&write); err != nil {
			return err
		}
		if err := reap(a.cq, 2); err != nil {
			return err
		}
		return reap(b.cq, 1)
	}
	for range 100 { // warm up pools, maps and the congestion window
		if err := round(); err != nil {
			return nil, err
		}
	}
	const runs = 200
	best := -1.0
	for range 3 {
		var m0, m1 runtime.MemStats
		s0 := sent()
		runtime.ReadMemStats(&m0)
		for range runs {
			if err := round(); err != nil {
				return nil, err
			}
		}
		runtime.ReadMemStats(&m1)
		pkts := sent() - s0
		if pkts == 0 {
			return nil, fmt.Errorf("%d rounds sent no packet", runs)
		}
		// ReadMemStats allocates nothing itself; the netlink watchers of an
		// AF_XDP device may, which is why the lowest window counts.
		if a := float64(m1.Mallocs-m0.Mallocs) / float64(pkts); best < 0 || a < best {
			best = a
		}
	}
	v[p+"allocs"] = best

	s0, c0 := sent(), cpuTime(unix.RUSAGE_SELF)
	if _, _, err := a.writeStream(ctx, b, func(posted int) bool { return posted >= plan.devMsgs }, caseTimeout); err != nil {
		return nil, err
	}
	cpu, pkts := cpuTime(unix.RUSAGE_SELF)-c0, sent()-s0
	if pkts == 0 {
		return nil, fmt.Errorf("%d WRITEs sent no packet", plan.devMsgs)
	}
	v[p+"cpu"] = float64(cpu.Nanoseconds()) / float64(pkts)

	// Let a deferred ACK or the last completion's wake-ups settle first.
	time.Sleep(100 * time.Millisecond)
	v[p+"idlewakes"], v[p+"idlecpu"] = idleCost(plan.idle)
	return v, nil
}

// goalRow is one line of the goals table.
type goalRow struct {
	goal, metric string
	value        *fig
	baseName     string
	base         *fig
	// atMost: the ratio (or, without a baseline, the value) must not
	// exceed target; otherwise it must reach it. info rows show a second
	// baseline or a figure without a target: their verdict is in
	// parentheses, or "-".
	target float64
	atMost bool
	info   bool
	// abs: the value is compared with the baseline plus target, not
	// divided by it (idle wake-ups).
	abs bool
	// prec is the figures' number of decimals (default 2).
	prec int
}

func (r goalRow) figure(f *fig) string {
	v, ok := f.median()
	if !ok {
		return f.String()
	}
	prec := r.prec
	if prec == 0 {
		prec = 2
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// verdict is the row's ratio, target and met columns. A negative target
// means none: the figure is shown for what it is.
func (r goalRow) verdict() (ratio, target, met string) {
	v, ok := r.value.median()
	b, okB := 0.0, false
	if r.base != nil {
		b, okB = r.base.median()
	}
	ratio, target, met = "-", "-", "-"
	x, haveX := v, ok
	switch {
	case r.base == nil:
	case r.abs:
		// The excess over the baseline is what is judged.
		x, haveX = v-b, ok && okB
	case ok && okB && b > 0:
		x = v / b
		ratio = strconv.FormatFloat(x, 'f', 2, 64)
	default:
		haveX = false
	}
	if r.target < 0 {
		return ratio, target, met
	}
	cmp := ">="
	if r.atMost {
		cmp = "<="
	}
	target = fmt.Sprintf("%s %g", cmp, r.target)
	if r.atMost && r.target == allocLimit {
		target = "<= 1 per 1000"
	}
	if r.abs {
		target = fmt.Sprintf("%s baseline + %g", cmp, r.target)
	}
	if haveX {
		yes := x >= r.target
		if r.atMost {
			yes = x <= r.target
		}
		met = map[bool]string{true: "yes", false: "no"}[yes]
	}
	if r.info {
		target = "(" + target + ")"
		if met != "-" {
			met = "(" + met + ")"
		}
	}
	return ratio, target, met
}

func printGoalsTable(trans, lo, own figures, n notes, plan goalsPlan, rounds int) {
	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("\nperformance goals, measured side by side in one run: %d CPUs, kernel %s\n", runtime.NumCPU(), unix.ByteSliceToString(u.Release[:]))
	fmt.Printf("load average at start %s, at end %s; %d round(s), cases taking turns, figures are medians, ratio = goroce / baseline\n",
		n.loadStart, n.loadEnd, rounds)
	fmt.Printf("veth (goals 1, 3): MTU %d, RoCE path MTU %s; rocectl perf send-lat -s %d -n %d, write-bw -s %d -n %d; sockperf %d-byte messages (its minimum) and Go UDP ping-pong %d B, %v each; iperf3 TCP %v; raw AF_XDP frames %d B for %v\n",
		vethMTU, strings.Join(n.mtus, ", "), latSize, plan.trans.latIters, bwSize, plan.trans.bwIters, sockperfMinSize, latSize, plan.trans.tool,
		plan.trans.tool, roceFrame, plan.trans.link)
	fmt.Printf("loopback (goals 2, 4): rocectl perf --loopback send-lat -s %d -n %d, write-bw -s %d -n %d; sockperf UDP, iperf3 TCP and raw UDP-link frames of %d B (127.0.0.1 to 127.0.0.2), %v each\n",
		latSize, plan.lo.latIters, bwSize, plan.lo.bwIters, roceFrame, plan.lo.tool)
	fmt.Printf("goal 5 in this process: engine = qptest.Wire (package qp's benchmark loop); device pairs: UDP link on 127.0.0.1/127.0.0.2, AF_XDP on veth; CPU over %d WRITEs of 64 KiB; idle watched %v\n",
		plan.devMsgs, plan.idle)
	fmt.Printf("goal 6: RC WRITE 64 KiB x%d over memlink for %v per case; rocectl perf write-bw -s %d -n %d over the UDP link between namespaces, loss by tc-BPF on both veths\n",
		lossDepth, plan.lossMem, bwSize, plan.lossIters)
	rows := []goalRow{
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, median (us)", value: trans.get("lat/xdp"), baseName: "sockperf UDP", base: trans.get("sock/med"), target: 0.5, atMost: true},
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, p99.9 (us)", value: trans.get("latp999/xdp"), baseName: "sockperf UDP", base: trans.get("sock/p999"), target: 0.5, atMost: true},
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, minimum (us)", value: trans.get("latmin/xdp"), baseName: "sockperf UDP", base: trans.get("sock/min"), target: 0.5, atMost: true, info: true},
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, median (us)", value: trans.get("lat/xdp"), baseName: "Go UDP ping-pong", base: trans.get("go/med"), target: 0.5, atMost: true, info: true},
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, p99.9 (us)", value: trans.get("latp999/xdp"), baseName: "Go UDP ping-pong", base: trans.get("go/p999"), target: 0.5, atMost: true, info: true},
		{goal: "1", metric: "send-lat 8 B, AF_XDP, veth, minimum (us)", value: trans.get("latmin/xdp"), baseName: "Go UDP ping-pong", base: trans.get("go/min"), target: 0.5, atMost: true, info: true},
		{goal: "2", metric: "send-lat 8 B --loopback, median (us)", value: lo.get("lat"), baseName: "sockperf UDP lo", base: lo.get("udp-lat"), target: 1.3, atMost: true},
		{goal: "2", metric: "send-lat 8 B --loopback, p99.9 (us)", value: lo.get("lat-p999"), baseName: "sockperf UDP lo", base: lo.get("udp-p999"), target: 1.3, atMost: true},
		{goal: "2", metric: "send-lat 8 B --loopback, minimum (us)", value: lo.get("lat-min"), baseName: "sockperf UDP lo", base: lo.get("udp-min"), target: 1.3, atMost: true, info: true},
		{goal: "3", metric: "write-bw 64 KiB, AF_XDP, veth (Gb/s)", value: trans.get("bw/xdp"), baseName: "raw AF_XDP frames", base: trans.get("ceil/xdp"), target: 0.9},
		{goal: "3", metric: "write-bw 64 KiB, AF_XDP, veth (Gb/s)", value: trans.get("bw/xdp"), baseName: "iperf3 TCP veth", base: trans.get("tcp"), target: 1.0},
		{goal: "3", metric: "raw AF_XDP frames, veth, payload (Gb/s)", value: trans.get("ceil/xdp"), baseName: "iperf3 TCP veth", base: trans.get("tcp"), target: 1.0, info: true},
		{goal: "4", metric: "write-bw 64 KiB --loopback (Gb/s)", value: lo.get("bw"), baseName: "iperf3 TCP lo", base: lo.get("tcp"), target: 1.0},
		{goal: "4", metric: "write-bw 64 KiB --loopback (Gb/s)", value: lo.get("bw"), baseName: "raw UDP-link frames lo", base: lo.get("ceil"), target: 0.9, info: true},
		{goal: "4", metric: "raw UDP-link frames lo, payload (Gb/s)", value: lo.get("ceil"), baseName: "iperf3 TCP lo", base: lo.get("tcp"), target: 1.0, info: true},
		{goal: "4", metric: "CPU s per GB, --loopback (both ends)", value: lo.get("bw-cpu"), baseName: "iperf3 TCP lo", base: lo.get("tcp-cpu"), target: 1.0, atMost: true, info: true},
		{goal: "5", metric: "allocations per packet, engine, SEND 8 B", value: own.get("eng/send8/allocs"), target: allocLimit, atMost: true, prec: 4},
		{goal: "5", metric: "allocations per packet, engine, WRITE 64 KiB", value: own.get("eng/write64k/allocs"), target: allocLimit, atMost: true, prec: 4},
		{goal: "5", metric: "allocations per packet, device pair, UDP link", value: own.get("dev/udp/allocs"), target: allocLimit, atMost: true, prec: 4},
		{goal: "5", metric: "allocations per packet, device pair, AF_XDP", value: own.get("dev/xdp/allocs"), target: allocLimit, atMost: true, prec: 4},
		{goal: "5", metric: "CPU ns per packet, engine, SEND 8 B", value: own.get("eng/send8/cpu"), target: -1, prec: 0},
		{goal: "5", metric: "CPU ns per packet, engine, WRITE 64 KiB", value: own.get("eng/write64k/cpu"), target: -1, prec: 0},
		{goal: "5", metric: "CPU ns per packet, device pair, UDP link", value: own.get("dev/udp/cpu"), target: -1, prec: 0},
		{goal: "5", metric: "CPU ns per packet, device pair, AF_XDP", value: own.get("dev/xdp/cpu"), target: -1, prec: 0},
		{goal: "5", metric: "idle pair, UDP link: wake-ups/s", value: own.get("dev/udp/idlewakes"), baseName: "no device", base: own.get("dev/udp/basewakes"), target: idleWakeLimit, atMost: true, abs: true, prec: 1},
		{goal: "5", metric: "idle pair, UDP link: CPU us/s", value: own.get("dev/udp/idlecpu"), baseName: "no device", base: own.get("dev/udp/basecpu"), target: idleCPULimit, atMost: true, abs: true, prec: 0},
		{goal: "5", metric: "idle pair, AF_XDP: wake-ups/s", value: own.get("dev/xdp/idlewakes"), baseName: "no device", base: own.get("dev/xdp/basewakes"), target: idleWakeLimit, atMost: true, abs: true, prec: 1},
		{goal: "5", metric: "idle pair, AF_XDP: CPU us/s", value: own.get("dev/xdp/idlecpu"), baseName: "no device", base: own.get("dev/xdp/basecpu"), target: idleCPULimit, atMost: true, abs: true, prec: 0},
		{goal: "6", metric: "WRITE 64 KiB goodput, 1% loss, memlink (Gb/s)", value: own.get("lossmem/lossy"), baseName: "lossless", base: own.get("lossmem/clean"), target: 0.5},
		{goal: "6", metric: "write-bw 64 KiB, 1% loss, UDP link, veth (Gb/s)", value: own.get("lossudp/lossy"), baseName: "lossless", base: own.get("lossudp/clean"), target: 0.5},
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "goal\tmetric\tgoroce\tbaseline\t\tratio\ttarget\tmet")
	for _, r := range rows {
		base, baseFig := "", ""
		if r.base != nil {
			base, baseFig = r.baseName, r.figure(r.base)
		}
		ratio, target, met := r.verdict()
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.goal, r.metric, r.figure(r.value), baseFig, base, ratio, target, met)
	}
	w.Flush()
	if n.xdpMode != "" {
		fmt.Printf("AF_XDP: %s\n", n.xdpMode)
	}
	fmt.Println("latencies are one-way (half the round trip); rows with the target in parentheses show a second baseline or a figure beside the goal; CPU per packet has no target: its benchmarks guard it")
}
