// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
)

// labMTU gives rxe an active MTU of 2048 while a frame still fits one
// 4096-byte UMEM chunk, so AF_XDP attaches without multi-buffer.
const labMTU = 3000

func TestMain(m *testing.M) {
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: labMTU,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	shared.close()
	os.Exit(code)
}

// captureSwitch is the device's capture writer: it keeps the pcap file
// header and, only while on, the records. The device's tap buffers, so it
// is switched only right after Device.FlushCapture, at a record boundary.
type captureSwitch struct {
	mu  sync.Mutex
	hdr []byte // the 24-byte pcap header
	on  bool
	buf []byte
}

func (c *captureSwitch) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(p)
	if len(c.hdr) < 24 {
		k := min(24-len(c.hdr), len(p))
		c.hdr = append(c.hdr, p[:k]...)
		p = p[k:]
	}
	if c.on {
		c.buf = append(c.buf, p...)
	}
	return n, nil
}

func (c *captureSwitch) start() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on, c.buf = true, nil
}

// stop returns the pcap file of what was captured since start.
func (c *captureSwitch) stop() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	f := append(append([]byte(nil), c.hdr...), c.buf...)
	c.buf = nil
	return f
}

// sharedDevice is the goroce device on rxeh0, opened once per binary.
type sharedDevice struct {
	once sync.Once
	dev  *roce.Device
	cap  captureSwitch
	err  error
}

var shared sharedDevice

func (s *sharedDevice) close() {
	if s.dev != nil {
		s.dev.Close()
	}
}

// env is what every test needs: the lab, its guest and our device.
type env struct {
	lab      *rxelab.Lab
	g        *rxelab.Guest
	dev      *roce.Device
	cap      *captureSwitch
	gidIndex int // the guest's GID index of its IPv4 address
}

func setup(t *testing.T) *env {
	t.Helper()
	lab := rxelab.Get(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		shared.err = lab.InPeerNS(func() error {
			var err error
			shared.dev, err = roce.Open(ctx, lab.PeerIf, roce.Options{Link: roce.LinkXDP, Logger: logger, Capture: &shared.cap})
			return err
		})
	})
	if shared.err != nil {
		if errors.Is(shared.err, roce.ErrNotSupported) {
			t.Skipf("AF_XDP on %s: %v", lab.PeerIf, shared.err)
		}
		t.Fatalf("opening goroce on %s over AF_XDP: %v", lab.PeerIf, shared.err)
	}
	g := lab.Guests[0]
	idx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest %s has no GID for %v: %v", g.Name, g.Addr, g.GIDs)
	}
	return &env{lab: lab, g: g, dev: shared.dev, cap: &shared.cap, gidIndex: idx}
}

// tap is the guest's tap device in the lab netns (rxe-lab names it so).
func (e *env) tap() string { return "rxt-" + e.g.Name }

// listen opens the out-of-band listener on rxeh0's address in the peer
// netns, for a guest tool that connects to us.
func (e *env) listen(t *testing.T) perfcmd.OOB {
	t.Helper()
	var ln net.Listener
	err := e.lab.InPeerNS(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(e.lab.PeerAddr, rxelab.OOBPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listening on the OOB port: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return perfcmd.OOB{Listener: ln}
}

// closeWhenDone closes a server's listener once the guest tool has ended
// or ctx is done, so an Accept waiting for a tool that died returns.
func closeWhenDone(ctx context.Context, oob perfcmd.OOB, job *rxelab.Job) {
	go func() {
		select {
		case <-job.Done():
		case <-ctx.Done():
		}
		oob.Listener.Close()
	}()
}

// dialer connects to the guest tool's server from the peer netns, retrying
// until it listens or exits.
func (e *env) dialer(serverDone <-chan struct{}) perfcmd.OOB {
	addr := netip.AddrPortFrom(e.g.Addr, rxelab.OOBPort).String()
	return perfcmd.OOB{Dial: func(ctx context.Context) (net.Conn, error) {
		for {
			var c net.Conn
			err := e.lab.InPeerNS(func() error {
				var err error
				d := net.Dialer{Timeout: 2 * time.Second}
				c, err = d.DialContext(ctx, "tcp", addr)
				return err
			})
			if err == nil {
				return c, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("connecting to the guest tool: %w (last: %v)", ctx.Err(), err)
			case <-serverDone:
				return nil, fmt.Errorf("guest tool exited before accepting (last dial: %v)", err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}}
}

// toolResult is a finished guest tool.
type toolResult struct {
	stdout, stderr string
	code           int
	err            error
}

func (r toolResult) String() string {
	return fmt.Sprintf("exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, r.err, r.stdout, r.stderr)
}

func (r toolResult) ok() bool { return r.err == nil && r.code == 0 }

// start runs a tool in the guest in the background.
func (e *env) start(ctx context.Context, args ...string) (*rxelab.Job, func() toolResult) {
	job := e.g.Start(ctx, args...)
	return job, func() toolResult {
		o, se, code, err := job.Wait()
		return toolResult{string(o), string(se), code, err}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// counterSet is a snapshot of named counters.
type counterSet map[string]uint64

// sub returns c − base for every counter that changed.
func (c counterSet) sub(base counterSet) counterSet {
	d := counterSet{}
	for k, v := range c {
		if v != base[k] {
			d[k] = v - base[k]
		}
	}
	return d
}

func (c counterSet) String() string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, c[k])
	}
	return b.String()
}

// guestCounters reads the guest's rxe0 port 1 hw_counters.
func (e *env) guestCounters(t *testing.T) counterSet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code, err := e.g.Exec(ctx, "sh", "-c", "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
	if err != nil || code != 0 {
		t.Fatalf("reading the guest's hw_counters: exit %d, %v: %s", code, err, errOut)
	}
	return parseCounters(string(out))
}

// parseCounters parses grep's "name:value" lines.
func parseCounters(s string) counterSet {
	c := counterSet{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			c[k] = n
		}
	}
	return c
}

func (e *env) ourCounters() counterSet { return counterSet(e.dev.Counters().Map()) }

// counters returns both sides' counters for failure reports.
func (e *env) counters(t *testing.T) string {
	return fmt.Sprintf("guest rxe0: %v\ngoroce: %v", e.guestCounters(t), e.ourCounters())
}

var _ io.Writer = (*captureSwitch)(nil)
