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

	"github.com/goroce/goroce/cm/rping"
	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func init() {
	register("rping", command{
		summary: "rdma-core rping compatible test over rdma_cm, either role",
		run:     runRping,
	})
}

// runRping is "rocectl rping -s|-c [-vV] [-S size] [-C count] [-a addr] [-p port]".
func runRping(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rocectl rping -s [-vV] [-S size] [-C count] [-a addr] [-p port]\n"+
			"       rocectl rping -c [-vV] [-S size] [-C count] -a addr [-p port]\n\n"+
			"Runs rping's test (rdma_cm connection, RDMA READ of the ping, RDMA WRITE back);\n"+
			"either end may be the real rping.\n\nflags:")
		fs.PrintDefaults()
	}
	server := fs.Bool("s", false, "server side")
	client := fs.Bool("c", false, "client side")
	addr := fs.String("a", "", "`address`: the server's (client), the one to bind (server; default any)")
	port := fs.Int("p", rping.DefaultPort, "rdma_cm `port`")
	count := fs.Int("C", 0, "ping `count` (0: until interrupted)")
	size := fs.Int("S", rping.DefaultSize, "ping data `size`")
	verbose := fs.Bool("v", false, "display ping data to stdout")
	validate := fs.Bool("V", false, "validate ping data")
	_ = fs.Bool("d", false, "debug printfs (accepted for compatibility); -d `interface` names the interface, as -i")
	source := fs.String("I", "", "client: source `address` (the kernel UDP link binds it; the server binds -a)")
	ifname := fs.String("i", "", "network `interface` to run RoCEv2 on (default: the one owning -a, or routing to it)")
	link := fs.String("link", "auto", "packet `link`: xdp, udp or auto")
	metrics := fs.String("metrics", "", devstat.MetricsUsage)
	connectTimeout := fs.Duration("connect-timeout", rping.DefaultConnectTimeout, "client: give up connecting after this `duration`, tries of "+rping.DefaultConnectAttempt.String()+" each")
	if err := cliflag.Parse(fs, rpingInterfaceFlag(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *server == *client || fs.NArg() != 0 || (*client && *addr == "") || *port <= 0 || *port > 0xFFFF {
		fs.Usage()
		return 2
	}
	var a netip.Addr
	if *addr != "" {
		ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", *addr)
		if err != nil || len(ips) == 0 {
			fmt.Fprintln(stderr, "getaddrinfo failed - invalid hostname or IP address")
			return 1
		}
		a = ips[0].Unmap()
	} else {
		a = netip.IPv4Unspecified()
	}
	cfg := rping.Config{Size: *size, Count: *count, Verbose: *verbose, Validate: *validate, Out: stdout,
		ConnectTimeout: *connectTimeout}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	name := *ifname
	if name == "" {
		var err error
		if name, err = rpingInterface(a, *server); err != nil {
			fmt.Fprintln(stderr, "rocectl rping:", err)
			return 1
		}
	}
	var kind netdev.LinkKind
	switch *link {
	case "auto":
	case "xdp":
		kind = netdev.LinkXDP
	case "udp":
		kind = netdev.LinkUDP
	default:
		fmt.Fprintf(stderr, "rocectl rping: unknown link %q (udp, xdp or auto)\n", *link)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var local netip.Addr
	switch {
	case *server && !a.IsUnspecified():
		local = a
	case !*server && *source != "":
		ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", *source)
		if err != nil || len(ips) == 0 {
			fmt.Fprintln(stderr, "getaddrinfo failed - invalid source address")
			return 1
		}
		local = ips[0].Unmap()
	}
	dev, err := netdev.Open(ctx, name, netdev.Options{Link: kind, UDPAddr: local, Device: roce.Options{Logger: logger}})
	if err != nil {
		fmt.Fprintln(stderr, "rocectl rping:", err)
		return 1
	}
	defer dev.Close()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "rping", Metrics: *metrics}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl rping:", err)
		return 1
	}
	defer stopStats()
	ap := netip.AddrPortFrom(a, uint16(*port))
	if *server {
		err = rping.Server(ctx, dev, ap, cfg)
	} else {
		err = rping.Client(ctx, dev, ap, cfg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rping %s failed: %v\n", map[bool]string{true: "server", false: "client"}[*server], err)
		return 1
	}
	return 0
}

// rpingInterfaceFlag rewrites "-d IFACE" to "-i IFACE": rping's -d is a
// debug switch without a value, and rping takes no operands, so a word after
// -d can only name the interface, as -d does in rocectl's other commands.
func rpingInterfaceFlag(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "-d" || a == "--d") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, "-i", args[i+1])
			i++
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "d="); ok && strings.HasPrefix(a, "-") {
			if _, err := strconv.ParseBool(v); err != nil {
				a = "-i=" + v
			}
		}
		out = append(out, a)
	}
	return out
}

// rpingInterface finds the interface a server address belongs to, or the
// one the route to a client's destination leaves by.
func rpingInterface(a netip.Addr, server bool) (string, error) {
	if server {
		if a.IsUnspecified() {
			return "", errors.New("a server bound to any address needs -d <interface>")
		}
		ifs, err := net.Interfaces()
		if err != nil {
			return "", err
		}
		for _, ifc := range ifs {
			addrs, _ := ifc.Addrs()
			for _, x := range addrs {
				p, err := netip.ParsePrefix(x.String())
				if err != nil {
					continue
				}
				// Every address of a loopback prefix is the host's own
				// (127.0.0.5 on lo's 127.0.0.1/8).
				if p.Addr().Unmap() == a || ifc.Flags&net.FlagLoopback != 0 && p.Contains(a) {
					return ifc.Name, nil
				}
			}
		}
		return "", fmt.Errorf("no interface has address %v", a)
	}
	return routeInterface(a)
}
