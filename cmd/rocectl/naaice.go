package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func init() {
	register("naaice", command{
		summary: "NAAICE software NAA (serve) or verifying client (call), as the C library's examples",
		run:     runNAAICE,
	})
}

func runNAAICE(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			return naaiceServe(args[1:], stdout, stderr)
		case "call":
			return naaiceCall(args[1:], stdout, stderr)
		case "-h", "-help", "--help":
			naaiceUsage(stdout)
			return 0
		}
	}
	naaiceUsage(stderr)
	return 2
}

func naaiceUsage(w io.Writer) {
	fmt.Fprintln(w, `usage: rocectl naaice serve [-d IFACE] [-a ADDR] [-p PORT] [-rpcs N] [-link udp|xdp|auto]
       rocectl naaice call [flags] [local-ip] remote-ip N "size1 size2 ..."

serve is a software NAA with the C library's example routines (function
code 1 adds 1 to every byte of every region, 2 adds 2, 3 does nothing) on
the C server's port 12345.

call runs the C example client's RPC: N regions, all inputs, the last one
the output, region 0 single-send when N > 1 with only 2 bytes written in the
first RPC, region i holding the byte 10+i. It checks every byte of the
result after every RPC and ends with a line saying whether the result was
verified; the exit status says the same (0 verified, 1 not).

run 'rocectl naaice serve -h' or 'rocectl naaice call -h' for the flags`)
}

func naaiceLink(s string) (netdev.LinkKind, error) {
	switch s {
	case "auto":
		return 0, nil
	case "xdp":
		return netdev.LinkXDP, nil
	case "udp":
		return netdev.LinkUDP, nil
	}
	return 0, fmt.Errorf("unknown link %q (udp, xdp or auto)", s)
}

func naaiceOpen(ctx context.Context, ifname string, a netip.Addr, server bool, link string, stderr io.Writer) (*roce.Device, error) {
	kind, err := naaiceLink(link)
	if err != nil {
		return nil, err
	}
	if ifname == "" {
		if ifname, err = rpingInterface(a, server); err != nil {
			return nil, err
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return netdev.Open(ctx, ifname, netdev.Options{Link: kind, Device: roce.Options{Logger: logger}})
}

func naaiceServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("naaice serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ifname := fs.String("d", "", "network `interface` (default: the one owning -a)")
	fs.StringVar(ifname, "i", "", "network `interface` (alias of -d)")
	addr := fs.String("a", "", "`address` to listen on (default: any address of -i)")
	port := fs.Int("p", mrsp.ServerPort, "rdma_cm `port`")
	rpcs := fs.Uint64("rpcs", 0, "exit after `N` RPCs were served (0: until interrupted)")
	conns := fs.Int("conns", 16, "`connections` served at once")
	link := fs.String("link", "auto", "packet `link`: xdp, udp or auto")
	metrics := fs.String("metrics", "", devstat.MetricsUsage)
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 || *port <= 0 || *port > 0xFFFF || (*ifname == "" && *addr == "") {
		fmt.Fprintln(stderr, "rocectl naaice serve: needs -d or -a, and no arguments")
		return 2
	}
	a := netip.IPv4Unspecified()
	if *addr != "" {
		var err error
		if a, err = netip.ParseAddr(*addr); err != nil {
			fmt.Fprintln(stderr, "rocectl naaice serve:", err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dev, err := naaiceOpen(ctx, *ifname, a, true, *link, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl naaice serve:", err)
		return 1
	}
	defer dev.Close()
	reg := prometheus.NewRegistry()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "naaice serve", Metrics: *metrics, Registry: reg}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl naaice serve:", err)
		return 1
	}
	defer stopStats()
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := naaice.NewServer(dev, naaice.ServerOptions{MaxConns: *conns, Logger: logger})
	naaice.ExampleRoutines(srv)
	naaiceMetrics(reg, srv)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if *rpcs > 0 {
		go func() {
			for sctx.Err() == nil {
				if srv.Counters().RPCs >= *rpcs {
					// Let the last write-back and the host's DREQ finish.
					time.Sleep(500 * time.Millisecond)
					cancel()
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	ap := netip.AddrPortFrom(a, uint16(*port))
	fmt.Fprintf(stdout, "naaice: software NAA listening on %v\n", ap)
	err = srv.ListenAndServe(sctx, ap)
	c := srv.Counters()
	fmt.Fprintf(stdout, "naaice: served %d connections, %d RPCs (%d with errors), %d MRSP errors, %d rejected\n",
		c.Accepted, c.RPCs, c.RPCErrors, c.MRSPErrors, c.Rejected)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "rocectl naaice serve:", err)
		return 1
	}
	return 0
}

// naaiceExample returns what routine fn adds per RPC, and whether it is
// one of the examples.
func naaiceExample(fn int) (byte, bool) {
	switch fn {
	case 1, 2:
		return byte(fn), true
	case 3:
		return 0, true
	}
	return 0, false
}

func naaiceCall(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("naaice call", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: rocectl naaice call [flags] [local-ip] remote-ip N "size1 size2 ..."`)
		fs.PrintDefaults()
	}
	fn := fs.Int("f", 3, "function `code` (1 adds 1, 2 adds 2, 3 does nothing)")
	rpcs := fs.Int("n", 1, "`RPCs` on the connection")
	port := fs.Int("p", mrsp.ServerPort, "the NAA's rdma_cm `port`")
	pause := fs.Duration("pause", 0, "pause before each RPC (the C software NAA loses a wake-up when a host is fast)")
	ifname := fs.String("d", "", "network `interface` (default: the route to remote-ip)")
	fs.StringVar(ifname, "i", "", "network `interface` (alias of -d)")
	link := fs.String("link", "auto", "packet `link`: xdp, udp or auto")
	metrics := fs.String("metrics", "", devstat.MetricsUsage)
	timeout := fs.Duration("t", 2*time.Minute, "give up after this `duration`")
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	pos := fs.Args()
	if len(pos) != 3 && len(pos) != 4 {
		fs.Usage()
		return 2
	}
	var local netip.Addr
	if len(pos) == 4 {
		var err error
		if local, err = netip.ParseAddr(pos[0]); err != nil {
			fmt.Fprintln(stderr, "rocectl naaice call: local address:", err)
			return 2
		}
		pos = pos[1:]
	}
	remote, err := netip.ParseAddr(pos[0])
	n, nerr := strconv.Atoi(pos[1])
	if err != nil || nerr != nil || n < 1 || n > mrsp.MaxAAREntries || *rpcs < 1 || *fn < 1 || *fn > 127 {
		fs.Usage()
		return 2
	}
	fields := strings.Fields(pos[2])
	if len(fields) < n {
		fmt.Fprintln(stderr, "rocectl naaice call: fewer sizes than regions")
		return 2
	}
	// Every size is checked, and their sum, before any region is made.
	sizes := make([]int, n)
	var total uint64
	for i := range sizes {
		s, err := strconv.Atoi(fields[i])
		if err != nil || s < 1 || s > 1<<30 {
			fmt.Fprintf(stderr, "rocectl naaice call: bad size %q (1 … %d)\n", fields[i], 1<<30)
			return 2
		}
		sizes[i], total = s, total+uint64(s)
	}
	if err := cliflag.CheckMemory(total); err != nil {
		fmt.Fprintf(stderr, "rocectl naaice call: sizes %s: their sum %v\n", strings.Join(fields[:n], " "), err)
		return 2
	}
	params := make([][]byte, n)
	for i, s := range sizes {
		params[i] = make([]byte, s)
		for j := range params[i] {
			params[i][j] = byte(10 + i)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	dev, err := naaiceOpen(ctx, *ifname, remote, false, *link, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl naaice call:", err)
		return 1
	}
	defer dev.Close()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "naaice call", Metrics: *metrics}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl naaice call:", err)
		return 1
	}
	defer stopStats()
	err = naaiceRun(ctx, dev, local, netip.AddrPortFrom(remote, uint16(*port)), params, uint8(*fn), *rpcs, *pause, stdout)
	desc := fmt.Sprintf("%d RPCs of function %d on %d regions (%s)", *rpcs, *fn, n, strings.Join(fields[:n], " "))
	if err != nil {
		fmt.Fprintf(stdout, "NOT verified: %s: %v\n", desc, err)
		return 1
	}
	fmt.Fprintf(stdout, "verified: %s\n", desc)
	return 0
}

// naaiceRun is the C example client's RPC with every byte checked.
func naaiceRun(ctx context.Context, dev *roce.Device, local netip.Addr, remote netip.AddrPort, params [][]byte, fn uint8, rpcs int, pause time.Duration, stdout io.Writer) error {
	add, known := naaiceExample(int(fn))
	n := len(params)
	c, err := naaice.NewContext(dev, remote, params, nil, fn, naaice.Options{LocalAddr: local})
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < n; i++ {
		_ = c.SetInput(i)
	}
	_ = c.SetOutput(n - 1)
	if n > 1 {
		_ = c.SetSingleSend(0)
		_ = c.SetBytesToSend(0, 2)
	}
	if err := c.Connect(ctx); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := c.DoMRSP(ctx); err != nil {
		return fmt.Errorf("MRSP: %w", err)
	}
	for r := 0; r < rpcs; r++ {
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := c.DoRPC(ctx); err != nil {
			return fmt.Errorf("RPC %d: %w", r+1, err)
		}
		_ = c.SetBytesToSend(0, -1)
		if !known {
			continue
		}
		// The output comes back with the routine applied to what the host
		// sent, which was the previous result.
		want := byte(10+n-1) + add*byte(r+1)
		for i, p := range params {
			w := byte(10 + i)
			if i == n-1 {
				w = want
			}
			for j, b := range p {
				if b != w {
					return fmt.Errorf("after RPC %d: region %d byte %d is %d, want %d", r+1, i, j, b, w)
				}
			}
		}
	}
	last := params[n-1]
	fmt.Fprintf(stdout, "Output of the last MR: % d\n", last[:min(len(last), 11)])
	if !known {
		return fmt.Errorf("function code %d is not one of the examples: nothing to check against", fn)
	}
	// Close sends the DREQ without waiting for the answer, as the C host's
	// rdma_disconnect does: the C software NAA never sends a DREP.
	return nil
}

// naaiceMetrics registers the software NAA's counters in reg, read from
// srv.Counters at each scrape.
func naaiceMetrics(reg *prometheus.Registry, srv *naaice.Server) {
	ctr := func(get func(naaice.ServerCounters) uint64) func() uint64 {
		return func() uint64 { return get(srv.Counters()) }
	}
	devstat.CounterFuncs(reg, "naaice_server_", map[string]func() uint64{
		"accepted":          ctr(func(c naaice.ServerCounters) uint64 { return c.Accepted }),
		"rejected":          ctr(func(c naaice.ServerCounters) uint64 { return c.Rejected }),
		"rpcs":              ctr(func(c naaice.ServerCounters) uint64 { return c.RPCs }),
		"rpc_errors":        ctr(func(c naaice.ServerCounters) uint64 { return c.RPCErrors }),
		"mrsp_errors":       ctr(func(c naaice.ServerCounters) uint64 { return c.MRSPErrors }),
		"unknown_function":  ctr(func(c naaice.ServerCounters) uint64 { return c.UnknownFunction }),
		"host_aborts":       ctr(func(c naaice.ServerCounters) uint64 { return c.HostAborts }),
		"out_of_order":      ctr(func(c naaice.ServerCounters) uint64 { return c.OutOfOrder }),
		"completion_errors": ctr(func(c naaice.ServerCounters) uint64 { return c.CompletionErrors }),
		"disconnects":       ctr(func(c naaice.ServerCounters) uint64 { return c.Disconnects }),
		"idle_timeouts":     ctr(func(c naaice.ServerCounters) uint64 { return c.IdleTimeouts }),
		"idle_evicted":      ctr(func(c naaice.ServerCounters) uint64 { return c.IdleEvicted }),
	}, map[string]string{
		"accepted": "Connections accepted.", "rejected": "Connections rejected.",
		"rpcs": "RPCs completed.", "rpc_errors": "RPCs completed with a non-zero code.",
		"mrsp_errors": "AARs answered with an MRSP error.", "unknown_function": "RPCs with no routine.",
		"host_aborts": "Host error writes.", "out_of_order": "Messages or completions the state did not allow.",
		"completion_errors": "Failed work completions.", "disconnects": "Hosts that left during an MRSP or RPC.",
		"idle_timeouts": "Connections closed for idling.", "idle_evicted": "Idle connections closed to admit a new one.",
	})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "naaice_server_active_connections",
		Help: "Connections being served."}, func() float64 { return float64(srv.Counters().Active) }))
}
