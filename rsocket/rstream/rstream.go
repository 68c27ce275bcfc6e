// Package rstream is rdma-core's rstream test (librdmacm/examples/rstream.c)
// over goroce rsockets, so that either end of an rstream run may be goroce:
// the same protocol (a 16-byte exchange each way, then transfer_count
// writes of transfer_size bytes from the client, the same back from the
// server, iterations times), the same default series (a latency series on
// one connection, then a bandwidth series on a new one), the same buffer and
// inline settings and the same output lines.
//
// Options not supported: -f gid (AF_IB), -T f (fork), -T r (rdma_getaddrinfo:
// accepted and ignored, addresses are resolved the same way). -T a, b and n
// select rstream's polling style, which has no equivalent in Go; they are
// accepted. -T s runs the test over kernel TCP with package net.
package rstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
)

// DefaultPort is rstream's port.
const DefaultPort = "7471"

// Config is rstream's command line.
type Config struct {
	Server     bool   // no -s: the server side
	Dst        string // -s server_address
	Bind       string // -b bind_address
	Port       string // -p (default 7471)
	BufferSize int    // -B: SO_SNDBUF/SO_RCVBUF value (default 512 KiB)
	InlineSize int    // -i (default 64), used by the latency series
	Iterations int    // -I
	Count      int    // -C
	Size       int    // -S size
	SizeAll    bool   // -S all: every size of the table
	Custom     bool   // any of -I, -C, -S size: one custom run
	Keepalive  int    // -k seconds
	Verify     bool   // -T v
	Sockets    bool   // -T s: kernel TCP instead of rsockets
	IPv6       bool   // -f ipv6 (a name resolves to IPv6)
	Out        io.Writer
}

type sizeParam struct{ size, option int }

// testSize is rstream's table: option 0 sizes run by default, the rest with
// -S all.
var testSize = func() []sizeParam {
	t := []sizeParam{{1 << 6, 0}}
	for s := 7; s <= 22; s++ {
		opt := 1
		if s == 12 || s == 16 || s == 20 {
			opt = 0
		}
		t = append(t, sizeParam{1 << s, opt}, sizeParam{1<<s + 1<<(s-1), 1})
	}
	return t
}()

// TestSizes returns the transfer sizes of the default series: rstream's
// table, every size with -S all, otherwise 64 B, 4 KiB, 64 KiB and 1 MiB.
func TestSizes(all bool) []int {
	var s []int
	for _, t := range testSize {
		if t.option <= boolInt(all) {
			s = append(s, t.size)
		}
	}
	return s
}

// SizeStr is common.c's size_str.
func SizeStr(size int64) string {
	var base int64 = 1
	mag := ""
	switch {
	case size >= 1<<30:
		base, mag = 1<<30, "g"
	case size >= 1<<20:
		base, mag = 1<<20, "m"
	case size >= 1<<10:
		base, mag = 1<<10, "k"
	}
	var fraction int64
	if size/base < 10 {
		fraction = (size % base) * 10 / base
	}
	if fraction != 0 {
		return fmt.Sprintf("%d.%d%s", size/base, fraction, mag)
	}
	return fmt.Sprintf("%d%s", size/base, mag)
}

// CntStr is common.c's cnt_str.
func CntStr(cnt int64) string {
	switch {
	case cnt >= 1000000000:
		return fmt.Sprintf("%db", cnt/1000000000)
	case cnt >= 1000000:
		return fmt.Sprintf("%dm", cnt/1000000)
	case cnt >= 1000:
		return fmt.Sprintf("%dk", cnt/1000)
	}
	return fmt.Sprintf("%d", cnt)
}

// SizeToCount is common.c's size_to_count.
func SizeToCount(size int) int {
	switch {
	case size >= 1<<20:
		return 100
	case size >= 1<<16:
		return 1000
	case size >= 1<<10:
		return 10000
	}
	return 100000
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
	conn       net.Conn
	rl         *rsocket.Listener
	tl         net.Listener
	sendData   byte // format_buf's running byte
	recvData   byte // verify_buf's running byte
	recvTotal  int64
}

// Run runs rstream's test with cfg on dev (unused with Sockets).
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
	if !cfg.Custom {
		r.buf = make([]byte, testSize[len(testSize)-1].size)
	} else {
		// rstream allocates transfer_size bytes and overruns them in its
		// 16-byte sync exchange when smaller.
		r.buf = make([]byte, max(r.size, 16))
	}
	if cfg.Server {
		if err := r.listen(ctx); err != nil {
			return err
		}
		defer r.closeListener()
	}
	fmt.Fprintf(cfg.Out, "%-10s%-8s%-8s%-8s%-8s%8s %10s%13s\n",
		"name", "bytes", "xfers", "iters", "total", "time", "Gb/sec", "usec/xfer")
	if !cfg.Custom {
		if err := r.connect(ctx, optLatency); err != nil {
			return err
		}
		for _, t := range testSize {
			if t.option > boolInt(cfg.SizeAll) {
				continue
			}
			r.initLatency(t.size)
			if err := r.runTest(); err != nil {
				r.conn.Close()
				return err
			}
		}
		r.conn.Close()
		if err := r.connect(ctx, optBandwidth); err != nil {
			return err
		}
		for _, t := range testSize {
			if t.option > boolInt(cfg.SizeAll) {
				continue
			}
			r.initBandwidth(t.size)
			if err := r.runTest(); err != nil {
				r.conn.Close()
				return err
			}
		}
		return r.conn.Close()
	}
	if err := r.connect(ctx, optMixed); err != nil {
		return err
	}
	err := r.runTest()
	return errors.Join(err, r.conn.Close())
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (r *run) initLatency(size int) {
	r.name = SizeStr(int64(size)) + "_lat"
	r.count, r.size, r.iterations = 1, size, SizeToCount(size)
}

func (r *run) initBandwidth(size int) {
	r.name = SizeStr(int64(size)) + "_bw"
	r.iterations, r.size, r.count = 1, size, SizeToCount(size)
}

// options are set_options for an rsocket.
func (r *run) options(opt optimization) rsocket.Options {
	o := rsocket.Options{NoDelay: true, SendBuffer: 1 << 19, ReceiveBuffer: 1 << 19}
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
	if r.cfg.Keepalive != 0 {
		o.KeepAlive = true
		o.KeepAliveIdle = time.Duration(r.cfg.Keepalive) * time.Second
		fmt.Fprintf(r.cfg.Out, "Keepalive: ON\n  time: %d\n", r.cfg.Keepalive)
	}
	return o
}

func (r *run) network() string {
	if r.cfg.IPv6 {
		return "tcp6"
	}
	return "tcp"
}

// listen is server_listen: an unbound server listens on IPv4 (what
// getaddrinfo(NULL, AI_PASSIVE) returns first), a bound one on the
// address's family.
func (r *run) listen(ctx context.Context) error {
	addr := net.JoinHostPort(r.cfg.Bind, r.cfg.Port)
	netw := "tcp4"
	if r.cfg.Bind != "" {
		netw = r.network()
	}
	var err error
	if r.cfg.Sockets {
		r.tl, err = (&net.ListenConfig{}).Listen(ctx, netw, addr)
	} else {
		r.rl, err = (&rsocket.ListenConfig{}).Listen(ctx, r.dev, netw, addr)
	}
	if err != nil {
		return fmt.Errorf("rbind: %w", err)
	}
	return nil
}

func (r *run) closeListener() {
	if r.rl != nil {
		r.rl.Close()
	}
	if r.tl != nil {
		r.tl.Close()
	}
}

func (r *run) connect(ctx context.Context, opt optimization) error {
	o := r.options(opt)
	var err error
	if r.cfg.Server {
		if r.tl != nil {
			r.conn, err = r.tl.Accept()
		} else {
			r.rl.SetOptions(o)
			r.conn, err = r.rl.AcceptRsocket(ctx)
		}
		if err != nil {
			return fmt.Errorf("raccept: %w", err)
		}
		return nil
	}
	addr := net.JoinHostPort(r.cfg.Dst, r.cfg.Port)
	if r.cfg.Sockets {
		d := net.Dialer{}
		if r.cfg.Bind != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(r.cfg.Bind)}
		}
		r.conn, err = d.DialContext(ctx, r.network(), addr)
	} else {
		d := rsocket.Dialer{Options: o}
		if r.cfg.Bind != "" {
			a, perr := netip.ParseAddr(r.cfg.Bind)
			if perr != nil {
				return fmt.Errorf("getaddrinfo src_addr: %w", perr)
			}
			d.LocalAddr = a
		}
		r.conn, err = d.Dial(ctx, r.dev, r.network(), addr)
	}
	if err != nil {
		return fmt.Errorf("rconnect: %w", err)
	}
	return nil
}

func (r *run) sendXfer(size int) error {
	b := r.buf[:size]
	if r.cfg.Verify {
		for i := range b {
			b[i] = r.sendData
			r.sendData++
		}
	}
	if _, err := r.conn.Write(b); err != nil {
		return fmt.Errorf("rsend: %w", err)
	}
	return nil
}

func (r *run) recvXfer(size int) error {
	b := r.buf[:size]
	if _, err := io.ReadFull(r.conn, b); err != nil {
		return fmt.Errorf("rrecv: %w", err)
	}
	if r.cfg.Verify {
		for i := range b {
			if b[i] != r.recvData {
				fmt.Fprintf(r.cfg.Out, "data verification failed byte %d\n", r.recvTotal)
				return fmt.Errorf("data verification failed byte %d", r.recvTotal)
			}
			r.recvData++
			r.recvTotal++
		}
	}
	return nil
}

func (r *run) xfer(send bool, size int) error {
	if send {
		return r.sendXfer(size)
	}
	return r.recvXfer(size)
}

// runTest is run_test: the sync exchange, then the timed transfers.
func (r *run) runTest() error {
	client := !r.cfg.Server
	if err := r.xfer(client, 16); err != nil {
		return err
	}
	if err := r.xfer(!client, 16); err != nil {
		return err
	}
	start := time.Now()
	for i := 0; i < r.iterations; i++ {
		for t := 0; t < r.count; t++ {
			if err := r.xfer(client, r.size); err != nil {
				return err
			}
		}
		for t := 0; t < r.count; t++ {
			if err := r.xfer(!client, r.size); err != nil {
				return err
			}
		}
	}
	r.showPerf(time.Since(start))
	return nil
}

// showPerf prints rstream's result line.
func (r *run) showPerf(d time.Duration) {
	usec := float64(d.Microseconds())
	if usec == 0 {
		usec = 1
	}
	bytes := int64(r.iterations) * int64(r.count) * int64(r.size) * 2
	fmt.Fprintf(r.cfg.Out, "%-10s%-8s%-8s%-8s%-8s%8.2fs%10.2f%11.2f\n", r.name,
		SizeStr(int64(r.size)), CntStr(int64(r.count)), CntStr(int64(r.iterations)), SizeStr(bytes),
		usec/1000000, float64(bytes*8)/(1000*usec), (usec/float64(r.iterations))/float64(r.count*2))
}
