// Package riostream is rdma-core's riostream test
// (librdmacm/examples/riostream.c) over goroce rsockets: rstream's
// structure, but the payload goes with riowrite into a buffer the peer
// mapped with riomap (RDMA_IOMAPSIZE 1, offset 0), and the receiver learns
// of it only by polling the buffer's last byte for a marker. The 16-byte
// sync exchange still goes through rsend/rrecv, and carries the iomap
// entries.
//
// The receiver polls a byte that the peer's transfers keep rewriting, as
// the C tool does with a volatile pointer; in Go that is a data race by
// design (Conn.IOSync orders each look after the writes so far, but not
// against the ones still coming), so the race detector reports it.
//
// Options not supported: -f gid (AF_IB). -T a, b and n select riostream's
// polling style and are accepted; -T r is accepted and ignored.
package riostream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"time"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
	"github.com/goroce/goroce/rsocket/rstream"
)

// DefaultPort is riostream's port.
const DefaultPort = "7471"

// Config is riostream's command line.
type Config struct {
	Server     bool   // no -s
	Dst        string // -s server_address
	Bind       string // -b bind_address
	Port       string // -p (default 7471)
	BufferSize int    // -B (default 512 KiB)
	InlineSize int    // -i (default 64)
	Iterations int    // -I
	Count      int    // -C (default 1000)
	Size       int    // -S size
	SizeAll    bool   // -S all
	Custom     bool   // any of -I, -C, -S size
	Verify     bool   // -T v
	IPv6       bool   // the address family of names and an unbound server
	Out        io.Writer
}

type optimization int

const (
	optMixed optimization = iota
	optLatency
	optBandwidth
)

type run struct {
	cfg        Config
	dev        *roce.Device
	name       string
	iterations int
	count      int
	size       int
	buf        []byte
	conn       *rsocket.Conn
	l          *rsocket.Listener
	sendData   byte
	recvData   byte
	recvTotal  int64
}

// Run runs riostream's test with cfg on dev.
func Run(ctx context.Context, dev *roce.Device, cfg Config) error {
	if cfg.Port == "" {
		cfg.Port = DefaultPort
	}
	if cfg.InlineSize == 0 {
		cfg.InlineSize = 64
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	r := &run{cfg: cfg, dev: dev, name: "custom", iterations: 1, size: 1000, count: 1000}
	if cfg.Iterations > 0 {
		r.iterations = cfg.Iterations
	}
	if cfg.Count > 0 {
		r.count = cfg.Count
	}
	if cfg.Size > 0 {
		r.size = cfg.Size
	}
	sizes := rstream.TestSizes(cfg.SizeAll)
	if !cfg.Custom {
		r.buf = make([]byte, sizes[len(sizes)-1])
	} else {
		r.buf = make([]byte, max(r.size, 16))
	}
	if cfg.Server {
		netw := "tcp4"
		if cfg.Bind != "" {
			netw = r.network()
		}
		var err error
		if r.l, err = rsocket.Listen(ctx, dev, netw, net.JoinHostPort(cfg.Bind, cfg.Port)); err != nil {
			return fmt.Errorf("rbind: %w", err)
		}
		defer r.l.Close()
	}
	fmt.Fprintf(cfg.Out, "%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n",
		"name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer")
	if cfg.Custom {
		if err := r.connect(ctx, optMixed); err != nil {
			return err
		}
		err := r.runTest(ctx)
		return errors.Join(err, r.conn.Close())
	}
	for _, opt := range []optimization{optLatency, optBandwidth} {
		if err := r.connect(ctx, opt); err != nil {
			return err
		}
		for _, s := range sizes {
			what := "_bw"
			r.iterations, r.size, r.count = 1, s, rstream.SizeToCount(s)
			if opt == optLatency {
				what = "_lat"
				r.iterations, r.count = r.count, 1
			}
			r.name = rstream.SizeStr(int64(s)) + what
			// riostream ignores a failed test and goes on.
			if err := r.runTest(ctx); err != nil {
				fmt.Fprintln(cfg.Out, err)
			}
		}
		r.conn.Close()
	}
	return nil
}

func (r *run) network() string {
	if r.cfg.IPv6 {
		return "tcp6"
	}
	return "tcp"
}

func (r *run) connect(ctx context.Context, opt optimization) error {
	o := rsocket.Options{NoDelay: true, IOMapSize: 1, SendBuffer: 1 << 19, ReceiveBuffer: 1 << 19}
	if r.cfg.BufferSize != 0 {
		o.SendBuffer, o.ReceiveBuffer = r.cfg.BufferSize, r.cfg.BufferSize
	}
	switch opt {
	case optLatency:
		o.Inline = r.cfg.InlineSize
		if o.Inline <= 0 {
			o.Inline = rsocket.NoInline
		}
	case optBandwidth:
		o.Inline = rsocket.NoInline
	}
	var err error
	if r.cfg.Server {
		r.l.SetOptions(o)
		if r.conn, err = r.l.AcceptRsocket(ctx); err != nil {
			return fmt.Errorf("raccept: %w", err)
		}
		return nil
	}
	d := rsocket.Dialer{Options: o}
	if r.cfg.Bind != "" {
		if d.LocalAddr, err = netip.ParseAddr(r.cfg.Bind); err != nil {
			return err
		}
	}
	if r.conn, err = d.Dial(ctx, r.dev, r.network(), net.JoinHostPort(r.cfg.Dst, r.cfg.Port)); err != nil {
		return fmt.Errorf("rconnect: %w", err)
	}
	return nil
}

func (r *run) sendMsg(n int) error {
	if _, err := r.conn.Write(r.buf[:n]); err != nil {
		return fmt.Errorf("rsend: %w", err)
	}
	return nil
}

func (r *run) recvMsg(n int) error {
	if _, err := io.ReadFull(r.conn, r.buf[:n]); err != nil {
		return fmt.Errorf("rrecv: %w", err)
	}
	return nil
}

func (r *run) sendXfer(n int) error {
	if _, err := r.conn.IOWrite(r.buf[:n], 0); err != nil {
		return fmt.Errorf("riowrite: %w", err)
	}
	return nil
}

// recvXfer waits for marker in the last byte of the mapped buffer.
func (r *run) recvXfer(ctx context.Context, n int, marker byte) error {
	err := waitMarker(ctx, func() bool {
		r.conn.IOSync()
		return r.buf[n-1] == marker
	}, r.conn.Err)
	if err != nil {
		return err
	}
	if r.cfg.Verify {
		for i, b := range r.buf[:n-1] {
			if b != r.recvData {
				fmt.Fprintf(r.cfg.Out, "data verification failed byte %d\n", r.recvTotal)
				return fmt.Errorf("data verification failed byte %d", r.recvTotal+int64(i))
			}
			r.recvData++
			r.recvTotal++
		}
	}
	return nil
}

// Marker polling: a riowrite is a plain RDMA WRITE, which completes
// nothing on this side, so arrival can only be seen in memory. The poll
// spins for markerSpin, then sleeps between looks, from markerNap doubling
// to markerMaxNap: riostream's C loop spins without end, which on a shared
// host takes a core from the peer and from the device's own receive path
// (against a TCG guest goroce's turnaround grew from about 25 µs to 3.7 ms
// at the median). A wait longer than the spin costs at most markerMaxNap
// more.
const (
	markerSpin   = 50 * time.Microsecond
	markerNap    = 10 * time.Microsecond
	markerMaxNap = time.Millisecond
)

// waitMarker returns once arrived reports true, or with the error of
// failed or ctx.
func waitMarker(ctx context.Context, arrived func() bool, failed func() error) error {
	start := time.Now()
	nap := markerNap
	for i := 0; ; i++ {
		if arrived() {
			return nil
		}
		if i&63 != 63 {
			continue
		}
		if err := failed(); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(start) < markerSpin {
			runtime.Gosched()
			continue
		}
		time.Sleep(nap)
		nap = min(2*nap, markerMaxNap)
	}
}

func (r *run) formatBuf(n int) {
	for i := range r.buf[:n] {
		r.buf[i] = r.sendData
		r.sendData++
	}
}

func (r *run) runTest(ctx context.Context) error {
	n := r.size
	buf := r.buf[:n]
	buf[n-1] = 0xFF
	if _, err := r.conn.IOMap(buf, true, 0); err != nil {
		return fmt.Errorf("riomap: %w", err)
	}
	defer r.conn.IOUnmap(buf)
	client := !r.cfg.Server
	sync := []func(int) error{r.recvMsg, r.sendMsg}
	if client {
		sync[0], sync[1] = r.sendMsg, r.recvMsg
	}
	for _, f := range sync {
		if err := f(16); err != nil {
			return err
		}
	}
	var marker byte
	start := time.Now()
	for i := 0; i < r.iterations; i++ {
		if !client {
			if err := r.recvXfer(ctx, n, marker); err != nil {
				return err
			}
			marker++
		}
		for t := 0; t < r.count-1; t++ {
			if err := r.sendXfer(n); err != nil {
				return err
			}
		}
		buf[n-1] = marker
		marker++
		if r.cfg.Verify {
			r.formatBuf(n - 1)
		}
		if err := r.sendXfer(n); err != nil {
			return err
		}
		if client {
			if err := r.recvXfer(ctx, n, marker); err != nil {
				return err
			}
			marker++
		}
	}
	d := time.Since(start)
	usec := max(float64(d.Microseconds()), 1)
	bytes := int64(r.iterations) * int64(r.count) * int64(n) * 2
	fmt.Fprintf(r.cfg.Out, "%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n", r.name,
		rstream.SizeStr(int64(n)), rstream.CntStr(int64(r.count)), rstream.CntStr(int64(r.iterations)), rstream.SizeStr(bytes),
		usec/1000000, float64(bytes*8)/(1000*usec), (usec/float64(r.iterations))/float64(r.count*2))
	return nil
}
