package devstat

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/roce"
	"golang.org/x/sys/unix"
)

// FromStats converts bpf.Stats.
func FromStats(s bpf.Stats) *Steering {
	return &Steering{Redirected: s.Redirected, NoSocket: s.NoSocket, Passed: s.Passed, OtherAddr: s.OtherAddr}
}

// steeringLink is implemented by the AF_XDP link.
type steeringLink interface {
	SteeringStats() (bpf.Stats, error)
	AttachMode() bpf.AttachMode
}

// Publisher serves a device's counters until Close.
type Publisher struct {
	dev     *roce.Device
	ln      *net.UnixListener
	command string
	started time.Time
	wg      sync.WaitGroup
	once    sync.Once
}

// Publish serves dev's counters on SocketPrefix + the device's interface
// name. Call it from a thread in the interface's network namespace (as for
// netdev.Open), since abstract sockets belong to a network namespace. command
// names the rocectl command that runs the device, for the reader's
// information.
//
// A device on the kernel UDP link bound to one address, on an interface
// another process already publishes (two processes on lo, each on its own
// 127.0.0.x), publishes as IF@ADDR instead.
func Publish(dev *roce.Device, command string) (*Publisher, error) {
	name := dev.Info().Name
	if err := checkName(name); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: SocketPrefix + name, Net: "unix"})
	if errors.Is(err, syscall.EADDRINUSE) {
		if b, ok := dev.Link().(interface{ LocalAddr() netip.AddrPort }); ok {
			if a := b.LocalAddr().Addr(); a.IsValid() && !a.IsUnspecified() {
				name += "@" + a.String()
				ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: SocketPrefix + name, Net: "unix"})
			}
		}
	}
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("%w: %s", ErrPublished, name)
		}
		return nil, fmt.Errorf("devstat: listen: %w", err)
	}
	p := &Publisher{dev: dev, ln: ln, command: command, started: time.Now()}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// checkName refuses names that cannot be interface names (optionally
// followed by @ and an IP address), so a reader cannot be pointed at an
// unrelated abstract socket.
func checkName(name string) error {
	ifname, addr, bound := strings.Cut(name, "@")
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ || strings.ContainsAny(ifname, "/ \x00") {
		return fmt.Errorf("devstat: invalid interface name %q", name)
	}
	if a, err := netip.ParseAddr(addr); bound && (err != nil || a.String() != addr) {
		return fmt.Errorf("devstat: invalid interface name %q", name)
	}
	return nil
}

func (p *Publisher) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: back off, keep serving.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.answer(c)
	}
}

// answer writes one snapshot to a permitted peer. Requests are answered
// one at a time; a snapshot is a few hundred bytes.
func (p *Publisher) answer(c *net.UnixConn) {
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if !permitted(c) {
		return
	}
	_ = json.NewEncoder(c).Encode(p.Snapshot())
}

// permitted allows root and the publishing user.
func permitted(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return cred.Uid == 0 || int(cred.Uid) == os.Geteuid()
}

// Snapshot returns the counters now.
func (p *Publisher) Snapshot() Snapshot {
	info := p.dev.Info()
	s := Snapshot{
		Interface: info.Name,
		PID:       os.Getpid(),
		Command:   p.command,
		Link:      info.Link.Kind,
		Fallback:  info.Fallback,
		Started:   p.started,
		Time:      time.Now(),
		Counters:  p.dev.Counters().Map(),
	}
	if sl, ok := p.dev.Link().(steeringLink); ok {
		if st, err := sl.SteeringStats(); err == nil {
			s.Steering = FromStats(st)
			s.Steering.Mode = sl.AttachMode().String()
		}
	}
	return s
}

// Close stops serving.
func (p *Publisher) Close() error {
	var err error
	p.once.Do(func() {
		err = p.ln.Close()
		p.wg.Wait()
	})
	return err
}

// Query asks the device publishing interface name in the caller's network
// namespace for a snapshot. ErrNoDevice means nobody publishes it.
func Query(ctx context.Context, name string) (Snapshot, error) {
	if err := checkName(name); err != nil {
		return Snapshot{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", SocketPrefix+name)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return Snapshot{}, fmt.Errorf("%w: %s", ErrNoDevice, name)
		}
		return Snapshot{}, fmt.Errorf("devstat: %s: %w", name, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	var s Snapshot
	b, err := io.ReadAll(io.LimitReader(c, 1<<20))
	if err != nil {
		return Snapshot{}, fmt.Errorf("devstat: read %s: %w", name, err)
	}
	if len(b) == 0 {
		return Snapshot{}, fmt.Errorf("devstat: %s: the device refused the request (root or its user only)", name)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return Snapshot{}, fmt.Errorf("devstat: decode %s: %w", name, err)
	}
	return s, nil
}

// List returns the interfaces published in the calling thread's network
// namespace, sorted.
func List() ([]string, error) {
	f, err := os.Open("/proc/thread-self/net/unix")
	if err != nil {
		return nil, fmt.Errorf("devstat: %w", err)
	}
	defer f.Close()
	return parseUnix(f)
}

// parseUnix reads /proc/net/unix: the path, if any, is the eighth field;
// listening sockets have __SO_ACCEPTCON (0x10000) in their flags.
func parseUnix(r io.Reader) ([]string, error) {
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 || !strings.HasPrefix(f[7], SocketPrefix) {
			continue
		}
		var flags uint64
		if _, err := fmt.Sscanf(f[3], "%x", &flags); err != nil || flags&0x10000 == 0 {
			continue
		}
		name := strings.TrimPrefix(f[7], SocketPrefix)
		if checkName(name) == nil {
			seen[name] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("devstat: read unix socket table: %w", err)
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// ProgramStats reads the decision counters of the steering program with
// kernel id progID through its per-CPU counter map, summed over CPUs. It
// needs CAP_SYS_ADMIN (or CAP_BPF) to open objects by id. A program that
// is not goroce's gives ErrNotSteering.
func ProgramStats(progID uint32) (bpf.Stats, error) {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(progID))
	if err != nil {
		return bpf.Stats{}, fmt.Errorf("devstat: open program %d: %w", progID, err)
	}
	defer prog.Close()
	pi, err := prog.Info()
	if err != nil {
		return bpf.Stats{}, fmt.Errorf("devstat: program %d info: %w", progID, err)
	}
	if pi.Name != ProgramName {
		return bpf.Stats{}, fmt.Errorf("%w: program %d is %q", ErrNotSteering, progID, pi.Name)
	}
	ids, _ := pi.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil || mi.Name != StatsMapName || mi.Type != ebpf.PerCPUArray || mi.MaxEntries < 3 {
			m.Close()
			continue
		}
		s, err := readStats(m)
		m.Close()
		return s, err
	}
	return bpf.Stats{}, fmt.Errorf("%w: program %d has no %s map", ErrNotSteering, progID, StatsMapName)
}

// readStats sums the per-CPU slots of the counter array, whose indexes are
// the fields of bpf.Stats in order (a test pins this against
// bpf.Program.Stats).
func readStats(m *ebpf.Map) (bpf.Stats, error) {
	var s bpf.Stats
	var perCPU []uint64
	fields := []*uint64{&s.Redirected, &s.NoSocket, &s.Passed, &s.OtherAddr}
	if info, err := m.Info(); err == nil && int(info.MaxEntries) < len(fields) {
		fields = fields[:info.MaxEntries] // a program from before OtherAddr
	}
	for i, dst := range fields {
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return bpf.Stats{}, fmt.Errorf("devstat: read counters: %w", err)
		}
		for _, v := range perCPU {
			*dst += v
		}
	}
	return s, nil
}
