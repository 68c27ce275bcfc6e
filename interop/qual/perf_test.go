// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/perftest"
)

type perfCase struct {
	verb    perftest.Verb
	latency bool
	mtu     int
	size    int // 0: the tool's default
	iters   int
	gbits   bool
}

func (c perfCase) tool() string {
	n := [...]string{"send", "write", "read", "atomic"}[c.verb]
	if c.latency {
		return "ib_" + n + "_lat"
	}
	return "ib_" + n + "_bw"
}

func (c perfCase) name() string {
	n := fmt.Sprintf("%s/mtu%d", c.tool(), c.mtu)
	if c.gbits {
		n += "/gbits"
	}
	return n
}

func (c perfCase) toolArgs(e *env, server string) []string {
	args := []string{c.tool(), "-d", "rxe0", "-x", itoa(e.gidIndex), "-F", "-n", itoa(c.iters), "-m", itoa(c.mtu)}
	if c.size != 0 {
		args = append(args, "-s", itoa(c.size))
	}
	if c.gbits {
		args = append(args, "--report_gbits")
	}
	if server != "" {
		args = append(args, server)
	}
	return args
}

func (c perfCase) config() perfcmd.PerfConfig {
	m, _ := ib.MTUFromBytes(c.mtu)
	return perfcmd.PerfConfig{Verb: c.verb, Latency: c.latency, Size: c.size, Iters: c.iters, MTU: m,
		GIDIndex: -1, Gbits: c.gbits}
}

// TestPerftest runs every perftest test (send, write, read, atomic; BW and
// latency) in the guest against rocectl perf on goroce, each side as server
// and as client, at path MTU 1024 and 2048. Where one side prints the other's
// numbers (the server of a write, read or atomic BW test prints the client's
// report), the row must be the same bytes on both ends; each side's remote
// address line must be the other's local one.
func TestPerftest(t *testing.T) {
	e := setup(t)
	var cases []perfCase
	for _, mtu := range []int{1024, 2048} {
		for v := perftest.Send; v <= perftest.Atomic; v++ {
			size := 0
			if v != perftest.Atomic {
				size = 16384
			}
			cases = append(cases, perfCase{verb: v, mtu: mtu, size: size, iters: 200})
			cases = append(cases, perfCase{verb: v, latency: true, mtu: mtu, iters: 100})
		}
	}
	cases = append(cases, perfCase{verb: perftest.Write, mtu: 2048, size: 65536, iters: 100, gbits: true})
	for _, c := range cases {
		t.Run("goroce-server/"+c.name(), func(t *testing.T) { perfGoroceServer(t, e, c) })
		t.Run("goroce-client/"+c.name(), func(t *testing.T) { perfGoroceClient(t, e, c) })
	}
}

func perfGoroceServer(t *testing.T, e *env, c perfCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	oob := e.listen(t)
	t0 := time.Now()
	_, wait := e.start(ctx, c.toolArgs(e, e.lab.PeerAddr.String())...)
	var out bytes.Buffer
	res, err := perfcmd.Perf(ctx, e.dev, oob, c.config(), &out, false)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.ok() {
		t.Fatalf("goroce server: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPerf(t, c, res, out.String(), tool, true)
	t.Logf("%s client in the guest, goroce server: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.stdout)
}

func perfGoroceClient(t *testing.T, e *env, c perfCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	job, wait := e.start(ctx, c.toolArgs(e, "")...)
	var out bytes.Buffer
	res, err := perfcmd.Perf(ctx, e.dev, e.dialer(job.Done()), c.config(), &out, false)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.ok() {
		t.Fatalf("goroce client: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPerf(t, c, res, out.String(), tool, false)
	t.Logf("%s server in the guest, goroce client: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.stdout)
}

func checkPerf(t *testing.T, c perfCase, res []perfcmd.PerfResult, ours string, tool toolResult, goroceServer bool) {
	t.Helper()
	// Address lines: ours local is the tool's remote, and the other way.
	for _, pair := range [][2]string{{"local address:", "remote address:"}, {"remote address:", "local address:"}} {
		a, b := afterColon(lineWith(ours, pair[0])), afterColon(lineWith(tool.stdout, pair[1]))
		if a == "" || a != b {
			t.Errorf("our %q line %q, the tool's %q line %q", pair[0], a, pair[1], b)
		}
	}
	for who, s := range map[string]string{"tool": tool.stdout, "goroce": ours} {
		if !strings.Contains(s, fmt.Sprintf(" Mtu             : %d[B]\n", c.mtu)) {
			t.Errorf("%s did not run at MTU %d:\n%s", who, c.mtu, s)
		}
	}
	toolPassive := !goroceServer && !c.latency && c.verb != perftest.Send ||
		!goroceServer && c.latency && (c.verb == perftest.Read || c.verb == perftest.Atomic)
	oursPassive := goroceServer && c.latency && (c.verb == perftest.Read || c.verb == perftest.Atomic)
	ourRow, toolRow := resultRow(ours), resultRow(tool.stdout)
	switch {
	case toolPassive && c.latency:
		// The tool's read/atomic latency server prints no row.
	case oursPassive:
		if toolRow == "" {
			t.Errorf("tool printed no result row:\n%s", tool.stdout)
		}
	case !c.latency && c.verb != perftest.Send:
		// One side measured, both print the same report.
		if ourRow == "" || ourRow != toolRow {
			t.Errorf("bandwidth rows differ:\nours: %q\ntool: %q", ourRow, toolRow)
		}
	default:
		if ourRow == "" || toolRow == "" {
			t.Errorf("missing result row:\nours:\n%s\ntool:\n%s", ours, tool.stdout)
		}
	}
	if ourRow != "" {
		f := strings.Fields(ourRow)
		if len(f) < 2 || f[1] != itoa(c.iters) {
			t.Errorf("our row %q does not show %d iterations", ourRow, c.iters)
		}
	}
	if len(res) == 0 && !oursPassive {
		t.Errorf("no result")
	}
}

func afterColon(l string) string {
	_, r, _ := strings.Cut(l, "address:")
	return r
}

// resultRow returns the line after the column header, with its newline.
func resultRow(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, " #bytes") && i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "---") {
			return lines[i+1]
		}
	}
	return ""
}
