// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The lab's fixed addressing (see interop/README.md).
const (
	// PeerIf is the host side's interface in the peer netns.
	PeerIf = "rxeh0"
	// OOBPort is the TCP port of the ibv_*_pingpong / perftest exchange.
	OOBPort = 18515
	// DialTimeout bounds one TCP connection attempt to a guest server. It is
	// long on purpose: a guest's one-shot server (ibv_rc_pingpong, perftest)
	// that accepts a connection the dialer has just given up on reads EOF and
	// exits, so an attempt must not be abandoned while a loaded guest is
	// still answering. A refused attempt returns at once and is retried.
	DialTimeout = 30 * time.Second
)

var (
	// PeerAddr is rxeh0's IPv4 address.
	PeerAddr = netip.MustParseAddr("10.77.0.1")
	// PeerAddr6 is rxeh0's IPv6 address when the lab runs with IPv6.
	PeerAddr6 = netip.MustParseAddr("fd77::1")
)

// Config selects the lab's shape.
type Config struct {
	Guests      int           // number of rxe guests (default 1); guest i gets 10.77.0.(2+i)
	MTU         int           // bridge, veth and guest netdev MTU (default 9000: rxe path MTU 4096)
	IPv6        bool          // IPv6 on: rxeh0 gets fd77::1/64, guest i fd77::(2+i)/64
	BootTimeout time.Duration // per guest, from qemu start to rxe0 ACTIVE (default 5 min)
	// NIC is the guests' NIC model, "virtio" or "e1000" (default: the lab
	// CLI's, virtio unless RXE_LAB_NIC says otherwise; RXE_LAB_NIC, when
	// set, wins over this field too, for experiments).
	NIC string
	// Logf, if set, receives progress lines (boot times).
	Logf func(format string, args ...any)
}

// Lab is a running lab: two network namespaces and the guests on the bridge.
type Lab struct {
	NS        string           // the bridge netns (guests' taps live here)
	PeerNS    string           // the netns holding PeerIf
	PeerIf    string           // "rxeh0"
	PeerAddr  netip.Addr       // 10.77.0.1
	PeerAddr6 netip.Addr       // fd77::1, or the zero Addr without IPv6
	PeerMAC   net.HardwareAddr // by the lab's MAC rule: 52:54:00:4d:00:01
	MTU       int
	Guests    []*Guest

	cli         string
	nic         string
	bootTimeout time.Duration
	logf        func(format string, args ...any)
	restartMu   sync.Mutex    // held while a guest restarts; the watcher waits
	stopWatch   chan struct{} // closed by Close: ends the fault watcher
	closeOnce   sync.Once
	closeErr    error
}

// GID is one entry of a guest's rxe0 port 1 GID table.
type GID struct {
	Index int
	Addr  netip.Addr // the 16 raw bytes (IPv4-mapped for IPv4 GIDs)
	Type  string     // as sysfs names it, e.g. "RoCE v2"
}

// Guest is one qemu guest running rdma_rxe (device rxe0, port 1).
type Guest struct {
	Name      string
	Addr      netip.Addr // eth0 IPv4 address
	Addr6     netip.Addr // eth0 global IPv6 address, or zero
	MAC       net.HardwareAddr
	ActiveMTU int           // rxe0 port active_mtu in bytes
	GIDs      []GID         // non-zero GIDs, by index
	Boot      time.Duration // qemu start to rxe ready, wall clock
	Ready     string        // the guest's readiness report, verbatim

	lab   *Lab
	dir   string // the CLI's state folder of the guest (config, qemu.pid, console.log)
	watch guestWatch
}

// MACFor is the lab's MAC rule: 10.77.X.Y gives 52:54:00:4d:XX:YY.
func MACFor(a netip.Addr) net.HardwareAddr {
	b := a.Unmap().As4()
	return net.HardwareAddr{0x52, 0x54, 0x00, b[1], b[2], b[3]}
}

// GIDIndex returns the index of the GID whose address is a (an IPv4 a is
// looked up in its IPv4-mapped form).
func (g *Guest) GIDIndex(a netip.Addr) (int, bool) {
	want := netip.AddrFrom16(a.As16())
	for _, e := range g.GIDs {
		if e.Addr == want {
			return e.Index, true
		}
	}
	return 0, false
}

func (c *Config) defaults() {
	if c.Guests <= 0 {
		c.Guests = 1
	}
	if c.MTU == 0 {
		c.MTU = 9000
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = 5 * time.Minute
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// nsPrefix names the labs this package creates; the suffix is the pid.
const nsPrefix = "goroce-"

// Start builds the guest image if needed (installing missing host packages),
// removes labs left by dead test processes, and brings up a lab named after
// this process with cfg.Guests guests, booted in parallel. On error nothing is
// left behind. A *MissingError means the machine cannot run the lab.
func Start(ctx context.Context, cfg Config) (*Lab, error) {
	cfg.defaults()
	if cfg.Guests > 26 {
		return nil, fmt.Errorf("rxelab: at most 26 guests")
	}
	if err := Check(); err != nil {
		return nil, err
	}
	cli, err := findCLI()
	if err != nil {
		return nil, err
	}
	l := &Lab{
		NS:       nsPrefix + strconv.Itoa(os.Getpid()),
		PeerIf:   PeerIf,
		PeerAddr: PeerAddr,
		PeerMAC:  MACFor(PeerAddr),
		MTU:      cfg.MTU,
		cli:      cli,

		bootTimeout: cfg.BootTimeout,
		nic:         cfg.NIC,
		logf:        cfg.Logf,
		stopWatch:   make(chan struct{}),
	}
	l.PeerNS = l.NS + "-peer"
	t0 := time.Now()
	if _, stderr, code, err := l.run(ctx, "build", "--quiet"); err != nil || code != 0 {
		if qerr := CheckQEMU(); qerr != nil {
			return nil, qerr
		}
		return nil, fmt.Errorf("rxelab: building the guest image failed (exit %d, %v): %s", code, err, stderr)
	}
	if err := CheckQEMU(); err != nil {
		return nil, err
	}
	cfg.Logf("rxelab: guest image ready (%.1fs)", time.Since(t0).Seconds())
	l.sweepStale(ctx, cfg.Logf)

	args := []string{"net-up", "--ns", l.NS, "--mtu", strconv.Itoa(cfg.MTU)}
	if cfg.IPv6 {
		l.PeerAddr6 = PeerAddr6
		args = append(args, "--peer-addr6", PeerAddr6.String()+"/64")
	}
	if _, stderr, code, err := l.run(ctx, args...); err != nil || code != 0 {
		l.Close()
		return nil, fmt.Errorf("rxelab: net-up failed (exit %d, %v): %s", code, err, stderr)
	}

	pid := strconv.Itoa(os.Getpid())
	for i := 0; i < cfg.Guests; i++ {
		g := &Guest{
			Name: "g" + pid + "-" + string(rune('a'+i)),
			Addr: netip.AddrFrom4([4]byte{10, 77, 0, byte(2 + i)}),
			lab:  l,
		}
		if cfg.IPv6 {
			b := PeerAddr6.As16()
			b[15] = byte(2 + i)
			g.Addr6 = netip.AddrFrom16(b)
		}
		l.Guests = append(l.Guests, g)
	}
	errs := make([]error, len(l.Guests))
	var wg sync.WaitGroup
	for i, g := range l.Guests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.boot(ctx, g, cfg.BootTimeout)
			if errs[i] != nil {
				return
			}
			cfg.Logf("rxelab: guest %s (%v) up in %.1fs, active_mtu %d, GIDs %v",
				g.Name, g.Addr, g.Boot.Seconds(), g.ActiveMTU, g.GIDs)
			// A test's first exchange must not depend on neighbour
			// discovery finishing within rxe's one-second budget.
			t0 := time.Now()
			if errs[i] = g.ResolvePeer(ctx); errs[i] == nil {
				cfg.Logf("rxelab: guest %s resolved the peer's addresses in %.1fs", g.Name, time.Since(t0).Seconds())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		l.Close()
		return nil, err
	}
	go l.watchGuests(l.stopWatch)
	return l, nil
}

func (l *Lab) boot(ctx context.Context, g *Guest, timeout time.Duration) error {
	args := []string{"up", g.Name, "--addr", g.Addr.String() + "/24", "--ns", l.NS,
		"--mtu", strconv.Itoa(l.MTU), "--timeout", strconv.Itoa(int(timeout.Seconds()))}
	if g.Addr6.IsValid() {
		args = append(args, "--addr6", g.Addr6.String()+"/64")
	}
	if l.nic != "" && os.Getenv("RXE_LAB_NIC") == "" {
		args = append(args, "--nic", l.nic)
	}
	t0 := time.Now()
	stdout, stderr, code, err := l.run(ctx, args...)
	g.Boot = time.Since(t0)
	if err != nil || code != 0 {
		return fmt.Errorf("rxelab: guest %s did not come up (exit %d, %v): %s%s", g.Name, code, err, stdout, stderr)
	}
	share, _, code, err := l.run(ctx, "share", g.Name)
	if err != nil || code != 0 {
		return fmt.Errorf("rxelab: share of %s: exit %d, %v", g.Name, code, err)
	}
	g.dir = filepath.Dir(strings.TrimSpace(string(share)))
	g.watch.init()
	ready, err := os.ReadFile(g.dir + "/share/ready")
	if err != nil {
		return fmt.Errorf("rxelab: readiness report of %s: %w", g.Name, err)
	}
	return g.parseReady(string(ready))
}

var gidLine = regexp.MustCompile(`^gid([0-9]+)=([0-9a-f:]{39})(?: (.*))?$`)

// parseReady reads the guest's readiness report (key=value lines).
func (g *Guest) parseReady(report string) error {
	g.Ready = report
	g.GIDs = nil
	for _, line := range strings.Split(report, "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch {
		case k == "status" && v != "ok":
			return fmt.Errorf("rxelab: guest %s: %s", g.Name, v)
		case k == "mac":
			mac, err := net.ParseMAC(v)
			if err != nil {
				return fmt.Errorf("rxelab: guest %s: bad mac %q", g.Name, v)
			}
			g.MAC = mac
		case k == "active_mtu":
			// "4096 (5)"
			f := strings.Fields(v)
			if len(f) > 0 {
				g.ActiveMTU, _ = strconv.Atoi(f[0])
			}
		case strings.HasPrefix(k, "gid"):
			m := gidLine.FindStringSubmatch(line)
			if m == nil {
				return fmt.Errorf("rxelab: guest %s: bad GID line %q", g.Name, line)
			}
			raw, err := hex.DecodeString(strings.ReplaceAll(m[2], ":", ""))
			if err != nil || len(raw) != 16 {
				return fmt.Errorf("rxelab: guest %s: bad GID %q", g.Name, m[2])
			}
			idx, _ := strconv.Atoi(m[1])
			g.GIDs = append(g.GIDs, GID{Index: idx, Addr: netip.AddrFrom16([16]byte(raw)), Type: m[3]})
		}
	}
	if g.MAC == nil || g.ActiveMTU == 0 || len(g.GIDs) == 0 {
		return fmt.Errorf("rxelab: guest %s: incomplete readiness report:\n%s", g.Name, report)
	}
	if _, ok := g.GIDIndex(g.Addr); !ok {
		return fmt.Errorf("rxelab: guest %s: no GID for %v", g.Name, g.Addr)
	}
	if g.Addr6.IsValid() {
		if _, ok := g.GIDIndex(g.Addr6); !ok {
			return fmt.Errorf("rxelab: guest %s: no GID for %v", g.Name, g.Addr6)
		}
	}
	return nil
}

// Close powers the guests off and removes both namespaces. It is safe to
// call more than once and from several goroutines.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		if l.stopWatch != nil {
			close(l.stopWatch)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// --now: the guests keep no state worth a clean poweroff, and a
		// teardown racing the -timeout alarm must be quick.
		_, stderr, code, err := l.run(ctx, "net-down", "--ns", l.NS, "--force", "--now")
		if err != nil || code != 0 {
			l.closeErr = fmt.Errorf("rxelab: net-down %s (exit %d, %v): %s", l.NS, code, err, stderr)
		}
	})
	return l.closeErr
}

// sweepStale removes labs of this package whose process is gone (a test
// binary killed by a signal or by its -timeout alarm cannot clean up).
func (l *Lab) sweepStale(ctx context.Context, logf func(string, ...any)) {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), nsPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(rest)
		if err != nil || pid == os.Getpid() || processAlive(pid) {
			continue
		}
		logf("rxelab: removing stale lab %s", e.Name())
		if _, stderr, code, err := l.run(ctx, "net-down", "--ns", e.Name(), "--force", "--now"); err != nil || code != 0 {
			logf("rxelab: removing %s: exit %d %v %s", e.Name(), code, err, stderr)
		}
	}
}

// processAlive tells whether pid still runs a Go test binary.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return false
	}
	return strings.HasSuffix(strings.TrimSpace(string(comm)), ".test")
}

var execCommand = exec.CommandContext

// run runs the lab CLI. SIGTERM on ctx cancellation lets it clean up (an exec
// cancels its guest job).
func (l *Lab) run(ctx context.Context, args ...string) (stdout, stderr []byte, code int, err error) {
	cmd := exec.CommandContext(ctx, l.cli, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	code = -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && ctx.Err() == nil {
		err = nil // a non-zero exit is reported through code
	} else if ctx.Err() != nil {
		err = fmt.Errorf("rxe-lab %s: %w", args[0], ctx.Err())
	}
	return o.Bytes(), e.Bytes(), code, err
}
