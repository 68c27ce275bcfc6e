package fpgacmd

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
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// Run is "rocectl fpga recv|send [flags]"; it returns the exit status.
func Run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "recv" && args[0] != "send") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			usage(stdout)
			return 0
		}
		usage(stderr)
		return 2
	}
	return run(args[0], args[1:], os.Stdin, stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rocectl fpga recv -d interface [flags]   (Rogue RoCEv2 receive server)\n"+
		"       rocectl fpga send -d interface [flags]   (FPGA emulator)\n\n"+
		"Each prints its connection values as one JSON line and takes the other side's\n"+
		"from flags (-peer-qpn, -peer-gid, ...) or one JSON line on stdin; a final JSON\n"+
		"line reports frames, bytes, RNR NAKs and errors. 'rocectl fpga recv -h' lists flags.")
}

// openFunc opens the device; tests replace it.
var openFunc = func(ctx context.Context, ifname string, kind netdev.LinkKind, log *slog.Logger) (*roce.Device, error) {
	return netdev.Open(ctx, ifname, netdev.Options{Link: kind, Device: roce.Options{Logger: log}})
}

func run(mode string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fpga "+mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	ifname := fs.String("d", "", "network `interface` to run RoCEv2 on")
	fs.StringVar(ifname, "i", "", "network `interface` (alias of -d)")
	link := fs.String("link", "auto", "packet `link`: xdp, udp or auto")
	metrics := fs.String("metrics", "", devstat.MetricsUsage)
	pmtu := fs.Int("pmtu", 0, "path MTU in `bytes` (256..4096; 0: the port's active MTU)")
	write := fs.Bool("write", false, "gen-1 data path: RDMA WRITE WITH IMMEDIATE (recv: accept only it)")
	count := fs.Uint64("count", 0, "`frames` to send or receive (0: until interrupted)")
	timeout := fs.Duration("timeout", 0, "give up after this `duration` (0: never)")
	peerQPN := fs.Uint("peer-qpn", 0, "the other side's `QPN` (instead of its JSON line on stdin)")
	peerGID := fs.String("peer-gid", "", "the other side's GID or IP `address`")
	peerRq := fs.Uint("peer-rq-psn", 0, "the other side's RQ `PSN`")
	peerSq := fs.Uint("peer-sq-psn", 0, "the other side's SQ `PSN`")
	var (
		gidIndex, maxPayload, depth *int
		fpgaIP                      *string
		rnr                         *uint
		verify, send                *bool
		idle, hold                  *time.Duration
		out                         *string
		size                        *int
		rate                        *float64
		channel, retry              *uint
		mrAddr                      *uint64
		mrKey                       *uint
	)
	if mode == "recv" {
		gidIndex = fs.Int("gid-index", -1, "host GID `index` (-1: the one on the FPGA's subnet, or the first IPv4 GID)")
		fpgaIP = fs.String("fpga-ip", "", "the FPGA's IP `address` (picks the host GID as PyRogue does)")
		maxPayload = fs.Int("max-payload", fpgaDefaultPayload, "slot size in `bytes`")
		depth = fs.Int("depth", 256, "receive `slots`")
		rnr = fs.Uint("rnr-timer", 1, "min RNR timer `code` (1 = 0.01 ms, 12 = 0.64 ms, 14 = 1 ms)")
		verify = fs.Bool("verify", false, "check the emulator's payload pattern")
		send = fs.Bool("send", false, "accept only the gen-2 data path (SEND WITH IMMEDIATE)")
		idle = fs.Duration("idle", 0, "stop when no frame came for this `duration` after the first")
		hold = fs.Duration("hold", 0, "keep each frame this `duration` before releasing it (a slow consumer)")
		out = fs.String("o", "", "write the frames' payloads to this `file`")
	} else {
		size = fs.Int("size", 4096, "frame size in `bytes` (at most the PMTU)")
		rate = fs.Float64("rate", 0, "`rate` in frames per second (0: as fast as the host takes them)")
		channel = fs.Uint("channel", 1, "`channel` (low byte of the immediate)")
		retry = fs.Uint("retry", 7, "transport retry `count` (7: forever; the firmware uses 3)")
		mrAddr = fs.Uint64("peer-mr-addr", 0, "gen 1: the host's MR `address`")
		mrKey = fs.Uint("peer-mr-rkey", 0, "gen 1: the host's MR `rkey`")
		maxPayload = fs.Int("peer-max-payload", 0, "gen 1: the host's slot size in `bytes`")
		depth = fs.Int("peer-depth", 0, "gen 1: the host's slot `count`")
	}
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	mtu, ok := ib.MTUFromBytes(*pmtu)
	if *pmtu == 0 {
		mtu, ok = 0, true
	}
	if fs.NArg() != 0 || !ok {
		fs.Usage()
		return 2
	}
	var kind netdev.LinkKind
	switch *link {
	case "auto":
	case "xdp":
		kind = netdev.LinkXDP
	case "udp":
		kind = netdev.LinkUDP
	default:
		fmt.Fprintf(stderr, "rocectl fpga: unknown link %q (udp, xdp or auto)\n", *link)
		return 2
	}
	var peer *Params
	if *peerGID != "" {
		peer = &Params{QPN: uint32(*peerQPN), GID: *peerGID, RqPSN: uint32(*peerRq), SqPSN: uint32(*peerSq)}
		if mode == "send" {
			peer.MRAddr, peer.MRRKey, peer.MaxPayload, peer.Depth = *mrAddr, uint32(*mrKey), *maxPayload, *depth
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *ifname == "" {
		fmt.Fprintln(stderr, "rocectl fpga: -d <interface> is required")
		return 2
	}
	dev, err := openFunc(ctx, *ifname, kind, log)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl fpga:", err)
		return 1
	}
	defer dev.Close()
	reg := prometheus.NewRegistry()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "fpga " + mode, Metrics: *metrics, Registry: reg}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl fpga "+mode+":", err)
		return 1
	}
	defer stopStats()
	if mode == "recv" {
		cfg := RecvConfig{GIDIndex: *gidIndex, MaxPayload: *maxPayload, Depth: *depth, PMTU: mtu, RNRTimer: uint8(*rnr),
			Count: *count, Idle: *idle, Verify: *verify, Hold: *hold, Peer: peer, Write: *write, Send: *send, Metrics: reg}
		if *fpgaIP != "" {
			if cfg.FPGAAddr, err = netip.ParseAddr(*fpgaIP); err != nil {
				fmt.Fprintln(stderr, "rocectl fpga:", err)
				return 2
			}
		}
		if *out != "" {
			f, err := os.Create(*out)
			if err != nil {
				fmt.Fprintln(stderr, "rocectl fpga:", err)
				return 1
			}
			defer f.Close()
			cfg.Out = f
		}
		_, err = Recv(ctx, dev, cfg, stdin, stdout, log)
	} else {
		cfg := SendConfig{Count: *count, Size: *size, Rate: *rate, Channel: uint8(*channel), Write: *write, PMTU: mtu,
			Retry: uint8(*retry), Peer: peer}
		if isSet(fs, "size") {
			cfg.Warn = stderr
		}
		_, err = Send(ctx, dev, cfg, stdin, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "rocectl fpga:", err)
		return 1
	}
	return 0
}

const fpgaDefaultPayload = 9000

// isSet tells whether the user gave flag name.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
