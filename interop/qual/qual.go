// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// SharedDevice is the goroce device on rxeh0, opened once.
type SharedDevice struct {
	// Capture, if set before the first Setup, receives the device's pcap
	// capture (roce.Options.Capture).
	Capture io.Writer
	// UDP, if set before the first Setup, opens the device on the kernel
	// UDP link (netdev.LinkUDP) instead of AF_XDP.
	UDP bool
	// CC, if set before the first Setup, is the device's congestion
	// control (roce.Options.CC).
	CC roce.CCConfig

	once sync.Once
	dev  *roce.Device
	err  error
}

// Shared is the test binary's goroce device on rxeh0.
var Shared SharedDevice

// Close closes the device if it was opened.
func (s *SharedDevice) Close() {
	if s.dev != nil {
		s.dev.Close()
	}
}

// Env is what every test needs: the lab, its guest and our device.
type Env struct {
	// Lab is the running lab.
	Lab *rxelab.Lab
	// Guest is the lab's first guest, where the tools run.
	Guest *rxelab.Guest
	// Dev is the shared goroce device on rxeh0.
	Dev *roce.Device
	// GIDIndex is the guest's GID index of its IPv4 address.
	GIDIndex int
	// OurGIDIndex is the GID index goroce's side uses: -1, the first IPv4
	// GID, unless the Env came from IPv6.
	OurGIDIndex int
}

// IPv6 returns e with both sides on their IPv6 GIDs (the out-of-band
// exchange stays on IPv4). It fails the test if the lab runs without IPv6.
func (e *Env) IPv6(t testing.TB) *Env {
	t.Helper()
	if !e.Guest.Addr6.IsValid() || !e.Lab.PeerAddr6.IsValid() {
		t.Fatalf("the lab runs without IPv6")
	}
	theirs, ok := e.Guest.GIDIndex(e.Guest.Addr6)
	if !ok {
		t.Fatalf("guest %s has no GID for %v: %v", e.Guest.Name, e.Guest.Addr6, e.Guest.GIDs)
	}
	ours, err := e.Dev.GIDIndex(e.Lab.PeerAddr6)
	if err != nil {
		t.Fatalf("goroce has no GID for %v: %v", e.Lab.PeerAddr6, err)
	}
	e6 := *e
	e6.GIDIndex, e6.OurGIDIndex = theirs, ours
	return &e6
}

// Setup returns the lab (started on first use) and the shared device,
// opened in the peer netns on first use, over AF_XDP or, with Shared.UDP,
// over the kernel UDP link.
func Setup(t testing.TB) *Env {
	t.Helper()
	lab := rxelab.Get(t)
	kind := netdev.LinkXDP
	if Shared.UDP {
		kind = netdev.LinkUDP
	}
	Shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		Shared.err = lab.InPeerNS(func() error {
			var err error
			Shared.dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Link: kind, Device: roce.Options{Logger: logger, Capture: Shared.Capture, CC: Shared.CC}})
			return err
		})
	})
	if Shared.err != nil {
		if kind == netdev.LinkXDP && errors.Is(Shared.err, roce.ErrNotSupported) {
			t.Skipf("AF_XDP on %s: %v", lab.PeerIf, Shared.err)
		}
		t.Fatalf("opening goroce on %s over %v: %v", lab.PeerIf, kind, Shared.err)
	}
	g := lab.Guests[0]
	idx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest %s has no GID for %v: %v", g.Name, g.Addr, g.GIDs)
	}
	return &Env{Lab: lab, Guest: g, Dev: Shared.dev, GIDIndex: idx, OurGIDIndex: -1}
}

// Listen opens the out-of-band listener on rxeh0's address in the peer
// netns, for a guest tool that connects to us.
func (e *Env) Listen(t testing.TB) perfrun.OOB {
	t.Helper()
	var ln net.Listener
	err := e.Lab.InPeerNS(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(e.Lab.PeerAddr, rxelab.OOBPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listening on the OOB port: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return perfrun.OOB{Listener: ln}
}

// Dialer connects to the guest tool's server from the peer netns, retrying
// until it listens or exits.
func (e *Env) Dialer(serverDone <-chan struct{}) perfrun.OOB {
	addr := netip.AddrPortFrom(e.Guest.Addr, rxelab.OOBPort).String()
	return perfrun.OOB{Dial: func(ctx context.Context) (net.Conn, error) {
		for {
			var c net.Conn
			err := e.Lab.InPeerNS(func() error {
				var err error
				d := net.Dialer{Timeout: rxelab.DialTimeout}
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

// ToolResult is a finished guest tool.
type ToolResult struct {
	// Stdout and Stderr are what the tool printed.
	Stdout, Stderr string
	// Code is the tool's exit status.
	Code int
	// Err is why the tool could not be run or waited for.
	Err error
}

// String formats the result for failure reports.
func (r ToolResult) String() string {
	return fmt.Sprintf("exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.Code, r.Err, r.Stdout, r.Stderr)
}

// OK reports whether the tool ran and exited 0.
func (r ToolResult) OK() bool { return r.Err == nil && r.Code == 0 }

// Start runs a tool in the guest in the background; the returned function
// waits for it to end.
func (e *Env) Start(ctx context.Context, args ...string) (*rxelab.Job, func() ToolResult) {
	job := e.Guest.Start(ctx, args...)
	return job, func() ToolResult {
		o, se, code, err := job.Wait()
		return ToolResult{string(o), string(se), code, err}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// counters returns the guest's rxe0 counters and ours, for failure reports.
func (e *Env) counters() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _, _, err := e.Guest.Exec(ctx, "sh", "-c", "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
	s := "guest rxe0:\n" + string(out)
	if err != nil {
		s += err.Error()
	}
	return s + fmt.Sprintf("\ngoroce: %v", e.Dev.Counters().Map())
}

// PingpongCase is one pingpong qualification run.
type PingpongCase struct {
	Type   roce.QPType
	Size   int
	MTU    int // RC path MTU
	Events bool
	Iters  int
}

func (c PingpongCase) tool() string {
	if c.Type == roce.UD {
		return "ibv_ud_pingpong"
	}
	return "ibv_rc_pingpong"
}

// Name names the case for t.Run.
func (c PingpongCase) Name() string {
	n := fmt.Sprintf("size%d", c.Size)
	if c.Type == roce.RC {
		n += fmt.Sprintf("/mtu%d", c.MTU)
	}
	if c.Events {
		n += "/events"
	}
	return n
}

func (c PingpongCase) toolArgs(e *Env, server string) []string {
	args := []string{c.tool(), "-d", "rxe0", "-g", itoa(e.GIDIndex), "-s", itoa(c.Size), "-n", itoa(c.Iters)}
	if c.Type == roce.RC {
		args = append(args, "-m", itoa(c.MTU))
	}
	if c.Events {
		args = append(args, "-e")
	}
	if server != "" {
		args = append(args, server)
	}
	return args
}

func (c PingpongCase) config(e *Env) perfrun.PingpongConfig {
	m, _ := ib.MTUFromBytes(c.MTU)
	return perfrun.PingpongConfig{Type: c.Type, Size: c.Size, Iters: c.Iters, MTU: m, Events: c.Events, GIDIndex: e.OurGIDIndex}
}

// PerfVerbs returns a bandwidth and a latency case of every perftest verb
// (send, write, read, atomic) at path MTU mtu: bandwidth messages of size
// bytes (atomics: the tool's own 8) and bwIters iterations, latency runs of
// latIters.
func PerfVerbs(mtu, size, bwIters, latIters int) []PerfCase {
	var cases []PerfCase
	for v := perftest.Send; v <= perftest.Atomic; v++ {
		n := 0
		if v != perftest.Atomic {
			n = size
		}
		cases = append(cases, PerfCase{Verb: v, MTU: mtu, Size: n, Iters: bwIters},
			PerfCase{Verb: v, Latency: true, MTU: mtu, Iters: latIters})
	}
	return cases
}

// PingpongBothRoles runs each case twice, as the subtests
// "goroce-server/NAME" and "goroce-client/NAME".
func PingpongBothRoles(t *testing.T, e *Env, cases []PingpongCase) {
	bothRoles(t, e, cases, PingpongGoroceServer, PingpongGoroceClient)
}

// PerfBothRoles is PingpongBothRoles for perftest cases.
func PerfBothRoles(t *testing.T, e *Env, cases []PerfCase) {
	bothRoles(t, e, cases, PerfGoroceServer, PerfGoroceClient)
}

func bothRoles[C interface{ Name() string }](t *testing.T, e *Env, cases []C, server, client func(testing.TB, *Env, C)) {
	t.Helper()
	for _, c := range cases {
		t.Run("goroce-server/"+c.Name(), func(t *testing.T) { server(t, e, c) })
		t.Run("goroce-client/"+c.Name(), func(t *testing.T) { client(t, e, c) })
	}
}

// caseTimeout bounds one run of a case: each takes seconds to a minute of
// a TCG guest; the tools' own contexts below give up at 3 minutes.
const caseTimeout = 4 * time.Minute

// bounded runs one case under the lab's watch (rxelab.Lab.Case): a guest
// whose NIC stalls or whose qemu stops ends the attempt at once, and the
// case runs once more on the restarted guest.
func (e *Env) bounded(t *testing.T, run func(testing.TB)) {
	t.Helper()
	e.Lab.Case(t, rxelab.CaseOptions{Timeout: caseTimeout, Guests: []*rxelab.Guest{e.Guest}},
		func(_ context.Context, tb testing.TB) { run(tb) })
}

// PingpongGoroceServer runs the case with goroce as server and the guest tool as client.
func PingpongGoroceServer(t testing.TB, e *Env, c PingpongCase) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	oob := e.Listen(t)
	t0 := time.Now()
	_, wait := e.Start(ctx, c.toolArgs(e, e.Lab.PeerAddr.String())...)
	var out bytes.Buffer
	res, err := perfrun.Pingpong(ctx, e.Dev, oob, c.config(e), &out)
	tool := wait()
	if err != nil || !tool.OK() {
		t.Fatalf("goroce server: %v\n%s\nour output:\n%s\nguest %s\n%s", err, out.String(), out.String(), tool, e.counters())
	}
	checkPingpong(t, c, res, out.String(), tool)
	t.Logf("%s client in the guest, goroce server: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.Stdout)
}

// PingpongGoroceClient runs the case with goroce as client and the guest tool as server.
func PingpongGoroceClient(t testing.TB, e *Env, c PingpongCase) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	job, wait := e.Start(ctx, c.toolArgs(e, "")...)
	var out bytes.Buffer
	res, err := perfrun.Pingpong(ctx, e.Dev, e.Dialer(job.Done()), c.config(e), &out)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.OK() {
		t.Fatalf("goroce client: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPingpong(t, c, res, out.String(), tool)
	t.Logf("%s server in the guest, goroce client: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.Stdout)
}

func checkPingpong(t testing.TB, c PingpongCase, res *perfrun.PingpongResult, ours string, tool ToolResult) {
	t.Helper()
	want := fmt.Sprintf("%d iters in", c.Iters)
	if !strings.Contains(tool.Stdout, want) || !strings.Contains(ours, want) {
		t.Errorf("result lines missing %q\nours:\n%s\ntool:\n%s", want, ours, tool.Stdout)
	}
	// Each side's remote line is the other's local line.
	ourLocal := lineWith(ours, "local address:")
	toolRemote := lineWith(tool.Stdout, "remote address:")
	if f1, f2 := addrFields(ourLocal), addrFields(toolRemote); f1 != f2 {
		t.Errorf("tool saw us as %q, we announced %q", toolRemote, ourLocal)
	}
	if res.Received != c.Iters {
		t.Errorf("received %d messages, want %d", res.Received, c.Iters)
	}
	wantEcho := res.Received
	if res.FirstFromPeer {
		wantEcho-- // the tool's own first buffer
	}
	if res.Echoed < wantEcho {
		t.Errorf("%d of %d messages came back as the bytes we sent, want %d", res.Echoed, res.Received, wantEcho)
	}
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// addrFields returns the QPN, PSN and GID of an address line.
func addrFields(l string) string {
	i := strings.Index(l, "QPN")
	if i < 0 {
		return l
	}
	return strings.NewReplacer(":", ",", " ", "").Replace(l[i:])
}

// PerfCase is one perftest qualification run.
type PerfCase struct {
	Verb    perftest.Verb
	Latency bool
	MTU     int
	Size    int // 0: the tool's default
	Iters   int
	Gbits   bool
	// RDMACM runs perftest's -R mode: both the exchange and the test QP
	// connect with rdma_cm (on the OOB port's number) instead of TCP.
	RDMACM bool
}

func (c PerfCase) tool() string {
	n := [...]string{"send", "write", "read", "atomic"}[c.Verb]
	if c.Latency {
		return "ib_" + n + "_lat"
	}
	return "ib_" + n + "_bw"
}

// Name names the case for t.Run.
func (c PerfCase) Name() string {
	n := fmt.Sprintf("%s/mtu%d", c.tool(), c.MTU)
	if c.Gbits {
		n += "/gbits"
	}
	if c.RDMACM {
		n += "/rdma_cm"
	}
	return n
}

func (c PerfCase) toolArgs(e *Env, server string) []string {
	args := []string{c.tool(), "-d", "rxe0", "-x", itoa(e.GIDIndex), "-F", "-n", itoa(c.Iters), "-m", itoa(c.MTU)}
	if c.Size != 0 {
		args = append(args, "-s", itoa(c.Size))
	}
	if c.Gbits {
		args = append(args, "--report_gbits")
	}
	if c.RDMACM {
		args = append(args, "-R")
	}
	if server != "" {
		args = append(args, server)
	}
	return args
}

func (c PerfCase) config(e *Env) perfrun.PerfConfig {
	m, _ := ib.MTUFromBytes(c.MTU)
	return perfrun.PerfConfig{Verb: c.Verb, Latency: c.Latency, Size: c.Size, Iters: c.Iters, MTU: m,
		GIDIndex: e.OurGIDIndex, Gbits: c.Gbits}
}

// PerfGoroceServer runs the case with goroce as server and the guest tool as client.
func PerfGoroceServer(t testing.TB, e *Env, c PerfCase) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	oob := perfrun.OOB{RDMACM: &perfrun.RDMACM{Listen: netip.AddrPortFrom(netip.IPv4Unspecified(), rxelab.OOBPort)}}
	if !c.RDMACM {
		oob = e.Listen(t)
	}
	t0 := time.Now()
	_, wait := e.Start(ctx, c.toolArgs(e, e.Lab.PeerAddr.String())...)
	var out bytes.Buffer
	res, err := perfrun.Perf(ctx, e.Dev, oob, c.config(e), &out, false)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.OK() {
		t.Fatalf("goroce server: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPerf(t, c, res, out.String(), tool, true)
	t.Logf("%s client in the guest, goroce server: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.Stdout)
}

// PerfGoroceClient runs the case with goroce as client and the guest tool as server.
func PerfGoroceClient(t testing.TB, e *Env, c PerfCase) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	job, wait := e.Start(ctx, c.toolArgs(e, "")...)
	var out bytes.Buffer
	oob := e.Dialer(job.Done())
	if c.RDMACM {
		oob = perfrun.OOB{RDMACM: &perfrun.RDMACM{Peer: netip.AddrPortFrom(e.Guest.Addr, rxelab.OOBPort)}}
	}
	res, err := perfrun.Perf(ctx, e.Dev, oob, c.config(e), &out, false)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.OK() {
		t.Fatalf("goroce client: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPerf(t, c, res, out.String(), tool, false)
	t.Logf("%s server in the guest, goroce client: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.Stdout)
}

func checkPerf(t testing.TB, c PerfCase, res []perfrun.PerfResult, ours string, tool ToolResult, goroceServer bool) {
	t.Helper()
	// Address lines: ours local is the tool's remote, and the other way.
	for _, pair := range [][2]string{{"local address:", "remote address:"}, {"remote address:", "local address:"}} {
		a, b := afterColon(lineWith(ours, pair[0])), afterColon(lineWith(tool.Stdout, pair[1]))
		if a == "" || a != b {
			t.Errorf("our %q line %q, the tool's %q line %q", pair[0], a, pair[1], b)
		}
	}
	mode := " rdma_cm QPs\t : OFF\n Data ex. method : Ethernet\n"
	if c.RDMACM {
		mode = " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm"
	}
	for who, s := range map[string]string{"tool": tool.Stdout, "goroce": ours} {
		if !strings.Contains(s, fmt.Sprintf(" Mtu             : %d[B]\n", c.MTU)) {
			t.Errorf("%s did not run at MTU %d:\n%s", who, c.MTU, s)
		}
		if !strings.Contains(s, mode) {
			t.Errorf("%s's header lacks %q:\n%s", who, mode, s)
		}
	}
	toolPassive := !goroceServer && !c.Latency && c.Verb != perftest.Send ||
		!goroceServer && c.Latency && (c.Verb == perftest.Read || c.Verb == perftest.Atomic)
	oursPassive := goroceServer && c.Latency && (c.Verb == perftest.Read || c.Verb == perftest.Atomic)
	ourRow, toolRow := resultRow(ours), resultRow(tool.Stdout)
	switch {
	case toolPassive && c.Latency:
		// The tool's read/atomic latency server prints no row.
	case oursPassive:
		if toolRow == "" {
			t.Errorf("tool printed no result row:\n%s", tool.Stdout)
		}
	case !c.Latency && c.Verb != perftest.Send:
		// One side measured, both print the same report.
		if ourRow == "" || ourRow != toolRow {
			t.Errorf("bandwidth rows differ:\nours: %q\ntool: %q", ourRow, toolRow)
		}
	default:
		if ourRow == "" || toolRow == "" {
			t.Errorf("missing result row:\nours:\n%s\ntool:\n%s", ours, tool.Stdout)
		}
	}
	if ourRow != "" {
		f := strings.Fields(ourRow)
		if len(f) < 2 || f[1] != itoa(c.Iters) {
			t.Errorf("our row %q does not show %d iterations", ourRow, c.Iters)
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
