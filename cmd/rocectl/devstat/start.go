package devstat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rocemetrics"
)

// Options says how Start shows a device.
type Options struct {
	// Command names the rocectl command running the device ("perf",
	// "naaice serve"), for the reader's information.
	Command string
	// Metrics, if set, is the TCP address ("127.0.0.1:9100", ":0") on which
	// Start serves Prometheus metrics at /metrics: the device's counters
	// (package rocemetrics) and whatever Registry holds.
	Metrics string
	// Registry, if set, is served at /metrics besides the device's
	// collector; the command may register its protocol's counters in it
	// after Start.
	Registry *prometheus.Registry
}

// MetricsPath is where Start serves the metrics.
const MetricsPath = "/metrics"

// Start makes dev's counters visible to "rocectl stat" until stop is
// called and, with o.Metrics set, serves them to Prometheus. Every
// long-running rocectl command calls it right after opening its device,
// from the goroutine that opened it (abstract sockets belong to the network
// namespace of the calling thread):
//
//	stop, err := devstat.Start(dev, devstat.Options{Command: "rping"}, stderr)
//	if err != nil { ... }
//	defer stop()
//
// Failing to publish (another process already publishes the interface, or
// the system is not Linux) is reported on stderr and is not an error: the
// command runs as before. Failing to listen on o.Metrics is an error. The
// metrics address is printed on stderr ("metrics on http://ADDR/metrics"),
// which tells the port chosen for ":0".
func Start(dev *roce.Device, o Options, stderr io.Writer) (stop func(), err error) {
	var srv *http.Server
	var done chan struct{}
	if o.Metrics != "" {
		reg := prometheus.NewRegistry()
		if err := reg.Register(rocemetrics.New(dev, dev.Info().Name)); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		var g prometheus.Gatherer = reg
		if o.Registry != nil {
			g = prometheus.Gatherers{reg, o.Registry}
		}
		ln, err := net.Listen("tcp", o.Metrics)
		if err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle(MetricsPath, promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		done = make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fmt.Fprintf(stderr, "rocectl %s: metrics: %v\n", o.Command, err)
			}
		}()
		fmt.Fprintf(stderr, "rocectl %s: metrics on http://%s%s\n", o.Command, ln.Addr(), MetricsPath)
	}
	unpublish := func() {}
	if p, err := Publish(dev, o.Command); err != nil {
		fmt.Fprintf(stderr, "rocectl %s: counters not published: %v\n", o.Command, err)
	} else {
		unpublish = func() { p.Close() }
	}
	return func() {
		unpublish()
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
			<-done
		}
	}, nil
}

// CounterFuncs registers one counter per name in fns in reg, each read by
// its function when scraped; names get prefix and "_total".
func CounterFuncs(reg *prometheus.Registry, prefix string, fns map[string]func() uint64, help map[string]string) {
	for n, f := range fns {
		h := help[n]
		if h == "" {
			h = n
		}
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prefix + n + "_total", Help: h},
			func() float64 { return float64(f()) }))
	}
}

// MetricsUsage documents the --metrics flag of the commands that call
// Start.
const MetricsUsage = "serve Prometheus metrics (the device's counters and the protocol's) over HTTP at `address:port`" + MetricsPath + " while running"
