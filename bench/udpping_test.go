//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
)

// A kernel UDP ping-pong in Go: the latency baseline at exactly the size
// goroce's send-lat uses (sockperf's smallest message is 14 bytes), and
// the baseline when sockperf is not installed. Each end is the test binary
// re-executed in its namespace, blocking in the kernel through Go's
// netpoller, as goroce's UDP link does.
const (
	envUDPEcho  = "GOROCE_BENCH_UDPECHO" // server: address:port to echo on
	envUDPPing  = "GOROCE_BENCH_UDPPING" // client: udpPingConfig as JSON
	udpPingPort = 11112
	// udpPingWarmup round trips are not measured.
	udpPingWarmup = 200
)

type udpPingConfig struct {
	Server   string        `json:"server"` // address:port
	Size     int           `json:"size"`
	Duration time.Duration `json:"duration"`
}

// udpPingResult is one-way latency (half the round trip) in microseconds.
type udpPingResult struct {
	Median, Avg, P99, P999, Min float64
	Samples                     int
}

// udpEchoMain echoes every datagram back to its sender until killed.
func udpEchoMain(addr string) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udp echo:", err)
		os.Exit(2)
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		fmt.Fprintln(os.Stderr, "udp echo:", err)
		os.Exit(1)
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udp echo:", err)
			os.Exit(1)
		}
		c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// udpPingMain runs round trips for the configured duration and prints a
// udpPingResult as JSON.
func udpPingMain(cfgJSON string) {
	var cfg udpPingConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "udp ping:", err)
		os.Exit(2)
	}
	r, err := udpPing(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udp ping:", err)
		os.Exit(1)
	}
	b, _ := json.Marshal(r)
	fmt.Printf("%s\n", b)
	os.Exit(0)
}

func udpPing(cfg udpPingConfig) (udpPingResult, error) {
	var res udpPingResult
	ap, err := netip.ParseAddrPort(cfg.Server)
	if err != nil {
		return res, err
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return res, err
	}
	defer c.Close()
	msg := make([]byte, cfg.Size)
	for i := range msg {
		msg[i] = byte(i)
	}
	in := make([]byte, cfg.Size+1)
	rtts := make([]time.Duration, 0, 1<<16)
	var end time.Time
	for i := 0; ; i++ {
		if i == udpPingWarmup {
			end = time.Now().Add(cfg.Duration)
		}
		if i > udpPingWarmup && i%64 == 0 && time.Now().After(end) {
			break
		}
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return res, err
		}
		// A lost datagram (veth does not lose them unless a queue
		// overflows) ends the run rather than skewing it.
		c.SetReadDeadline(start.Add(time.Second))
		n, err := c.Read(in)
		if err != nil {
			return res, fmt.Errorf("round trip %d: %w", i, err)
		}
		rtt := time.Since(start)
		if n != cfg.Size || string(in[:n]) != string(msg) {
			return res, errors.New("echo differs from the message sent")
		}
		if i >= udpPingWarmup {
			rtts = append(rtts, rtt)
		}
	}
	if len(rtts) == 0 {
		return res, errors.New("no round trips measured")
	}
	slices.Sort(rtts)
	var sum time.Duration
	for _, d := range rtts {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / 2 / float64(time.Microsecond) }
	res.Min = us(rtts[0])
	res.Median = us(rtts[len(rtts)/2])
	res.P99 = us(rtts[len(rtts)*99/100])
	res.P999 = us(rtts[len(rtts)*999/1000])
	res.Avg = us(sum / time.Duration(len(rtts)))
	res.Samples = len(rtts)
	return res, nil
}

// goUDPPing runs the echo server in B and the ping client in A.
func goUDPPing(ctx context.Context, p *netnstest.Pair, d time.Duration, size int) (udpPingResult, error) {
	var res udpPingResult
	addr := netip.AddrPortFrom(p.VethB.Addr.Addr(), udpPingPort).String()
	echo := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	echo.Env = append(os.Environ(), envUDPEcho+"="+addr)
	srv, err := startServerProto(ctx, p.B, echo, "udp", udpPingPort)
	if err != nil {
		return res, fmt.Errorf("echo server: %w", err)
	}
	defer srv.kill()
	cfg, _ := json.Marshal(udpPingConfig{Server: addr, Size: size, Duration: d})
	ping := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	ping.Env = append(os.Environ(), envUDPPing+"="+string(cfg))
	out, err := runClient(p.A, ping)
	if err != nil {
		return res, err
	}
	return res, lastJSONLine(out, &res)
}
