package main

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
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
	"github.com/goroce/goroce/rsocket/rcopy"
	"github.com/goroce/goroce/rsocket/riostream"
	"github.com/goroce/goroce/rsocket/rstream"
)

func init() {
	register("rstream", command{
		summary: "rdma-core rstream compatible stream test over rsockets, either role",
		run:     runRstream,
	})
	register("riostream", command{
		summary: "rdma-core riostream compatible riomap/riowrite test over rsockets, either role",
		run:     runRiostream,
	})
	register("rcopy", command{
		summary: "rdma-core rcopy compatible file copy over rsockets, either role",
		run:     runRcopy,
	})
}

// rsFlags are the goroce-only flags of the rsocket tools: where to run.
type rsFlags struct {
	ifname  *string
	link    *string
	metrics *string
}

func addRSFlags(fs *flag.FlagSet) rsFlags {
	return rsFlags{
		ifname:  fs.String("d", "", "goroce: network `interface` to run RoCEv2 on (default: the one owning -b, or routing to the server)"),
		link:    fs.String("link", "auto", "goroce: packet `link`: xdp, udp or auto"),
		metrics: fs.String("metrics", "", "goroce: "+devstat.MetricsUsage),
	}
}

// open opens the goroce device for a tool whose address is a (the server
// to reach, or the address to bind; unspecified for a server bound to
// any address). The kernel UDP link binds local when it is given (a
// client's -b), a server's own address otherwise, so that two processes on
// one host, each on its own 127.0.0.x, can talk.
func (f rsFlags) open(ctx context.Context, a netip.Addr, server bool, local netip.Addr, stderr io.Writer) (*roce.Device, error) {
	name := *f.ifname
	if name == "" {
		var err error
		if name, err = rpingInterface(a, server); err != nil {
			return nil, fmt.Errorf("%v (name the interface with -d)", err)
		}
	}
	var kind netdev.LinkKind
	switch *f.link {
	case "auto":
	case "xdp":
		kind = netdev.LinkXDP
	case "udp":
		kind = netdev.LinkUDP
	default:
		return nil, fmt.Errorf("unknown link %q (udp, xdp or auto)", *f.link)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if server && !local.IsValid() && !a.IsUnspecified() {
		local = a
	}
	return netdev.Open(ctx, name, netdev.Options{Link: kind, UDPAddr: local, Device: roce.Options{Logger: logger}})
}

// localAddr is a client's -b address (invalid when not given).
func (s *streamFlags) localAddr(server bool) (netip.Addr, error) {
	if server || *s.bind == "" {
		return netip.Addr{}, nil
	}
	a, err := lookup(*s.bind, s.v6)
	if err != nil {
		return a, fmt.Errorf("getaddrinfo: %v", err)
	}
	return a, nil
}

// lookup resolves a tool's host argument as getaddrinfo would.
func lookup(host string, v6 bool) (netip.Addr, error) {
	if host == "" {
		return netip.IPv4Unspecified(), nil
	}
	netw := "ip"
	if v6 {
		netw = "ip6"
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), netw, host)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(ips) == 0 {
		return netip.Addr{}, errors.New("no address")
	}
	return ips[0].Unmap(), nil
}

// streamFlags are the options rstream and riostream share.
type streamFlags struct {
	dst, bind, format, port, size *string
	buffer, inline, iters, count  *int
	keepalive                     *int
	verify, sockets, custom, v6   bool
	sizeAll                       bool
	testOpts                      []string
	setI, setC, setS              bool
}

func addStreamFlags(fs *flag.FlagSet, rstreamTool bool) *streamFlags {
	s := &streamFlags{
		dst:    fs.String("s", "", "server `address` (client side; without -s this is the server)"),
		bind:   fs.String("b", "", "bind `address`"),
		format: fs.String("f", "", "address `format`: name, ip, ipv6 (gid is not supported)"),
		buffer: fs.Int("B", 0, "`buffer_size` for SO_SNDBUF/SO_RCVBUF (default 512 KiB)"),
		inline: fs.Int("i", 64, "`inline_size` of the latency series"),
		iters:  fs.Int("I", 1, "`iterations` (a custom run)"),
		count:  fs.Int("C", 1000, "`transfer_count` (a custom run)"),
		size:   fs.String("S", "", "`transfer_size` (a custom run, default 1000) or all (every size of the series)"),
		port:   fs.String("p", rstream.DefaultPort, "`port_number`"),
	}
	if rstreamTool {
		s.keepalive = fs.Int("k", 0, "`keepalive_time` in seconds (SO_KEEPALIVE, TCP_KEEPIDLE)")
	}
	fs.Func("T", "`test_option`: s|sockets (kernel TCP, rstream only), a|async, b|blocking, n|nonblocking, r|resolve, v|verify; f|fork is not supported", func(v string) error {
		s.testOpts = append(s.testOpts, v)
		return nil
	})
	return s
}

func (s *streamFlags) parse(fs *flag.FlagSet, rstreamTool bool) error {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "I":
			s.setI = true
		case "C":
			s.setC = true
		case "S":
			s.setS = true
		}
	})
	s.custom = s.setI || s.setC
	if s.setS {
		if strings.HasPrefix(strings.ToLower(*s.size), "all") {
			s.sizeAll = true
		} else {
			s.custom = true
		}
	}
	switch f := strings.ToLower(*s.format); {
	case f == "":
	case strings.HasPrefix(f, "gid"):
		return errors.New("-f gid (AF_IB) is not supported")
	case f == "ipv6":
		s.v6 = true
	case strings.HasPrefix(f, "ip"), f == "name":
	default:
		fmt.Fprintln(fs.Output(), "Warning: unknown address format")
	}
	for _, t := range s.testOpts {
		switch strings.ToLower(t) {
		case "s", "sockets", "socket":
			if !rstreamTool {
				return fmt.Errorf("unknown test option %q", t)
			}
			s.sockets = true
		case "a", "async", "b", "blocking", "block", "n", "nonblocking", "nonblock", "r", "resolve":
			// Polling styles and address resolution of the C tool: the Go
			// calls block with deadlines, addresses resolve the same way.
		case "v", "verify":
			s.verify = true
		case "f", "fork":
			return errors.New("-T f (fork) is not supported")
		default:
			return fmt.Errorf("unknown test option %q", t)
		}
	}
	return nil
}

func (s *streamFlags) sizeValue() int {
	if !s.setS || s.sizeAll {
		return 0
	}
	n, _ := strconv.Atoi(*s.size)
	return n
}

// hostAddr is the address deciding the interface and family.
func (s *streamFlags) hostAddr() (netip.Addr, bool, error) {
	server := *s.dst == ""
	host := *s.dst
	if server {
		host = *s.bind
	}
	a, err := lookup(host, s.v6)
	if err != nil {
		return a, server, fmt.Errorf("getaddrinfo: %v", err)
	}
	if !s.v6 && a.Is6() && !a.IsUnspecified() {
		s.v6 = true
	}
	return a, server, nil
}

func streamUsage(fs *flag.FlagSet, name string) func() {
	return func() {
		fmt.Fprintf(fs.Output(), "usage: rocectl %s [-s server_address] [-b bind_address] [-f address_format]\n"+
			"       [-B buffer_size] [-i inline_size] [-I iterations] [-C transfer_count]\n"+
			"       [-S transfer_size or all] [-p port_number]", name)
		if name == "rstream" {
			fmt.Fprint(fs.Output(), " [-k keepalive_time]")
		}
		fmt.Fprintf(fs.Output(), " [-T test_option]... [-d interface] [-link kind]\n\n"+
			"rdma-core's %s over goroce rsockets: the same protocol, options, defaults and\n"+
			"output; either end may be the real tool. Not supported: -f gid, -T f.\n\nflags:\n", name)
		fs.PrintDefaults()
	}
}

// runRstream is "rocectl rstream", flag-compatible with rdma-core's rstream.
func runRstream(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = streamUsage(fs, "rstream")
	sf := addStreamFlags(fs, true)
	rf := addRSFlags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := sf.parse(fs, true); err != nil || fs.NArg() != 0 {
		if err != nil {
			fmt.Fprintln(stderr, "rocectl rstream:", err)
		}
		fs.Usage()
		return 2
	}
	a, server, err := sf.hostAddr()
	if err != nil {
		fmt.Fprintln(stdout, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	local, err := sf.localAddr(server)
	if err != nil {
		fmt.Fprintln(stdout, err)
		return 1
	}
	var dev *roce.Device
	if !sf.sockets {
		if dev, err = rf.open(ctx, a, server, local, stderr); err != nil {
			fmt.Fprintln(stderr, "rocectl rstream:", err)
			return 1
		}
		defer dev.Close()
		stopStats, err := devstat.Start(dev, devstat.Options{Command: "rstream", Metrics: *rf.metrics, Registry: rsocketMetrics()}, stderr)
		if err != nil {
			fmt.Fprintln(stderr, "rocectl rstream:", err)
			return 1
		}
		defer stopStats()
	}
	cfg := rstream.Config{Server: server, Dst: *sf.dst, Bind: *sf.bind, Port: *sf.port, BufferSize: *sf.buffer,
		InlineSize: *sf.inline, Iterations: *sf.iters, Count: *sf.count, Size: sf.sizeValue(), SizeAll: sf.sizeAll,
		Custom: sf.custom, Keepalive: *sf.keepalive, Verify: sf.verify, Sockets: sf.sockets, IPv6: sf.v6, Out: stdout}
	if cfg.InlineSize == 0 {
		cfg.InlineSize = -1
	}
	if err := rstream.Run(ctx, dev, cfg); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// runRiostream is "rocectl riostream", flag-compatible with rdma-core's
// riostream.
func runRiostream(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("riostream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = streamUsage(fs, "riostream")
	sf := addStreamFlags(fs, false)
	rf := addRSFlags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := sf.parse(fs, false); err != nil || fs.NArg() != 0 {
		if err != nil {
			fmt.Fprintln(stderr, "rocectl riostream:", err)
		}
		fs.Usage()
		return 2
	}
	a, server, err := sf.hostAddr()
	if err != nil {
		fmt.Fprintln(stdout, err)
		return 1
	}
	local, err := sf.localAddr(server)
	if err != nil {
		fmt.Fprintln(stdout, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dev, err := rf.open(ctx, a, server, local, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl riostream:", err)
		return 1
	}
	defer dev.Close()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "riostream", Metrics: *rf.metrics, Registry: rsocketMetrics()}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl riostream:", err)
		return 1
	}
	defer stopStats()
	cfg := riostream.Config{Server: server, Dst: *sf.dst, Bind: *sf.bind, Port: *sf.port, BufferSize: *sf.buffer,
		InlineSize: *sf.inline, Iterations: *sf.iters, Count: *sf.count, Size: sf.sizeValue(), SizeAll: sf.sizeAll,
		Custom: sf.custom, Verify: sf.verify, IPv6: sf.v6, Out: stdout}
	if cfg.InlineSize == 0 {
		cfg.InlineSize = -1
	}
	if err := riostream.Run(ctx, dev, cfg); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// runRcopy is "rocectl rcopy": without arguments (or with only options) the
// server, else "rcopy source server[:destination] [-p port]".
func runRcopy(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rcopy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage 1: rocectl rcopy [options]\n\t     starts the server application\n"+
			"usage 2: rocectl rcopy source server[:destination] [options]\n"+
			"\t     source - file name and path\n\t     server - name or address\n\t     destination - file name and path\n\n"+
			"rdma-core's rcopy over goroce rsockets; either end may be the real tool.\n\noptions:\n")
		fs.PrintDefaults()
	}
	port := fs.String("p", rcopy.DefaultPort, "`port_number`")
	rf := addRSFlags(fs)
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	// Without operands the server, else source and server[:destination],
	// with the options before, between or after them.
	server := fs.NArg() == 0
	var src, host, dst string
	if !server {
		if fs.NArg() != 2 {
			fs.Usage()
			return 2
		}
		src, host = fs.Arg(0), fs.Arg(1)
		// As rcopy: the destination follows the first ':' (so no IPv6
		// literals), and defaults to the source's name.
		if i := strings.IndexByte(host, ':'); i >= 0 {
			host, dst = host[:i], host[i+1:]
		} else {
			dst = src
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	a := netip.IPv4Unspecified()
	if !server {
		var err error
		if a, err = lookup(host, false); err != nil {
			fmt.Fprintf(stdout, "getaddrinfo failed: %v\n", err)
			return 1
		}
	}
	dev, err := rf.open(ctx, a, server, netip.Addr{}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl rcopy:", err)
		return 1
	}
	defer dev.Close()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "rcopy", Metrics: *rf.metrics, Registry: rsocketMetrics()}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl rcopy:", err)
		return 1
	}
	defer stopStats()
	if server {
		s := &rcopy.Server{Dev: dev, Port: *port, Out: stdout}
		if err := s.Run(ctx); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	if err := rcopy.Copy(ctx, dev, src, a.String(), dst, *port, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// rsocketMetrics is a registry of package rsocket's counters
// (rsocket.ReadStats), read at each scrape.
func rsocketMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	st := func(get func(rsocket.Stats) uint64) func() uint64 {
		return func() uint64 { return get(rsocket.ReadStats()) }
	}
	devstat.CounterFuncs(reg, "rsocket_", map[string]func() uint64{
		"rejected_version":   st(func(s rsocket.Stats) uint64 { return s.RejectedVersion }),
		"rejected_conn_data": st(func(s rsocket.Stats) uint64 { return s.RejectedConnData }),
		"protocol_errors":    st(func(s rsocket.Stats) uint64 { return s.ProtocolErrors }),
		"close_timeouts":     st(func(s rsocket.Stats) uint64 { return s.CloseTimeouts }),
		"handshake_timeouts": st(func(s rsocket.Stats) uint64 { return s.HandshakeTimeouts }),
	}, map[string]string{
		"rejected_version":   "Connection requests refused for an rs_conn_data version other than 1.",
		"rejected_conn_data": "Connection requests refused for malformed rs_conn_data.",
		"protocol_errors":    "Connections ended because the peer broke the protocol.",
		"close_timeouts":     "Closes that stopped waiting for the peer's DISCONNECT acknowledgement.",
		"handshake_timeouts": "Accept handshakes abandoned (the peer never sent its RTU).",
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "rsocket_connections",
		Help: "rsocket connections open."}, func() float64 { return float64(rsocket.ReadStats().Conns) }))
	return reg
}
