// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// PerfTests maps "send-bw", "write-lat", ... to their verb and kind.
var PerfTests = map[string]struct {
	Verb    perftest.Verb
	Latency bool
}{}

func init() {
	for v, n := range []string{"send", "write", "read", "atomic"} {
		PerfTests[n+"-bw"] = struct {
			Verb    perftest.Verb
			Latency bool
		}{perftest.Verb(v), false}
		PerfTests[n+"-lat"] = struct {
			Verb    perftest.Verb
			Latency bool
		}{perftest.Verb(v), true}
	}
}

func signalContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	if timeout <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stop() }
}

func openDevice(ctx context.Context, ifname, link string, xdpBusyPoll time.Duration, stderr io.Writer) (*roce.Device, error) {
	return openDeviceCC(ctx, ifname, link, xdpBusyPoll, roce.CCConfig{}, 0, 0, netip.Addr{}, stderr)
}

// openDeviceCC is openDevice with congestion control cc, shards transmit
// shards, and the kernel UDP link bound to bind when it is valid
// (perftest's --bind_source_ip).
func openDeviceCC(ctx context.Context, ifname, link string, xdpBusyPoll time.Duration, cc roce.CCConfig, shards, queues int, bind netip.Addr, stderr io.Writer) (*roce.Device, error) {
	if ifname == "" {
		return nil, errors.New("-d <interface> is required")
	}
	kind, err := linkKind(link)
	if err != nil {
		return nil, err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := netdev.Options{Link: kind, UDPAddr: bind, UDPQueues: queues, XDP: xdpOptions(xdpBusyPoll), Device: roce.Options{Logger: logger, CC: cc, Shards: shards}}
	return netdev.Open(ctx, ifname, opts)
}

// parseBind checks --bind_source_ip: empty, or an IP address.
func parseBind(s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("-J/--bind_source_ip %q: not a unicast IP address", s)
	}
	return a.Unmap(), nil
}

// xdpBusyPollUsage documents the --xdp-busy-poll flag.
const xdpBusyPollUsage = "AF_XDP preferred busy polling per system call (SO_PREFER_BUSY_POLL, Linux 5.11): " +
	"0: netdev's default, negative: off"

// startCPUProfile writes a CPU profile of the run to path, if set; the
// returned function ends it.
func startCPUProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// StartStats publishes a running device's counters for "rocectl stat"
// and, with metrics set, serves them to Prometheus on that address, until
// stop is called. rocectl passes its devstat.Start; nil publishes nothing.
type StartStats func(dev *roce.Device, command, metrics string) (stop func(), err error)

// startStats calls stats, if set, on dev.
func startStats(stats StartStats, dev *roce.Device, command, metrics string) (func(), error) {
	if stats == nil {
		return func() {}, nil
	}
	return stats(dev, command, metrics)
}

// pingpongArgs is a pingpong command line, parsed and validated.
type pingpongArgs struct {
	cfg                  PingpongConfig
	dev, link            string
	port                 int
	xdpBusyPoll, timeout time.Duration
	metrics              string
	pos                  []string // the server address, if any
}

// parsePingpong parses and validates a pingpong command line without
// opening anything; with a nil result the command ends with the status.
func parsePingpong(args []string, stdout, stderr io.Writer) (*pingpongArgs, int) {
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rocectl pingpong {rc|ud} [flags] [server]\n\n"+
			"Runs ibv_rc_pingpong / ibv_ud_pingpong's test; without a server address it waits\n"+
			"for a client. Either end may be the real tool.\n\nflags:")
		fs.PrintDefaults()
	}
	dev := fs.String("d", "", "network `interface` to run RoCEv2 on")
	gidx := fs.Int("g", -1, "local port GID `index` (-1: the first IPv4 GID)")
	size := fs.Int("s", 0, "message `size` (default 4096 RC, 2048 UD)")
	iters := fs.Int("n", 1000, "number of `exchanges`")
	mtu := fs.Int("m", 1024, "path `MTU` (RC)")
	rx := fs.Int("r", 500, "`receives` to post at a time")
	events := fs.Bool("e", false, "sleep on CQ events (default poll)")
	port := fs.Int("p", DefaultPort, "listen on/connect to TCP `port`")
	link := fs.String("link", "auto", "packet `link`: xdp, udp or auto (xdp, falling back to udp)")
	xdpBusyPoll := fs.Duration("xdp-busy-poll", 0, xdpBusyPollUsage)
	timeout := fs.Duration("timeout", 0, "give up after this `duration` (0: never)")
	metrics := fs.String("metrics", "", "serve Prometheus metrics of the device at `address:port`/metrics while running")
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fs.SetOutput(stdout)
		fs.Usage()
		return nil, 0
	}
	if len(args) == 0 || (args[0] != "rc" && args[0] != "ud") {
		fs.Usage()
		return nil, 2
	}
	typ := roce.RC
	if args[0] == "ud" {
		typ = roce.UD
	}
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return nil, 2
	}
	if len(pos) > 1 {
		fs.Usage()
		return nil, 2
	}
	m, err := parseMTU(*mtu)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl pingpong:", err)
		return nil, 2
	}
	return &pingpongArgs{cfg: PingpongConfig{Type: typ, Size: *size, Iters: *iters, RxDepth: *rx, MTU: m, Events: *events,
		GIDIndex: *gidx}, dev: *dev, link: *link, port: *port, xdpBusyPoll: *xdpBusyPoll, timeout: *timeout,
		metrics: *metrics, pos: pos}, 0
}

// RunPingpong is "rocectl pingpong {rc,ud} [flags] [server]".
func RunPingpong(args []string, stdout, stderr io.Writer) int {
	return RunPingpongStats(args, stdout, stderr, nil)
}

// RunPingpongStats is RunPingpong publishing the device with stats.
func RunPingpongStats(args []string, stdout, stderr io.Writer, stats StartStats) int {
	a, code := parsePingpong(args, stdout, stderr)
	if a == nil {
		return code
	}
	pos := a.pos
	ctx, cancel := signalContext(a.timeout)
	defer cancel()
	d, err := openDevice(ctx, a.dev, a.link, a.xdpBusyPoll, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl pingpong:", err)
		return 1
	}
	defer d.Close()
	stop, err := startStats(stats, d, "pingpong", a.metrics)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl pingpong:", err)
		return 1
	}
	defer stop()
	var oob OOB
	if len(pos) == 1 {
		oob.Dial = DialRetry(peerAddr(pos[0], a.port), 0)
	} else if oob.Listener, err = ListenOOB(a.port); err != nil {
		fmt.Fprintln(stderr, "rocectl pingpong: Couldn't listen to port", a.port, err)
		return 1
	}
	if oob.Listener != nil {
		defer oob.Listener.Close()
	}
	if _, err := Pingpong(ctx, d, oob, a.cfg, stdout); err != nil {
		fmt.Fprintln(stderr, "rocectl pingpong:", err)
		return 1
	}
	return 0
}

// perfFlags are perftest's flags, as far as goroce implements them.
type perfFlags struct {
	fs       *flag.FlagSet
	dev      *string
	size     *int
	iters    *int
	gid      *int
	mtu      *int
	txDepth  *int
	rxDepth  *int
	cqMod    *int
	port     *int
	all      *bool
	events   *bool
	gbits    *bool
	rdmaCM   *bool
	json     *bool
	loopback *bool
	link     *string
	xdpBusy  *time.Duration
	cpuProf  *string
	atomic   *string
	conn     *string
	timeout  *time.Duration
	cc       *string
	shards   *int
	queues   *int
	qps      *int
	duration *int
	runInf   *bool
	duplex   *bool
	noPeak   *bool
	inline   *int
	postList *int
	qpTime   *int
	tos      *int
	metrics  *string
	bind     *string
}

func newPerfFlags(stderr io.Writer) *perfFlags {
	fs := flag.NewFlagSet("perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &perfFlags{fs: fs}
	f.dev = fs.String("d", "", "network `interface` to run RoCEv2 on (perftest: IB device)")
	f.size = fs.Int("s", 0, "message `size` (default 65536 BW, 2 latency)")
	f.iters = fs.Int("n", 0, "number of `iterations` (default 1000)")
	f.gid = fs.Int("x", -1, "local GID `index` (-1: the first IPv4 GID)")
	f.mtu = fs.Int("m", 0, "path `MTU` (default: the port's active MTU)")
	f.txDepth = fs.Int("t", 0, "TX queue `depth` (default 128 BW, 1 latency)")
	f.rxDepth = fs.Int("r", 0, "RX queue `depth` of send tests (default 512)")
	f.cqMod = fs.Int("Q", 0, "request a completion every this many `messages` (default 100)")
	f.port = fs.Int("p", DefaultPort, "TCP `port` of the out-of-band exchange")
	f.all = fs.Bool("a", false, "run sizes from 2 till 2^23")
	f.events = fs.Bool("e", false, "sleep on CQ events (default poll)")
	fs.Bool("F", false, "accepted for perftest compatibility (no CPU frequency check here)")
	f.gbits = fs.Bool("report_gbits", false, "report bandwidth in Gb/s")
	f.rdmaCM = fs.Bool("R", false, "connect QPs with rdma_cm and exchange data over it (IPv4; -p is the rdma_cm port)")
	f.json = fs.Bool("json", false, "print one JSON object per result instead of perftest's text")
	f.loopback = fs.Bool("loopback", false, "run both ends in this process over kernel UDP on 127.0.0.1 (no root needed)")
	f.link = fs.String("link", "auto", "packet `link`: xdp, udp or auto (xdp, falling back to udp)")
	f.xdpBusy = fs.Duration("xdp-busy-poll", 0, xdpBusyPollUsage)
	f.cpuProf = fs.String("cpuprofile", "", "write a CPU profile of the run to `file`")
	f.atomic = fs.String("A", "FETCH_AND_ADD", "atomic `type`: CMP_AND_SWAP or FETCH_AND_ADD")
	f.conn = fs.String("connection", "RC", "connection `type`: RC, or DC between goroce peers (perftest -c)")
	fs.StringVar(f.conn, "c", "RC", "connection `type` (short for --connection)")
	f.timeout = fs.Duration("timeout", 0, "give up after this `duration` (0: never; loopback: 60s, unless --run_infinitely)")
	f.cc = fs.String("cc", "none", ccUsage)
	f.shards = fs.Int("shards", 0, "transmit `shards` of the device (roce.Options.Shards; 0: the default)")
	f.queues = fs.Int("queues", 0, "receive `queues` of the kernel UDP link (udplink.Options.Queues; 0: one)")
	f.qps = fs.Int("q", 1, "`QPs` of a bandwidth test, each posted by its own goroutine; one report for all")
	f.duration = fs.Int("D", 0, "run a bandwidth test for this many `seconds` instead of -n iterations (no peak)")
	f.runInf = fs.Bool("run_infinitely", false, "report every -D seconds (default 5) until interrupted (write, read, atomic BW)")
	f.duplex = fs.Bool("b", false, "bidirectional: both sides run at once and print the sum (write, read, atomic BW)")
	f.noPeak = fs.Bool("N", false, "do not compute the peak bandwidth (reported as 0)")
	f.inline = fs.Int("I", 0, "post messages of up to this many `bytes` (at most 400) inline (send, write): copied at post, not read from the MR")
	f.postList = fs.Int("l", 1, "post this many `WRs` per call (one lock, one transmit pass)")
	f.qpTime = fs.Int("u", defQPTimeout, "QP ACK timeout `exponent`: 4.096 µs × 2^n per retry (0: none)")
	f.tos = fs.Int("T", 0, "IP TOS `byte` (traffic class) of the test QP's packets (perftest: with -R only; here any RC QP)")
	f.bind = fs.String("J", "", "bind the kernel UDP link to this source `address` (perftest's --bind_source_ip), so that two processes on one host each have their own, e.g. 127.0.0.5 and 127.0.0.6 on lo")
	f.metrics = fs.String("metrics", "", "serve Prometheus metrics of the device(s) at `address:port`/metrics while running")
	// perftest's long options, left out of the flag list (aliasUsage).
	for _, a := range perfAliases {
		short := fs.Lookup(a.short)
		fs.Var(short.Value, a.long, aliasUsage+a.short)
	}
	return f
}

// aliasUsage starts the usage of a long option, which printDefaults skips.
const aliasUsage = "same as -"

// perfAliases are perftest's long options of the flags rocectl has.
var perfAliases = []struct{ long, short string }{
	{"ib-dev", "d"}, {"size", "s"}, {"iters", "n"}, {"gid-index", "x"}, {"mtu", "m"}, {"tx-depth", "t"},
	{"rx-depth", "r"}, {"cq-mod", "Q"}, {"port", "p"}, {"all", "a"}, {"events", "e"}, {"CPU-freq", "F"},
	{"rdma_cm", "R"}, {"atomic_type", "A"}, {"qp", "q"}, {"duration", "D"}, {"bidirectional", "b"},
	{"noPeak", "N"}, {"inline_size", "I"}, {"post_list", "l"}, {"qp-timeout", "u"}, {"tos", "T"},
	{"bind_source_ip", "J"},
}

// printDefaults prints the flags but the long aliases, then the aliases
// on one line.
func printDefaults(fs *flag.FlagSet) {
	tmp := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	tmp.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Usage, aliasUsage) {
			tmp.Var(f.Value, f.Name, f.Usage)
			tmp.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	tmp.PrintDefaults()
	var b strings.Builder
	for i, a := range perfAliases {
		switch {
		case i > 0 && i%6 == 0:
			b.WriteString(",\n  ")
		case i > 0:
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "--%s (-%s)", a.long, a.short)
	}
	fmt.Fprintf(fs.Output(), "\nperftest's long forms, also as --name=value:\n  %s\n", b.String())
}

// perfArgs is a perf command line, parsed and validated.
type perfArgs struct {
	f   *perfFlags
	cfg PerfConfig
	pos []string // the server address, if any
}

// parsePerf parses and validates a perf command line without opening
// anything; with a nil result the command ends with the exit status.
func parsePerf(args []string, stdout, stderr io.Writer) (*perfArgs, int) {
	f := newPerfFlags(stderr)
	names := make([]string, 0, len(PerfTests))
	for n := range PerfTests {
		names = append(names, n)
	}
	f.fs.Usage = func() {
		fmt.Fprintln(f.fs.Output(), "usage: rocectl perf <test> [flags] [server]\n\n"+
			"tests: send-bw write-bw read-bw atomic-bw send-lat write-lat read-lat atomic-lat\n\n"+
			"Runs perftest's ib_<test> against perftest or rocectl; without a server address\n"+
			"it waits for a client. --loopback runs both ends here.\n\nflags:")
		printDefaults(f.fs)
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		f.fs.SetOutput(stdout)
		f.fs.Usage()
		return nil, 0
	}
	if len(args) == 0 {
		f.fs.Usage()
		return nil, 2
	}
	test, ok := PerfTests[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rocectl perf: unknown test %q (%s)\n", args[0], strings.Join(sortedNames(), ", "))
		return nil, 2
	}
	pos, err := parseInterspersed(f.fs, args[1:])
	if err != nil {
		return nil, 2
	}
	if len(pos) > 1 {
		f.fs.Usage()
		return nil, 2
	}
	m, err := parseMTU(*f.mtu)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return nil, 2
	}
	cfg := PerfConfig{
		Verb: test.Verb, Latency: test.Latency, Size: *f.size, Iters: *f.iters, TxDepth: *f.txDepth,
		RxDepth: *f.rxDepth, CQMod: *f.cqMod, MTU: m, GIDIndex: *f.gid, Events: *f.events,
		Gbits: *f.gbits, RunAll: *f.all, Device: *f.dev, RDMACM: *f.rdmaCM,
		NumQPs: *f.qps, Duration: time.Duration(*f.duration) * time.Second, RunInfinitely: *f.runInf,
		Duplex: *f.duplex, NoPeak: *f.noPeak, Inline: *f.inline, PostList: *f.postList,
		QPTimeout: *f.qpTime, TOS: *f.tos,
	}
	set := setFlags(f.fs)
	cfg.HasTOS = set["T"] || set["tos"]
	if cfg.QPTimeout == 0 {
		cfg.QPTimeout = -1 // -u 0: no timeout; PerfConfig's 0 is the default
	}
	// Everything checkable without a device is checked here, so that the
	// command fails before it opens anything.
	check := cfg
	if err := check.defaults(); err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return nil, 2
	}
	switch strings.ToUpper(*f.conn) {
	case "RC":
	case "DC":
		cfg.DC = true
	default:
		fmt.Fprintf(stderr, "rocectl perf: --connection %q: RC or DC\n", *f.conn)
		return nil, 2
	}
	switch *f.atomic {
	case "FETCH_AND_ADD":
		cfg.AtomicOp = perftest.FetchAndAdd
	case "CMP_AND_SWAP":
		cfg.AtomicOp = perftest.CmpAndSwap
	default:
		fmt.Fprintf(stderr, "rocectl perf: -A %q: CMP_AND_SWAP or FETCH_AND_ADD\n", *f.atomic)
		return nil, 2
	}
	if _, err := parseCC(*f.cc); err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return nil, 2
	}
	if _, err := parseBind(*f.bind); err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return nil, 2
	}
	cfg.CC, _ = parseCC(*f.cc) // checked above
	if *f.shards < 0 {
		fmt.Fprintln(stderr, "rocectl perf: --shards must not be negative")
		return nil, 2
	}
	cfg.Shards = *f.shards
	if *f.queues < 0 {
		fmt.Fprintln(stderr, "rocectl perf: --queues must not be negative")
		return nil, 2
	}
	cfg.Queues = *f.queues
	if *f.loopback {
		if len(pos) > 0 {
			fmt.Fprintln(stderr, "rocectl perf: --loopback takes no server address")
			return nil, 2
		}
		// Both ends run here and exchange nothing over TCP: a port asked
		// for would be ignored without a word.
		if setFlags(f.fs)["p"] {
			fmt.Fprintln(stderr, "rocectl perf: --loopback takes no -p (both ends run in this process, over no TCP port)")
			return nil, 2
		}
	}
	return &perfArgs{f: f, cfg: cfg, pos: pos}, 0
}

// RunPerf is "rocectl perf {send,write,read,atomic}-{bw,lat} [flags] [server]".
func RunPerf(args []string, stdout, stderr io.Writer) int {
	return RunPerfStats(args, stdout, stderr, nil)
}

// RunPerfStats is RunPerf publishing its device(s) with stats; with
// --loopback both ends are published and --metrics serves the server's.
func RunPerfStats(args []string, stdout, stderr io.Writer, stats StartStats) int {
	p, code := parsePerf(args, stdout, stderr)
	if p == nil {
		return code
	}
	f, cfg, pos := p.f, p.cfg, p.pos
	if *f.loopback {
		timeout := *f.timeout
		if timeout == 0 && !cfg.RunInfinitely {
			timeout = time.Minute
		}
		ctx, cancel := signalContext(timeout)
		defer cancel()
		stopProf, err := startCPUProfile(*f.cpuProf)
		if err != nil {
			fmt.Fprintln(stderr, "rocectl perf: --cpuprofile:", err)
			return 1
		}
		defer stopProf()
		var hook func(*roce.Device, bool) (func(), error)
		if stats != nil {
			hook = func(d *roce.Device, server bool) (func(), error) {
				m := ""
				if server {
					m = *f.metrics
				}
				return stats(d, "perf", m)
			}
		}
		if _, _, err := loopback(ctx, cfg, stdout, *f.json, hook); err != nil {
			fmt.Fprintln(stderr, "rocectl perf:", err)
			return 1
		}
		return 0
	}
	ctx, cancel := signalContext(*f.timeout)
	defer cancel()
	cc, _ := parseCC(*f.cc) // checked by parsePerf
	bind, _ := parseBind(*f.bind)
	d, err := openDeviceCC(ctx, *f.dev, *f.link, *f.xdpBusy, cc, *f.shards, *f.queues, bind, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return 1
	}
	defer d.Close()
	stopStats, err := startStats(stats, d, "perf", *f.metrics)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return 1
	}
	defer stopStats()
	stopProf, err := startCPUProfile(*f.cpuProf)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl perf: --cpuprofile:", err)
		return 1
	}
	defer stopProf()
	var oob OOB
	switch {
	case *f.rdmaCM && len(pos) == 1:
		a, err := resolveIPv4(ctx, pos[0])
		if err != nil {
			fmt.Fprintln(stderr, "rocectl perf:", err)
			return 1
		}
		oob.RDMACM = &RDMACM{Peer: netip.AddrPortFrom(a, uint16(*f.port))}
	case *f.rdmaCM:
		oob.RDMACM = &RDMACM{Listen: netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(*f.port))}
	case len(pos) == 1:
		oob.Dial = DialRetry(peerAddr(pos[0], *f.port), 0)
	default:
		if oob.Listener, err = ListenOOB(*f.port); err != nil {
			fmt.Fprintln(stderr, "rocectl perf: Couldn't listen to port", *f.port, err)
			return 1
		}
		defer oob.Listener.Close()
	}
	if _, err := Perf(ctx, d, oob, cfg, stdout, *f.json); err != nil {
		fmt.Fprintln(stderr, "rocectl perf:", err)
		return 1
	}
	return 0
}

// setFlags is the set of flags the user gave.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// resolveIPv4 returns host's IPv4 address: perftest's rdma_cm mode
// resolves with AF_INET only.
func resolveIPv4(ctx context.Context, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		if a = a.Unmap(); !a.Is4() {
			return netip.Addr{}, fmt.Errorf("-R: %v is not an IPv4 address (perftest's rdma_cm mode is IPv4 only)", a)
		}
		return a, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("%s: no IPv4 address", host)
	}
	return addrs[0].Unmap(), nil
}

func sortedNames() []string {
	return []string{"send-bw", "write-bw", "read-bw", "atomic-bw", "send-lat", "write-lat", "read-lat", "atomic-lat"}
}
