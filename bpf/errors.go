package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/goroce/goroce/internal/errclosed"
)

var (
	// ErrClosed is returned by methods of a closed Program. It matches
	// net.ErrClosed and every other goroce ErrClosed (errors.Is).
	ErrClosed = errclosed.New("bpf: program closed")
	// ErrNoInterface is returned when an ifindex names no interface in the
	// caller's network namespace.
	ErrNoInterface = errors.New("bpf: interface not found")
	// ErrQueueRange is returned for a queue outside [0, Options.Queues).
	ErrQueueRange = errors.New("bpf: queue out of range")
	// ErrPermission is returned when the process may not load or attach BPF
	// programs.
	ErrPermission = errors.New("bpf: permission denied (needs CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)")
	// ErrAddr is returned by SetLocalAddrs for an invalid address or too
	// many of them (MaxAddrs).
	ErrAddr = errors.New("bpf: bad local address list")
	// ErrBusy is returned when the interface already has an XDP program that
	// is not ours.
	ErrBusy = errors.New("bpf: interface already has an XDP program")
)

// UnsupportedError reports a kernel feature that is missing, naming the
// first kernel version that has it. errors.Is(err, ebpf.ErrNotSupported)
// holds for it.
type UnsupportedError struct {
	Feature   string // e.g. "XDP frags (BPF_F_XDP_HAS_FRAGS)"
	MinKernel string // e.g. "5.18"
	Err       error  // what the kernel said, if anything
}

func (e *UnsupportedError) Error() string {
	s := fmt.Sprintf("bpf: %s not supported (requires Linux %s or later)", e.Feature, e.MinKernel)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes UnsupportedError match ebpf.ErrNotSupported.
func (e *UnsupportedError) Is(target error) bool { return target == ebpf.ErrNotSupported }

func (e *UnsupportedError) Unwrap() error { return e.Err }
