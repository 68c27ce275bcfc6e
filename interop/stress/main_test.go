// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// labMTU gives rxe an active MTU of 2048 while a frame still fits one
// 4096-byte UMEM chunk, so AF_XDP attaches without multi-buffer.
const labMTU = 3000

func TestMain(m *testing.M) {
	qual.Shared.Capture = &capture
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: labMTU,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	qual.Shared.Close()
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

// capture is the shared device's capture writer.
var capture captureSwitch

// env is qual's lab environment plus the device's capture switch.
type env struct {
	*qual.Env
	cap *captureSwitch
}

// setup returns the lab and the shared device, opened with the capture
// switch as its pcap writer.
func setup(t *testing.T) *env {
	t.Helper()
	return &env{Env: qual.Setup(t), cap: &capture}
}

// tap is the guest's tap device in the lab netns (rxe-lab names it so).
func (e *env) tap() string { return "rxt-" + e.Guest.Name }

// closeWhenDone closes a server's listener once the guest tool has ended
// or ctx is done, so an Accept waiting for a tool that died returns.
func closeWhenDone(ctx context.Context, oob perfrun.OOB, job *rxelab.Job) {
	go func() {
		select {
		case <-job.Done():
		case <-ctx.Done():
		}
		oob.Listener.Close()
	}()
}

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
	out, errOut, code, err := e.Guest.Exec(ctx, "sh", "-c", "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
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

func (e *env) ourCounters() counterSet { return counterSet(e.Dev.Counters().Map()) }

// counters returns both sides' counters for failure reports.
func (e *env) counters(t *testing.T) string {
	return fmt.Sprintf("guest rxe0: %v\ngoroce: %v", e.guestCounters(t), e.ourCounters())
}

var _ io.Writer = (*captureSwitch)(nil)
