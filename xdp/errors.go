package xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/goroce/goroce/internal/errclosed"
)

var (
	// ErrNotSupported is matched by errors reporting a kernel feature that
	// is missing; see FeatureError. It is cilium/ebpf's sentinel, so one
	// check covers the XDP program and the socket.
	ErrNotSupported = ebpf.ErrNotSupported
	// ErrNoSuchInterface is returned when the named interface does not exist
	// in the caller's network namespace.
	ErrNoSuchInterface = errors.New("xdp: no such network interface")
	// ErrQueueOutOfRange is matched by QueueRangeError.
	ErrQueueOutOfRange = errors.New("xdp: queue out of range")
	// ErrFrameTooLarge is returned when a frame does not fit the chunks
	// available to it (one chunk without multi-buffer).
	ErrFrameTooLarge = errors.New("xdp: frame larger than chunk space")
	// ErrEmptyFrame is returned by Transmit for a zero-length frame, which
	// the kernel would reject as an invalid descriptor.
	ErrEmptyFrame = errors.New("xdp: empty frame")
	// ErrClosed is returned by operations on a closed Socket or UMEM. It
	// matches net.ErrClosed and every other goroce ErrClosed (errors.Is).
	ErrClosed = errclosed.New("xdp: closed")
	// ErrBadConfig is matched by errors for invalid Config values.
	ErrBadConfig = errors.New("xdp: invalid configuration")
)

// FeatureError reports a kernel feature that is not available.
type FeatureError struct {
	Feature    string // what is missing, e.g. "AF_XDP multi-buffer (XDP_USE_SG)"
	MinVersion string // first Linux version that has it, e.g. "6.6"
	Err        error  // the underlying errno, if any
}

func (e *FeatureError) Error() string {
	s := fmt.Sprintf("%s not supported (requires Linux >= %s)", e.Feature, e.MinVersion)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is makes FeatureError match ErrNotSupported.
func (e *FeatureError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns the underlying errno.
func (e *FeatureError) Unwrap() error { return e.Err }

// Feature names and the first kernel releases that have them.
var (
	featAFXDP      = FeatureError{Feature: "AF_XDP sockets", MinVersion: "4.18"}
	featNeedWakeup = FeatureError{Feature: "AF_XDP need_wakeup (XDP_USE_NEED_WAKEUP)", MinVersion: "5.4"}
	featSharedUMEM = FeatureError{Feature: "AF_XDP shared UMEM across queues (XDP_SHARED_UMEM)", MinVersion: "5.10"}
	featSG         = FeatureError{Feature: "AF_XDP multi-buffer (XDP_USE_SG)", MinVersion: "6.6"}
	featZeroCopy   = FeatureError{Feature: "AF_XDP zero-copy (XDP_ZEROCOPY) on this device", MinVersion: "4.20 and a driver with zero-copy support"}
)

func notSupported(f FeatureError, err error) error {
	f.Err = err
	return &f
}

// QueueRangeError reports a queue index the interface does not have.
type QueueRangeError struct {
	Interface string
	Queue     int
	Queues    int // number of RX queues the device has
}

func (e *QueueRangeError) Error() string {
	return fmt.Sprintf("xdp: queue %d out of range: %s has %d rx queue(s)", e.Queue, e.Interface, e.Queues)
}

// Is makes QueueRangeError match ErrQueueOutOfRange.
func (e *QueueRangeError) Is(target error) bool { return target == ErrQueueOutOfRange }
