package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	ebpflink "github.com/cilium/ebpf/link"
	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where "rocectl link attach" pins the bpf_link of an
// attached steering program.
const DefaultPinDir = "/sys/fs/bpf/goroce"

func init() {
	register("link", command{
		summary: "attach, detach and show the XDP steering program (ip link set dev X xdp, bpftool net)",
		run:     runLink,
	})
}

const linkUsage = `usage: rocectl link attach -d IFACE [--mode auto|driver|generic] [--frags] [--port 4791] [--foreground [--duration D]]
       rocectl link detach -d IFACE
       rocectl link show [-d IFACE] [-j]

Mirrors "ip link set dev IFACE xdp ..." and "bpftool net show" for goroce's
XDP steering program (package bpf), which sends UDP port 4791 to AF_XDP
sockets and every other frame to the kernel.

attach loads the program and attaches it with a bpf_link. A bpf_link
leaves the interface when its last holder exits, so attach pins it at
` + DefaultPinDir + `/IFACE (…/netns-INODE/IFACE outside the initial network
namespace): the program then stays attached, counting the RoCEv2 frames it
sees, until "rocectl link detach". With no AF_XDP socket registered it
passes every frame on to the kernel (counted as no_socket). bpffs is mounted
on /sys/fs/bpf if it is not. A goroce device (netdev.Open) cannot attach its
own program while a pinned one is there: detach first.
With --foreground nothing is pinned: attach holds the program until it is
interrupted (SIGINT/SIGTERM) or --duration passes, prints the counters and
detaches; the program also leaves if the process is killed.

detach removes a pinned program, or a goroce program attached through
rtnetlink. A program held by a running process (a goroce device) is left to
that process; another program is left to "ip link set dev IFACE xdp off".

show lists the XDP programs of the network namespace (or of IFACE): id,
mode, whether the program is goroce's and pinned, and for goroce's its
redirected/no_socket/passed counters (read from the kernel by program id:
needs CAP_SYS_ADMIN or CAP_BPF).

flags:`

// runLink attaches, detaches and lists goroce's XDP steering program.
// Equivalent to: `ip link set dev $iface xdp{,generic,drv} obj ... ; bpftool link pin`,
// `ip link set dev $iface xdp off` and `bpftool net show [dev $iface]`.
func runLink(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			lf := linkFlags("", stdout)
			lf.fs.Usage()
			return 0
		}
		// "rocectl link" alone shows, like "ip link".
		args = append([]string{"show"}, args...)
	}
	sub := args[0]
	lf := linkFlags(sub, stderr)
	if err := cliflag.Parse(lf.fs, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if lf.fs.NArg() != 0 {
		fmt.Fprintf(stderr, "rocectl link %s: unexpected argument %q\n", sub, lf.fs.Arg(0))
		return 2
	}
	if lf.dev != "" && !validIfname(lf.dev) {
		fmt.Fprintf(stderr, "rocectl link %s: invalid interface name %q\n", sub, lf.dev)
		return 2
	}
	var err error
	switch sub {
	case "attach", "detach":
		if lf.dev == "" {
			fmt.Fprintf(stderr, "rocectl link %s: -d IFACE is required\n", sub)
			return 2
		}
		if sub == "attach" {
			err = linkAttach(lf, stdout)
		} else {
			err = linkDetach(lf, stdout)
		}
	case "show", "list", "ls":
		err = linkShow(lf, stdout)
	default:
		fmt.Fprintf(stderr, "rocectl link: unknown subcommand %q (attach, detach or show)\n", sub)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocectl link %s: %v\n", sub, err)
		return 1
	}
	return 0
}

// validIfname accepts what the kernel accepts as an interface name
// (dev_valid_name), which also keeps it a single path element under the pin
// directory.
func validIfname(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) < unix.IFNAMSIZ &&
		!strings.ContainsAny(name, "/: \t\n\x00")
}

type linkOpts struct {
	fs         *flag.FlagSet
	dev        string
	mode       string
	frags      bool
	port       uint
	foreground bool
	duration   time.Duration
	json       bool
	pinDir     string
}

func linkFlags(sub string, out io.Writer) *linkOpts {
	o := &linkOpts{fs: flag.NewFlagSet("link "+sub, flag.ContinueOnError)}
	fs := o.fs
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), linkUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.dev, "d", "", "network `interface`")
	fs.StringVar(&o.mode, "mode", "auto", "attach: XDP `mode`: auto (driver, else generic), driver or generic")
	fs.BoolVar(&o.frags, "frags", false, "attach: load with BPF_F_XDP_HAS_FRAGS (Linux 5.18), for frames larger than a page in driver mode")
	fs.UintVar(&o.port, "port", bpf.DefaultPort, "attach: UDP destination `port` to steer")
	fs.BoolVar(&o.foreground, "foreground", false, "attach: pin nothing; hold the program until interrupted or --duration")
	fs.DurationVar(&o.duration, "duration", 0, "attach --foreground: detach after this `duration` (0: wait for a signal)")
	fs.BoolVar(&o.json, "j", false, "show: JSON output")
	fs.StringVar(&o.pinDir, "pin-dir", DefaultPinDir, "`directory` on a bpffs for the pins")
	return o
}

func parseMode(s string) (bpf.AttachMode, error) {
	switch s {
	case "", "auto":
		return bpf.AttachAuto, nil
	case "driver", "drv", "native":
		return bpf.AttachDriver, nil
	case "generic", "skb":
		return bpf.AttachGeneric, nil
	}
	return 0, fmt.Errorf("unknown mode %q (auto, driver or generic)", s)
}

// nsPinDir is the pin directory for the calling thread's network namespace:
// interface names repeat across namespaces, the bpffs does not.
func nsPinDir(base string) (string, error) {
	self, err := nsInode("/proc/thread-self/ns/net")
	if err != nil {
		return "", fmt.Errorf("network namespace: %w", err)
	}
	if initNS, err := nsInode("/proc/1/ns/net"); err == nil && initNS == self {
		return base, nil
	}
	return filepath.Join(base, fmt.Sprintf("netns-%d", self)), nil
}

func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func pinPath(base, ifname string) (string, error) {
	dir, err := nsPinDir(base)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, ifname), nil
}

// ensureBPFFS makes sure dir can hold pins: it must lie on a bpffs. As
// bpftool does, a missing bpffs on /sys/fs/bpf is mounted.
func ensureBPFFS(dir string) error {
	if isBPFFS(dir) {
		return nil
	}
	const std = "/sys/fs/bpf"
	if dir == std || strings.HasPrefix(dir, std+"/") {
		if !isBPFFS(std) {
			if err := unix.Mount("bpf", std, "bpf", 0, "mode=0700"); err != nil {
				return fmt.Errorf("mount bpffs on %s: %w", std, err)
			}
		}
		if isBPFFS(dir) {
			return nil
		}
	}
	return fmt.Errorf("%s is not on a bpf filesystem", dir)
}

// isBPFFS reports whether the nearest existing ancestor of dir is on a
// bpffs.
func isBPFFS(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			return st.Type == unix.BPF_FS_MAGIC
		}
		if !errors.Is(err, unix.ENOENT) || d == "/" {
			return false
		}
	}
}

// linkAttach loads the program, attaches it with a bpf_link and pins the
// link, or holds it in the foreground.
// Equivalent to: `ip link set dev $iface xdp obj goroce.o` followed by
// `bpftool link pin id $id /sys/fs/bpf/goroce/$iface`.
func linkAttach(o *linkOpts, stdout io.Writer) error {
	mode, err := parseMode(o.mode)
	if err != nil {
		return err
	}
	if o.port == 0 || o.port > 65535 {
		return fmt.Errorf("invalid port %d", o.port)
	}
	ifi, err := net.InterfaceByName(o.dev)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", bpf.ErrNoInterface, o.dev, err)
	}
	if info, err := bpf.Attached(ifi.Index); err == nil && info.Attached {
		return fmt.Errorf("%w: %s runs program id %d %q in %v mode", bpf.ErrBusy, o.dev, info.ProgramID, info.Name, info.Mode)
	}
	p, err := bpf.Load(bpf.Options{Port: uint16(o.port), Frags: o.frags})
	if err != nil {
		return err
	}
	defer p.Close()
	id, _ := p.ID()
	if o.foreground {
		return attachForeground(o, p, ifi, mode, id, stdout)
	}
	path, err := pinPath(o.pinDir, o.dev)
	if err != nil {
		return err
	}
	if err := ensureBPFFS(o.pinDir); err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s exists (a stale pin? 'rocectl link detach -d %s' removes it)", path, o.dev)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	lk, used, err := attachLink(p, ifi, mode)
	if err != nil {
		return err
	}
	defer lk.Close()
	if err := lk.Pin(path); err != nil {
		return fmt.Errorf("pin %s: %w", path, err)
	}
	fmt.Fprintf(stdout, "%s: attached %s (id %d) in %v mode, port %d; pinned at %s until 'rocectl link detach -d %s'\n",
		o.dev, devstat.ProgramName, id, used, o.port, path, o.dev)
	return nil
}

// attachLink attaches p to ifi with a bpf_link the caller can pin (package
// bpf keeps its own links private), trying driver then generic mode for
// AttachAuto.
func attachLink(p *bpf.Program, ifi *net.Interface, mode bpf.AttachMode) (ebpflink.Link, bpf.AttachMode, error) {
	// ebpf.NewProgramFromFD takes ownership of the descriptor.
	fd, err := unix.FcntlInt(uintptr(p.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("dup program fd: %w", err)
	}
	prog, err := ebpf.NewProgramFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	defer prog.Close()
	modes := []bpf.AttachMode{mode}
	if mode == bpf.AttachAuto {
		modes = []bpf.AttachMode{bpf.AttachDriver, bpf.AttachGeneric}
	}
	var errs []string
	for _, m := range modes {
		flags := ebpflink.XDPDriverMode
		if m == bpf.AttachGeneric {
			flags = ebpflink.XDPGenericMode
		}
		lk, err := ebpflink.AttachXDP(ebpflink.XDPOptions{Program: prog, Interface: ifi.Index, Flags: flags})
		if err == nil {
			return lk, m, nil
		}
		switch {
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
			return nil, 0, fmt.Errorf("%w: %s: %v", bpf.ErrBusy, ifi.Name, err)
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
			return nil, 0, fmt.Errorf("%w: %v", bpf.ErrPermission, err)
		case errors.Is(err, ebpf.ErrNotSupported):
			return nil, 0, &bpf.UnsupportedError{Feature: "bpf_link for XDP (pinnable attachment)", MinKernel: "5.9", Err: err}
		case errors.Is(err, unix.ERANGE) && m == bpf.AttachDriver && !p.Options().Frags:
			err = fmt.Errorf("%w (frames larger than one page need --frags)", err)
		}
		errs = append(errs, fmt.Sprintf("%v mode: %v", m, err))
	}
	return nil, 0, fmt.Errorf("attach to %s: %s", ifi.Name, strings.Join(errs, "; "))
}

func attachForeground(o *linkOpts, p *bpf.Program, ifi *net.Interface, mode bpf.AttachMode, id uint32, stdout io.Writer) error {
	a, err := p.Attach(ifi.Index, mode)
	if err != nil {
		return err
	}
	defer a.Close()
	fmt.Fprintf(stdout, "%s: attached %s (id %d) in %v mode, port %d, not pinned: detaches when this process ends\n",
		o.dev, devstat.ProgramName, id, a.Mode(), o.port)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	<-ctx.Done()
	st, err := p.Stats()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: redirected %d no_socket %d passed %d other_addr %d; detached\n", o.dev, st.Redirected, st.NoSocket, st.Passed, st.OtherAddr)
	return a.Close()
}

// linkDetach removes a pinned (or rtnetlink-attached) goroce program.
// Equivalent to: `rm /sys/fs/bpf/goroce/$iface` (the last reference to the
// bpf_link) or `ip link set dev $iface xdp off`.
func linkDetach(o *linkOpts, stdout io.Writer) error {
	path, err := pinPath(o.pinDir, o.dev)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil {
		lk, err := ebpflink.LoadPinnedLink(path, nil)
		if err != nil {
			return fmt.Errorf("open pin %s: %w", path, err)
		}
		defunct := false
		if li, err := lk.Info(); err == nil {
			if x := li.XDP(); x != nil && x.Ifindex == 0 {
				defunct = true
			}
		}
		// Unpinning drops the pin's reference, closing ours the last one:
		// the kernel then detaches the program.
		if err := lk.Unpin(); err != nil {
			lk.Close()
			return fmt.Errorf("unpin %s: %w", path, err)
		}
		if err := lk.Close(); err != nil {
			return err
		}
		// The per-namespace directory goes with its last pin.
		if dir := filepath.Dir(path); dir != filepath.Clean(o.pinDir) {
			_ = os.Remove(dir)
		}
		if defunct {
			fmt.Fprintf(stdout, "%s: removed stale pin %s (the interface it was attached to is gone)\n", o.dev, path)
		} else {
			fmt.Fprintf(stdout, "%s: detached (pin %s removed)\n", o.dev, path)
		}
		return nil
	}
	ifi, err := net.InterfaceByName(o.dev)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", bpf.ErrNoInterface, o.dev, err)
	}
	info, err := bpf.Attached(ifi.Index)
	if err != nil {
		return err
	}
	if !info.Attached {
		return fmt.Errorf("%s has no XDP program", o.dev)
	}
	if info.Name != devstat.ProgramName {
		return fmt.Errorf("%s runs program id %d %q, not goroce's: use 'ip link set dev %s xdp off'", o.dev, info.ProgramID, info.Name, o.dev)
	}
	// Not pinned: attached through rtnetlink (kernels before 5.9, or a
	// process that died), or held by a live bpf_link, which rtnetlink may
	// not remove (EBUSY).
	flags := unix.XDP_FLAGS_DRV_MODE
	if info.Mode == bpf.AttachGeneric {
		flags = unix.XDP_FLAGS_SKB_MODE
	}
	if err := netlinkXDPOff(ifi.Index, flags); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%s: program id %d is held by a running process's bpf_link (a goroce device?): stop that process", o.dev, info.ProgramID)
		}
		return fmt.Errorf("detach program id %d from %s: %w", info.ProgramID, o.dev, err)
	}
	fmt.Fprintf(stdout, "%s: detached program id %d (rtnetlink)\n", o.dev, info.ProgramID)
	return nil
}

// netlinkXDPOff removes the XDP program of ifindex in the given mode through
// rtnetlink.
func netlinkXDPOff(ifindex, flags int) error {
	dev := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	return netlink.LinkSetXdpFdWithFlags(dev, -1, flags)
}

// linkEntry is one line of "link show".
type linkEntry struct {
	Interface string         `json:"interface"`
	Ifindex   int            `json:"ifindex,omitempty"`
	ProgramID uint32         `json:"program_id,omitempty"`
	Mode      string         `json:"mode,omitempty"`
	Name      string         `json:"name,omitempty"`
	Goroce    bool           `json:"goroce"`
	Pinned    string         `json:"pinned,omitempty"`
	Stale     bool           `json:"stale,omitempty"` // a pin whose interface is gone or runs another program
	Steering  *steeringEntry `json:"steering,omitempty"`
	StatsErr  string         `json:"stats_error,omitempty"`
}

type steeringEntry struct {
	Redirected uint64 `json:"redirected"`
	NoSocket   uint64 `json:"no_socket"`
	Passed     uint64 `json:"passed"`
	OtherAddr  uint64 `json:"other_addr"`
}

// pinnedProgram returns the program id a pin's link holds and its
// ifindex (0 once the interface is gone).
func pinnedProgram(path string) (uint32, uint32, error) {
	lk, err := ebpflink.LoadPinnedLink(path, nil)
	if err != nil {
		return 0, 0, err
	}
	defer lk.Close()
	li, err := lk.Info()
	if err != nil {
		return 0, 0, err
	}
	var ifindex uint32
	if x := li.XDP(); x != nil {
		ifindex = x.Ifindex
	}
	return uint32(li.Program), ifindex, nil
}

// xdpEntry describes the XDP program of one interface (nil: none and no
// pin).
func xdpEntry(ifi net.Interface, pinDir string) (*linkEntry, error) {
	info, err := bpf.Attached(ifi.Index)
	if err != nil {
		return nil, err
	}
	e := &linkEntry{Interface: ifi.Name, Ifindex: ifi.Index}
	if path, err := pinPath(pinDir, ifi.Name); err == nil {
		if _, err := os.Lstat(path); err == nil {
			e.Pinned = path
			id, idx, err := pinnedProgram(path)
			if err != nil || idx == 0 || int(idx) != ifi.Index || id != info.ProgramID {
				e.Stale = true
			}
		}
	}
	if !info.Attached {
		if e.Pinned == "" {
			return nil, nil
		}
		return e, nil
	}
	e.ProgramID, e.Mode, e.Name = info.ProgramID, info.Mode.String(), info.Name
	e.Goroce = info.Name == devstat.ProgramName
	if e.Goroce {
		if st, err := devstat.ProgramStats(info.ProgramID); err == nil {
			e.Steering = &steeringEntry{st.Redirected, st.NoSocket, st.Passed, st.OtherAddr}
		} else {
			e.StatsErr = err.Error()
		}
	}
	return e, nil
}

// linkShow lists XDP programs with goroce's counters.
// Equivalent to: `bpftool net show [dev $iface]` and `bpftool map dump` of
// the program's counter map.
func linkShow(o *linkOpts, stdout io.Writer) error {
	var ifs []net.Interface
	if o.dev != "" {
		ifi, err := net.InterfaceByName(o.dev)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", bpf.ErrNoInterface, o.dev, err)
		}
		ifs = []net.Interface{*ifi}
	} else {
		var err error
		if ifs, err = net.Interfaces(); err != nil {
			return err
		}
	}
	entries := []*linkEntry{}
	seen := map[string]bool{}
	for _, ifi := range ifs {
		e, err := xdpEntry(ifi, o.pinDir)
		if err != nil {
			return fmt.Errorf("%s: %w", ifi.Name, err)
		}
		seen[ifi.Name] = true
		if e != nil || o.dev != "" {
			if e == nil {
				e = &linkEntry{Interface: ifi.Name, Ifindex: ifi.Index}
			}
			entries = append(entries, e)
		}
	}
	if o.dev == "" {
		// Pins of interfaces that no longer exist in this namespace.
		if dir, err := nsPinDir(o.pinDir); err == nil {
			des, _ := os.ReadDir(dir)
			for _, de := range des {
				if de.IsDir() || seen[de.Name()] {
					continue
				}
				entries = append(entries, &linkEntry{Interface: de.Name(), Pinned: filepath.Join(dir, de.Name()), Stale: true})
			}
		}
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Ifindex < entries[j].Ifindex })
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(entries)
	}
	fmt.Fprintln(stdout, "xdp:")
	for _, e := range entries {
		writeLinkEntry(stdout, e)
	}
	return nil
}

func writeLinkEntry(w io.Writer, e *linkEntry) {
	if e.ProgramID == 0 && e.Mode == "" {
		if e.Pinned != "" {
			fmt.Fprintf(w, "%s(%d) no program, stale pin %s\n", e.Interface, e.Ifindex, e.Pinned)
		} else {
			fmt.Fprintf(w, "%s(%d) no program\n", e.Interface, e.Ifindex)
		}
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s(%d) %s id %d", e.Interface, e.Ifindex, e.Mode, e.ProgramID)
	if e.Name != "" {
		fmt.Fprintf(&b, " name %s", e.Name)
	}
	switch {
	case e.Goroce && e.Pinned != "" && !e.Stale:
		fmt.Fprintf(&b, " goroce pinned %s", e.Pinned)
	case e.Goroce:
		b.WriteString(" goroce (held by a process)")
	default:
		b.WriteString(" not goroce")
	}
	if e.Stale && e.Pinned != "" {
		fmt.Fprintf(&b, " (stale pin %s)", e.Pinned)
	}
	fmt.Fprintln(w, b.String())
	if e.Steering != nil {
		fmt.Fprintf(w, "\tredirected %d no_socket %d passed %d\n", e.Steering.Redirected, e.Steering.NoSocket, e.Steering.Passed)
	} else if e.StatsErr != "" {
		fmt.Fprintf(w, "\tcounters unavailable: %s\n", e.StatsErr)
	}
}
