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
	"net/url"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3gw"
	"github.com/goroce/goroce/cuobj/s3rdma"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

func init() {
	register("cuobj", command{
		summary: "cuObject S3-over-RDMA server and client on the embedded UDP link",
		run:     runCuobj,
	})
}

// cuobjSignalContext ends serve; tests replace it.
var cuobjSignalContext = func() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt)
}

const cuobjUsage = `usage: rocectl cuobj serve [--listen ADDR:PORT] [--rdma ADDR] [--udp-port N] [--sidecar DIR2] DIR
       rocectl cuobj put [--rdma ADDR] [--udp-port N] [--timeout D] http://ADDR:PORT/BUCKET/KEY FILE
       rocectl cuobj get [--rdma ADDR] [--udp-port N] [--timeout D] http://ADDR:PORT/BUCKET/KEY FILE

serve answers S3 requests on --listen with the objects in DIR (DIR/BUCKET/KEY):
an S3 gateway (versitygw) whose requests with an x-amz-rdma-token move the
object by RDMA (RC, rdma_cm) on a goroce device over the kernel UDP link bound
to --rdma, which needs no root. Every request must be signed (SigV4) with the
key pair in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; without them serve
makes one and prints it.
put and get sign with the same variables, move a file by RDMA from a goroce
device of their own and print one line: the bytes, the rate and how they
moved (by RDMA, or by HTTP: a server without RDMA makes them fall back to it,
and an empty object goes by it). On a terminal a transfer that takes more
than a second shows its progress; --timeout gives up after that long.

flags:`

func runCuobj(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "serve" && args[0] != "put" && args[0] != "get") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return runCuobj([]string{"serve", "-h"}, stdout, stdout) // the usage and the flags
		}
		fmt.Fprintln(stderr, cuobjUsage)
		return 2
	}
	sub := args[0]
	fs := flag.NewFlagSet("cuobj "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), cuobjUsage); fs.PrintDefaults() }
	listen := fs.String("listen", "127.0.0.1:9000", "S3 `address:port` to serve on (serve)")
	defRDMA := "127.0.0.2"
	if sub == "serve" {
		defRDMA = "127.0.0.1"
	}
	rdmaAddr := fs.String("rdma", defRDMA, "`address` of the goroce device (the UDP link binds it)")
	udpPort := fs.Int("udp-port", 4791, "UDP `port` of the RoCEv2 link, the same on both ends")
	metrics := fs.String("metrics", "", devstat.MetricsUsage+" (serve)")
	verbose := fs.Bool("v", false, "log what the cuObject layer does")
	sidecar := fs.String("sidecar", "", "`directory` outside DIR for object metadata, for a DIR whose file system keeps no user xattrs (serve)")
	timeout := fs.Duration("timeout", 0, "give up on the transfer after this `duration` (0: never) (put, get)")
	pathMTU := fs.Int("path-mtu", 0, "path `MTU` of the server's RC connections: 256 … 4096, what both ends' links carry; 0: the device's active MTU (serve)")
	if err := cliflag.Parse(fs, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	a, err := netip.ParseAddr(*rdmaAddr)
	mtu, okMTU := ib.MTUFromBytes(*pathMTU)
	if *pathMTU == 0 {
		mtu, okMTU = 0, true // cuobj.ServerOptions: rdma_cm's choice
	}
	if err != nil || *udpPort <= 0 || *udpPort > 0xFFFF || !okMTU || *timeout < 0 {
		fs.Usage()
		return 2
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	telem := &cuobj.Telemetry{Logger: logger, Flags: cuobj.LogPathError}
	if *verbose {
		telem.Flags |= cuobj.LogPathInfo | cuobj.LogPathDebug
	}
	dev, err := openEmbedded(a, uint16(*udpPort), logger)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj:", err)
		return 1
	}
	defer dev.Close()
	reg := prometheus.NewRegistry()
	stopStats, err := devstat.Start(dev, devstat.Options{Command: "cuobj " + sub, Metrics: *metrics, Registry: reg}, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj "+sub+":", err)
		return 1
	}
	defer stopStats()
	switch sub {
	case "serve":
		if fs.NArg() != 1 {
			fs.Usage()
			return 2
		}
		return cuobjServe(dev, a, mtu, uint16(*udpPort), *listen, fs.Arg(0), *sidecar, logger, telem, reg, stdout, stderr)
	default:
		if fs.NArg() != 2 {
			fs.Usage()
			return 2
		}
		return cuobjTransfer(dev, sub == "put", fs.Arg(0), fs.Arg(1), *timeout, telem, stdout, stderr)
	}
}

// openEmbedded opens a device over a kernel UDP socket bound to a:port.
func openEmbedded(a netip.Addr, port uint16, logger *slog.Logger) (*roce.Device, error) {
	l, err := udplink.Listen(netip.AddrPortFrom(a, port))
	if err != nil {
		return nil, err
	}
	d, err := roce.OpenLink(l, roce.Options{Addrs: []netip.Addr{a}, Port: port, Logger: logger})
	if err != nil {
		l.Close()
		return nil, err
	}
	return d, nil
}

func cuobjServe(dev *roce.Device, a netip.Addr, mtu ib.MTU, udpPort uint16, listen, dir, sidecar string, logger *slog.Logger, telem *cuobj.Telemetry, reg *prometheus.Registry, stdout, stderr io.Writer) int {
	creds, fromEnv := s3rdma.CredentialsFromEnv()
	if !fromEnv {
		// Nothing anonymous: without credentials in the environment the
		// server makes a key pair and says how clients use it.
		var err error
		if creds, err = s3rdma.GenerateCredentials(); err != nil {
			fmt.Fprintln(stderr, "rocectl cuobj serve:", err)
			return 1
		}
	}
	rs, err := cuobj.NewServer(dev, netip.AddrPortFrom(a, 18515), cuobj.ServerOptions{Telemetry: telem, PathMTU: mtu})
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj serve:", err)
		return 1
	}
	defer rs.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj serve:", err)
		return 1
	}
	defer ln.Close()
	g, err := s3gw.New(s3gw.Options{Dir: dir, RDMA: rs, AccessKey: creds.AccessKey, SecretKey: creds.SecretKey,
		Region: creds.Region, SideCarDir: sidecar, Logger: logger})
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj serve:", err)
		return 1
	}
	defer g.Close()
	st, gs := rs.Stats(), g.Stats()
	devstat.CounterFuncs(reg, "cuobj_server_", map[string]func() uint64{
		"gets": st.Gets.Load, "get_bytes": st.GetBytes.Load, "puts": st.Puts.Load, "put_bytes": st.PutBytes.Load,
		"failed": st.Failed.Load, "resets": st.Resets.Load, "refused": st.Refused.Load,
		"plain_gets": gs.PlainGets.Load, "plain_puts": gs.PlainPuts.Load,
	}, map[string]string{
		"gets": "RDMA requests (WRITEs) of GETs completed.", "get_bytes": "Bytes written by RDMA GETs.",
		"puts": "RDMA requests (READs) of PUTs completed.", "put_bytes": "Bytes read by RDMA PUTs.",
		"failed": "Failed RDMA completions.", "resets": "QP resets after failures.",
		"refused":    "Requests refused before submission.",
		"plain_gets": "S3 GETs served without RDMA.", "plain_puts": "S3 PUTs served without RDMA.",
	})
	ctx, stop := cuobjSignalContext()
	defer stop()
	go func() {
		<-ctx.Done()
		_ = g.Close()
	}()
	fmt.Fprintf(stdout, "serving %s on http://%s, RDMA from %v (UDP link, port %d)\n", dir, ln.Addr(), a, udpPort)
	if fromEnv {
		fmt.Fprintf(stdout, "requests must be signed with the key pair of %s and %s\n", s3rdma.EnvAccessKey, s3rdma.EnvSecretKey)
	} else {
		fmt.Fprintf(stdout, "no %s and %s in the environment: requests must be signed with this key pair; for clients:\n%s",
			s3rdma.EnvAccessKey, s3rdma.EnvSecretKey, creds.Exports())
	}
	err = g.Serve(ln)
	// Objects as the gateway counts them (each moves in several RDMA
	// requests), bytes as the RDMA server does.
	fmt.Fprintf(stdout, "RDMA: %d GETs (%d bytes written), %d PUTs (%d bytes read), %d failed; plain: %d GETs, %d PUTs\n",
		gs.RDMAGets.Load(), st.GetBytes.Load(), gs.RDMAPuts.Load(), st.PutBytes.Load(), st.Failed.Load(),
		gs.PlainGets.Load(), gs.PlainPuts.Load())
	if err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(stderr, "rocectl cuobj serve:", err)
		return 1
	}
	return 0
}

// cuobjIsTerminal reports whether w is a terminal (progress is shown
// there only); tests replace it.
var cuobjIsTerminal = func(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress shows, on a terminal, how long a transfer of n bytes has run,
// once a second after the first; stop clears the line.
func progress(w io.Writer, what string, n int64) (stop func()) {
	if !cuobjIsTerminal(w) {
		return func() {}
	}
	start := time.Now()
	t := time.NewTicker(time.Second)
	done, exited := make(chan struct{}), make(chan struct{})
	shown := false
	go func() {
		defer close(exited)
		for {
			select {
			case <-done:
				if shown {
					fmt.Fprint(w, "\r\033[K")
				}
				return
			case <-t.C:
				shown = true
				// The RDMA transfer is one request: its bytes are known
				// only at its end, its time all along.
				fmt.Fprintf(w, "\r\033[K%s: %d bytes, %.0f s so far", what, n, time.Since(start).Seconds())
			}
		}
	}()
	return func() {
		t.Stop()
		close(done)
		<-exited
	}
}

func cuobjTransfer(dev *roce.Device, put bool, rawURL, file string, timeout time.Duration, telem *cuobj.Telemetry, stdout, stderr io.Writer) int {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(stderr, "rocectl cuobj: %q is not http://ADDR:PORT/BUCKET/KEY\n", rawURL)
		return 2
	}
	bucket, key, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || bucket == "" || key == "" {
		fmt.Fprintf(stderr, "rocectl cuobj: %q names no BUCKET/KEY\n", rawURL)
		return 2
	}
	ctx, stop := cuobjSignalContext()
	defer stop()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	fail := func(err error) int {
		if timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			fmt.Fprintf(stderr, "rocectl cuobj: gave up after --timeout %v: %v\n", timeout, err)
		} else {
			fmt.Fprintln(stderr, "rocectl cuobj:", err)
		}
		return 1
	}
	cfg := cuobj.DefaultConfig()
	if p := os.Getenv(cuobj.ConfigEnv); p != "" {
		c, err := cuobj.LoadConfig()
		if err != nil {
			fmt.Fprintln(stderr, "rocectl cuobj:", err)
			return 1
		}
		for _, n := range c.Notes {
			fmt.Fprintf(stderr, "rocectl cuobj: warning: %s: %s\n", cuobj.ConfigEnv, n)
		}
		cfg = *c
	}
	c, err := s3rdma.NewClient(dev, "http://"+u.Host, s3rdma.ClientOptions{RDMA: cuobj.ClientOptions{Config: &cfg, Telemetry: telem}})
	if err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj:", err)
		return 1
	}
	defer c.Close()
	var buf []byte
	var target *fileTarget // a GET's mapped file, if it could be mapped
	if put {
		if buf, err = os.ReadFile(file); err != nil {
			fmt.Fprintln(stderr, "rocectl cuobj:", err)
			return 1
		}
	} else {
		size, err := c.Head(ctx, bucket, key)
		if err != nil {
			return fail(err)
		}
		if size == 0 {
			fmt.Fprintf(stdout, "GET %s/%s: 0 bytes, an empty object: nothing to move\n", bucket, key)
			return writeFile(file, nil, stderr)
		}
		if target, err = mapTarget(file, size); err == nil {
			buf = target.buf
			defer func() {
				if target != nil {
					target.abort()
				}
			}()
		} else {
			buf = make([]byte, size)
		}
	}
	if len(buf) > 0 {
		if err := c.RDMA().Register(buf); err != nil {
			fmt.Fprintln(stderr, "rocectl cuobj:", err)
			return 1
		}
		// Before the mapping goes (deferred calls run last first).
		defer func() { _ = c.RDMA().Deregister(buf) }()
	}
	op := "GET"
	if put {
		op = "PUT"
	}
	stopProgress := progress(stdout, fmt.Sprintf("%s %s/%s", op, bucket, key), int64(len(buf)))
	start := time.Now()
	var n int64
	var byRDMA bool
	if put {
		byRDMA, err = c.Put(ctx, bucket, key, buf)
		n = int64(len(buf))
	} else {
		n, byRDMA, err = c.Get(ctx, bucket, key, buf)
	}
	el := time.Since(start)
	stopProgress()
	if err != nil {
		return fail(err)
	}
	switch {
	case target != nil:
		_ = c.RDMA().Deregister(buf)
		err := target.commit(n)
		target = nil
		if err != nil {
			fmt.Fprintln(stderr, "rocectl cuobj:", err)
			return 1
		}
	case !put:
		if code := writeFile(file, buf[:n], stderr); code != 0 {
			return code
		}
	}
	how := "by HTTP (the server declined RDMA)"
	if len(buf) == 0 {
		how = "by HTTP (an empty object has nothing to move by RDMA)"
	}
	if byRDMA {
		how = "by RDMA"
		if put {
			how += " (server RDMA READ)"
		} else {
			how += " (server RDMA WRITE)"
		}
	}
	fmt.Fprintf(stdout, "%s %s/%s: %d bytes %s in %v, %.1f MB/s\n", op, bucket, key, n, how,
		el.Round(time.Microsecond), float64(n)/el.Seconds()/1e6)
	return 0
}

func writeFile(name string, b []byte, stderr io.Writer) int {
	if err := os.WriteFile(name, b, 0o644); err != nil {
		fmt.Fprintln(stderr, "rocectl cuobj:", err)
		return 1
	}
	return 0
}
