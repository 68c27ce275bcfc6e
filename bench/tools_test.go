//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// envRocectl makes the test binary run "rocectl <args>" (the arguments as a
// JSON array) instead of the tests: the perf ends are separate processes,
// each inside its namespace, running the same entry point as the rocectl
// binary.
const envRocectl = "GOROCE_BENCH_ROCECTL_ARGS"

// rocectlMain runs the rocectl command in args and exits with its status.
// Only "perf", the command the benchmark uses, is wired: it is the entry
// point rocectl registers for it.
func rocectlMain(argsJSON string) {
	var args []string
	if err := json.Unmarshal([]byte(argsJSON), &args); err != nil || len(args) == 0 {
		fmt.Fprintf(os.Stderr, "bad %s: %v\n", envRocectl, err)
		os.Exit(2)
	}
	switch args[0] {
	case "perf":
		os.Exit(perfrun.RunPerf(args[1:], os.Stdout, os.Stderr))
	}
	fmt.Fprintf(os.Stderr, "unknown command %q\n", args[0])
	os.Exit(2)
}

// rocectlCmd returns a command running "rocectl args..." as the re-executed
// test binary, bounded by ctx.
func rocectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	a, _ := json.Marshal(args)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRocectl+"="+string(a))
	return cmd
}

// waitListening waits until the process pid has a socket of proto ("tcp"
// listening, or "udp" bound) on port. It reads the process's own
// /proc/<pid>/net/<proto>{,6}, which shows its network namespace: probing
// by connecting would use up the single connection a perftest server
// accepts, and a UDP server cannot be probed without a message.
func waitListening(ctx context.Context, pid int, proto string, port int, exited <-chan struct{}) error {
	hexPort := fmt.Sprintf(":%04X", port)
	state := "0A" // TCP_LISTEN
	if proto == "udp" {
		state = "07" // TCP_CLOSE, what an unconnected UDP socket shows
	}
	for {
		for _, f := range []string{proto, proto + "6"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				fs := strings.Fields(sc.Text())
				// sl local_address rem_address st ...
				if len(fs) > 3 && strings.HasSuffix(fs[1], hexPort) && fs[3] == state {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for a %s socket on port %d: %w", proto, port, ctx.Err())
		case <-exited:
			return fmt.Errorf("server exited before opening %s port %d", proto, port)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// server is a background process started in a namespace.
type server struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	errb   bytes.Buffer
	done   chan struct{}
	waited error
}

// startServer starts cmd in ns and waits until it listens on TCP port.
func startServer(ctx context.Context, ns *netnstest.NS, cmd *exec.Cmd, port int) (*server, error) {
	return startServerProto(ctx, ns, cmd, "tcp", port)
}

// startServerProto starts cmd in ns and waits until it has a proto ("tcp"
// or "udp") socket on port.
func startServerProto(ctx context.Context, ns *netnstest.NS, cmd *exec.Cmd, proto string, port int) (*server, error) {
	s := &server{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &s.out, &s.errb
	if err := ns.Start(cmd); err != nil {
		return nil, err
	}
	go func() {
		s.waited = cmd.Wait()
		close(s.done)
	}()
	if err := waitListening(ctx, cmd.Process.Pid, proto, port, s.done); err != nil {
		s.kill()
		return nil, fmt.Errorf("%w (stderr: %s)", err, strings.TrimSpace(s.errb.String()))
	}
	return s, nil
}

// wait waits for the server to exit by itself (or ctx to end it).
func (s *server) wait() error {
	<-s.done
	if s.waited != nil {
		return fmt.Errorf("%s: %w (stderr: %s)", s.cmd.Args[0], s.waited, strings.TrimSpace(s.errb.String()))
	}
	return nil
}

// kill ends the server (a process this test started) and waits for it.
func (s *server) kill() {
	s.cmd.Process.Kill()
	<-s.done
}

// runClient runs cmd in ns to completion and returns its stdout.
func runClient(ns *netnstest.NS, cmd *exec.Cmd) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := ns.Run(cmd); err != nil {
		return out.Bytes(), fmt.Errorf("%w (stderr: %s)", err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// lastJSONLine decodes the last stdout line that holds a JSON object.
func lastJSONLine(out []byte, v any) error {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "{") {
			return json.Unmarshal([]byte(l), v)
		}
	}
	return fmt.Errorf("no JSON result in output %q", out)
}

// iperf3Result is the part of iperf3 -J's report the table uses.
type iperf3Result struct {
	End struct {
		SumSent     iperf3Sum `json:"sum_sent"`
		SumReceived iperf3Sum `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

type iperf3Sum struct {
	Bytes       uint64  `json:"bytes"`
	BitsPerSec  float64 `json:"bits_per_second"`
	LostPercent float64 `json:"lost_percent"`
	Seconds     float64 `json:"seconds"`
}

const iperf3Port = 5201

// iperf3UDPBuf is the UDP socket buffer size (-w) of both ends.
const iperf3UDPBuf = "8M"

// iperf3 runs one iperf3 client in a against a one-off server in b for d
// and returns the receiver's figure. udpLen > 0 selects UDP datagrams of
// that payload size, sent as fast as the sender can (-b 0).
func iperf3(ctx context.Context, p *netnstest.Pair, d time.Duration, udpLen int) (iperf3Result, error) {
	var res iperf3Result
	addr := p.VethB.Addr.Addr().String()
	srv, err := startServer(ctx, p.B, exec.CommandContext(ctx, "iperf3", "-s", "-1", "-B", addr, "-p", strconv.Itoa(iperf3Port)), iperf3Port)
	if err != nil {
		return res, err
	}
	secs := strconv.FormatFloat(max(d.Seconds(), 1), 'f', -1, 64) // iperf3 takes whole-ish seconds
	args := []string{"-c", addr, "-p", strconv.Itoa(iperf3Port), "-t", secs, "-J"}
	if udpLen > 0 {
		// -w: socket buffers large enough that the receiver does not
		// drop most of what an unpaced sender offers (with the default
		// buffers the figure is the drop rate, not the throughput).
		args = append(args, "-u", "-b", "0", "-l", strconv.Itoa(udpLen), "-w", iperf3UDPBuf)
	}
	out, cerr := runClient(p.A, exec.CommandContext(ctx, "iperf3", args...))
	if jerr := json.Unmarshal(out, &res); jerr != nil && cerr == nil {
		cerr = jerr
	}
	if serr := srv.wait(); serr != nil && cerr == nil {
		cerr = serr
	}
	if cerr == nil && res.Error != "" {
		cerr = errors.New(res.Error)
	}
	return res, cerr
}

// sockperfResult is what sockperf ping-pong reports: one-way latency (half
// the round trip), in microseconds.
type sockperfResult struct {
	Avg, Median, P99, P999, Min float64
	Observations                int
}

const sockperfPort = 11111

// sockperfMinSize is sockperf's smallest message: its own header.
const sockperfMinSize = 14

// sockperf runs a UDP ping-pong client in a against a server in b for d.
func sockperf(ctx context.Context, p *netnstest.Pair, d time.Duration, size int) (sockperfResult, error) {
	var res sockperfResult
	addr := p.VethB.Addr.Addr().String()
	port := strconv.Itoa(sockperfPort)
	srv, err := startServerProto(ctx, p.B, exec.CommandContext(ctx, "sockperf", "sr", "-i", addr, "-p", port), "udp", sockperfPort)
	if err != nil {
		return res, err
	}
	defer srv.kill()
	secs := strconv.Itoa(max(int(d.Round(time.Second)/time.Second), 1))
	out, err := runClient(p.A, exec.CommandContext(ctx, "sockperf", "pp", "-i", addr, "-p", port, "-m", strconv.Itoa(size), "-t", secs))
	if err != nil {
		return res, err
	}
	return parseSockperf(out)
}

// parseSockperf reads "avg-latency=", "percentile 50.000 =",
// "percentile 99.000 =" and "<MIN> observation =" from sockperf's summary.
func parseSockperf(out []byte) (sockperfResult, error) {
	var res sockperfResult
	var haveAvg, haveMed bool
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if _, rest, ok := strings.Cut(l, "avg-latency="); ok {
			f := strings.FieldsFunc(rest, func(r rune) bool { return r == ' ' || r == '(' })
			if len(f) > 0 {
				v, err := strconv.ParseFloat(f[0], 64)
				haveAvg = err == nil
				res.Avg = v
			}
		}
		if _, rest, ok := strings.Cut(l, "Total "); ok && strings.Contains(rest, "observations") {
			res.Observations, _ = strconv.Atoi(strings.Fields(rest)[0])
		}
		for _, pc := range []struct {
			key string
			dst *float64
			ok  *bool
		}{{"percentile 50.000 =", &res.Median, &haveMed}, {"percentile 99.000 =", &res.P99, nil}, {"percentile 99.900 =", &res.P999, nil}, {"<MIN> observation =", &res.Min, nil}} {
			if _, rest, ok := strings.Cut(l, pc.key); ok {
				v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				if err == nil {
					*pc.dst = v
					if pc.ok != nil {
						*pc.ok = true
					}
				}
			}
		}
	}
	if !haveAvg || !haveMed {
		return res, fmt.Errorf("no latency in sockperf output %q", out)
	}
	return res, nil
}

// envPingpong makes the test binary run one end of perfrun.Pingpong (the
// code behind "rocectl pingpong") with the pingpongRole in it (JSON) and
// print the result as JSON: the rocectl command prints no count of the
// messages whose bytes it checked, and this case exists to check them.
const envPingpong = "GOROCE_BENCH_PINGPONG"

// pingpongRole configures one end of the data check.
type pingpongRole struct {
	Ifname string `json:"ifname"`
	Link   string `json:"link"`   // "xdp" or "udp"
	Server string `json:"server"` // empty: wait for the client
	Size   int    `json:"size"`
	Iters  int    `json:"iters"`
	MTU    int    `json:"mtu"`
}

// pingpongMain runs one pingpong end and exits.
func pingpongMain(cfgJSON string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
	var c pingpongRole
	if err := json.Unmarshal([]byte(cfgJSON), &c); err != nil {
		fail(err)
	}
	kind := netdev.LinkUDP
	if c.Link == "xdp" {
		kind = netdev.LinkXDP
	}
	mtu, ok := ib.MTUFromBytes(c.MTU)
	if !ok {
		fail(fmt.Errorf("bad MTU %d", c.MTU))
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dev, err := netdev.Open(ctx, c.Ifname, netdev.Options{Link: kind, Device: roce.Options{Logger: logger}})
	if err != nil {
		fail(err)
	}
	defer dev.Close()
	var oob perfrun.OOB
	if c.Server != "" {
		oob.Dial = perfrun.DialRetry(net.JoinHostPort(c.Server, strconv.Itoa(perfrun.DefaultPort)), 0)
	} else {
		if oob.Listener, err = perfrun.ListenOOB(perfrun.DefaultPort); err != nil {
			fail(err)
		}
		defer oob.Listener.Close()
	}
	r, err := perfrun.Pingpong(ctx, dev, oob, perfrun.PingpongConfig{Type: roce.RC, Size: c.Size, Iters: c.Iters, MTU: mtu, GIDIndex: -1}, io.Discard)
	if err != nil {
		fail(err)
	}
	b, _ := json.Marshal(pingpongResult{r.Received, r.Echoed, r.Elapsed})
	fmt.Printf("%s\n", b)
	dev.Close()
	os.Exit(0)
}

// pingpongResult is what pingpongMain prints.
type pingpongResult struct {
	Received, Echoed int
	Elapsed          time.Duration
}

// pingpongCheck runs an RC ping-pong of size-byte messages between the
// namespaces over linkKind, both ends checking every message received.
func pingpongCheck(ctx context.Context, p *netnstest.Pair, linkKind string, size, iters int) (client, server pingpongResult, err error) {
	cmd := func(c pingpongRole) *exec.Cmd {
		b, _ := json.Marshal(c)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envPingpong+"="+string(b))
		return cmd
	}
	c := pingpongRole{Ifname: p.VethB.Name, Link: linkKind, Size: size, Iters: iters, MTU: roceMTU}
	srv, err := startServer(ctx, p.B, cmd(c), perfrun.DefaultPort)
	if err != nil {
		return client, server, fmt.Errorf("server: %w", err)
	}
	c.Ifname, c.Server = p.VethA.Name, p.VethB.Addr.Addr().String()
	out, cerr := runClient(p.A, cmd(c))
	if cerr != nil {
		srv.kill()
		return client, server, fmt.Errorf("client: %w", cerr)
	}
	if err := srv.wait(); err != nil {
		return client, server, fmt.Errorf("server: %w", err)
	}
	if err := lastJSONLine(out, &client); err != nil {
		return client, server, fmt.Errorf("client: %w", err)
	}
	if err := lastJSONLine(srv.out.Bytes(), &server); err != nil {
		return client, server, fmt.Errorf("server: %w", err)
	}
	return client, server, nil
}
