//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// AttachMode selects where the XDP program runs.
type AttachMode int

const (
	// AttachAuto tries driver mode, then generic mode.
	AttachAuto AttachMode = iota
	// AttachDriver runs the program in the driver (native XDP); needed for
	// zero-copy AF_XDP.
	AttachDriver
	// AttachGeneric runs the program on the skb path (works on any
	// interface, copy mode only, slower).
	AttachGeneric
	// AttachOffload is reported by Attached for a program offloaded to the
	// NIC; Attach does not use it.
	AttachOffload
	// AttachMulti is reported by Attached when programs are attached in
	// several modes at once.
	AttachMulti
)

func (m AttachMode) String() string {
	switch m {
	case AttachAuto:
		return "auto"
	case AttachDriver:
		return "driver"
	case AttachGeneric:
		return "generic"
	case AttachOffload:
		return "offload"
	case AttachMulti:
		return "multi"
	}
	return fmt.Sprintf("AttachMode(%d)", int(m))
}

// forceNetlink makes Attach skip bpf_link, so tests can exercise the
// fallback used on kernels before 5.9.
var forceNetlink bool

// Attachment is the program attached to one interface.
type Attachment struct {
	p       *Program
	ifindex int
	mode    AttachMode

	mu     sync.Mutex
	closed bool
	lnk    link.Link      // bpf_link attachment (Linux >= 5.9)
	ns     netns.NsHandle // netlink attachment: the namespace of ifindex
	progID uint32         // netlink attachment: our program's id
}

// Mode returns the mode the program was attached in (driver or generic).
func (a *Attachment) Mode() AttachMode { return a.mode }

// Ifindex returns the interface index.
func (a *Attachment) Ifindex() int { return a.ifindex }

// ViaLink reports whether the attachment is a bpf_link, which the kernel
// removes when the process dies. The netlink fallback (kernels before 5.9)
// stays attached until Close.
func (a *Attachment) ViaLink() bool { return a.lnk != nil }

// Attach attaches the program to the interface ifindex of the calling
// thread's network namespace. It uses a bpf_link (Linux 5.9), so the
// program is detached when the Attachment or the Program is closed and when
// the process exits; on older kernels it falls back to rtnetlink, where the
// program stays attached if the process dies without Close.
//
// AttachAuto tries driver mode first, then generic mode. An interface that
// already has an XDP program gives ErrBusy.
func (p *Program) Attach(ifindex int, mode AttachMode) (*Attachment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	var modes []AttachMode
	switch mode {
	case AttachAuto:
		modes = []AttachMode{AttachDriver, AttachGeneric}
	case AttachDriver, AttachGeneric:
		modes = []AttachMode{mode}
	default:
		return nil, fmt.Errorf("bpf: attach mode %v not supported", mode)
	}
	// The netlink socket, the ifindex and the namespace handle must all
	// refer to one thread's namespace.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l, err := linkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	var errs modeErrors
	for _, m := range modes {
		a, err := p.attachMode(l, m)
		if err == nil {
			p.attachments[a] = struct{}{}
			return a, nil
		}
		if errors.Is(err, ErrBusy) || errors.Is(err, ErrPermission) {
			return nil, err
		}
		errs = append(errs, &modeError{m, err})
	}
	return nil, fmt.Errorf("bpf: attach to %s (ifindex %d): %w", l.Attrs().Name, ifindex, errs)
}

// modeError is why attaching in one mode failed.
type modeError struct {
	mode AttachMode
	err  error
}

func (e *modeError) Error() string { return fmt.Sprintf("%v mode: %v", e.mode, e.err) }
func (e *modeError) Unwrap() error { return e.err }

// modeErrors lists the failure of each mode tried, keeping them all
// visible to errors.Is and errors.As.
type modeErrors []*modeError

func (es modeErrors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

func (es modeErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func linkByIndex(ifindex int) (netlink.Link, error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("%w: ifindex %d", ErrNoInterface, ifindex)
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		var lnf netlink.LinkNotFoundError
		if errors.Is(err, unix.ENODEV) || errors.As(err, &lnf) {
			return nil, fmt.Errorf("%w: ifindex %d in this network namespace", ErrNoInterface, ifindex)
		}
		return nil, fmt.Errorf("bpf: look up ifindex %d: %w", ifindex, err)
	}
	return l, nil
}

func (p *Program) attachMode(l netlink.Link, m AttachMode) (*Attachment, error) {
	ifindex := l.Attrs().Index
	lflags, nlflags := link.XDPDriverMode, unix.XDP_FLAGS_DRV_MODE
	if m == AttachGeneric {
		lflags, nlflags = link.XDPGenericMode, unix.XDP_FLAGS_SKB_MODE
	}
	var linkErr error
	if !forceNetlink {
		lk, err := link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: ifindex, Flags: lflags})
		if err == nil {
			return &Attachment{p: p, ifindex: ifindex, mode: m, lnk: lk}, nil
		}
		if e := p.classify(l, m, err); e != nil {
			return nil, e
		}
		// No bpf_link for XDP: ErrNotSupported before 5.7, EINVAL on 5.7
		// and 5.8. rtnetlink also reports the reason of other EINVALs.
		linkErr = err
	}
	id, err := p.ID()
	if err != nil {
		return nil, fmt.Errorf("program id: %w", err)
	}
	err = netlink.LinkSetXdpFdWithFlags(l, p.prog.FD(), nlflags|unix.XDP_FLAGS_UPDATE_IF_NOEXIST)
	if err != nil {
		if e := p.classify(l, m, err); e != nil {
			return nil, e
		}
		if linkErr != nil {
			return nil, fmt.Errorf("bpf_link: %v; rtnetlink: %w", linkErr, err)
		}
		return nil, fmt.Errorf("rtnetlink: %w", err)
	}
	ns, err := netns.Get()
	if err != nil {
		_ = netlink.LinkSetXdpFdWithFlags(l, -1, nlflags)
		return nil, fmt.Errorf("bpf: get network namespace: %w", err)
	}
	return &Attachment{p: p, ifindex: ifindex, mode: m, ns: ns, progID: id}, nil
}

// classify turns the attach errors that have a clear cause into typed
// errors, and returns nil for those that call for the netlink fallback.
func (p *Program) classify(l netlink.Link, m AttachMode, err error) error {
	name, ifindex := l.Attrs().Name, l.Attrs().Index
	switch {
	case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
		info, ierr := Attached(ifindex)
		if ierr == nil && info.Attached {
			return fmt.Errorf("%w: %s (ifindex %d) runs program id %d %q in %v mode", ErrBusy, name, ifindex, info.ProgramID, info.Name, info.Mode)
		}
		return fmt.Errorf("%w: %s (ifindex %d): %v", ErrBusy, name, ifindex, err)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("%w: attach to %s (ifindex %d): %v", ErrPermission, name, ifindex, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.EINVAL):
		return nil
	case errors.Is(err, unix.ERANGE) && m == AttachDriver && !p.opts.Frags:
		return fmt.Errorf("%w (frames larger than one page need Options.Frags; veth: peer MTU above 3506)", err)
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTSUP):
		return fmt.Errorf("%w (the driver has no native XDP)", err)
	}
	return err
}

// Close detaches the program from the interface. Closing again is a no-op.
func (a *Attachment) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	a.p.mu.Lock()
	delete(a.p.attachments, a)
	a.p.mu.Unlock()
	if a.lnk != nil {
		if err := a.lnk.Close(); err != nil {
			return fmt.Errorf("bpf: detach from ifindex %d: %w", a.ifindex, err)
		}
		return nil
	}
	defer a.ns.Close()
	return inNetns(a.ns, func() error {
		info, err := Attached(a.ifindex)
		if errors.Is(err, ErrNoInterface) {
			return nil // the interface is gone, and the program with it
		}
		if err != nil {
			return err
		}
		if !info.Attached || info.ProgramID != a.progID {
			return nil // someone else replaced or removed it
		}
		flags := unix.XDP_FLAGS_DRV_MODE
		if a.mode == AttachGeneric {
			flags = unix.XDP_FLAGS_SKB_MODE
		}
		dev := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: a.ifindex}}
		if err := netlink.LinkSetXdpFdWithFlags(dev, -1, flags); err != nil {
			return fmt.Errorf("bpf: detach from ifindex %d: %w", a.ifindex, err)
		}
		return nil
	})
}

// inNetns runs fn on a locked thread switched into ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("bpf: get network namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("bpf: enter network namespace: %w", err)
	}
	defer func() {
		// A thread that cannot return stays locked and is discarded.
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}

// Values of IFLA_XDP_ATTACHED.
const (
	xdpAttachedDrv = 1
	xdpAttachedSKB = 2
	xdpAttachedHW  = 3
)

// AttachInfo describes the XDP program on an interface.
type AttachInfo struct {
	Attached  bool
	Mode      AttachMode // driver, generic, offload or multi
	ProgramID uint32     // 0 in multi mode
	Name      string     // program name, if readable (needs CAP_SYS_ADMIN)
}

// Attached reports the XDP program on interface ifindex of the calling
// thread's network namespace, whoever attached it.
func Attached(ifindex int) (AttachInfo, error) {
	l, err := linkByIndex(ifindex)
	if err != nil {
		return AttachInfo{}, err
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return AttachInfo{}, nil
	}
	info := AttachInfo{Attached: true, ProgramID: x.ProgId}
	switch x.AttachMode {
	case xdpAttachedDrv:
		info.Mode = AttachDriver
	case xdpAttachedSKB:
		info.Mode = AttachGeneric
	case xdpAttachedHW:
		info.Mode = AttachOffload
	default:
		info.Mode = AttachMulti
	}
	if info.ProgramID != 0 {
		if prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(info.ProgramID)); err == nil {
			if pi, err := prog.Info(); err == nil {
				info.Name = pi.Name
			}
			prog.Close()
		}
	}
	return info, nil
}
