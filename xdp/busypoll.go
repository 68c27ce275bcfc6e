package xdp

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Socket options of preferred busy polling (asm-generic/socket.h; the
// same numbers on every architecture that has AF_XDP).
const (
	soBusyPoll       = 46 // SO_BUSY_POLL, Linux 3.11
	soPreferBusyPoll = 69 // SO_PREFER_BUSY_POLL, Linux 5.11
	soBusyPollBudget = 70 // SO_BUSY_POLL_BUDGET, Linux 5.11
)

var featBusyPoll = FeatureError{Feature: "AF_XDP preferred busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET)", MinVersion: "5.11"}

// SetBusyPoll turns on preferred busy polling: the kernel runs the
// device's NAPI poll in the system calls of this socket's owner (the
// recvfrom of BusyPoll, the sendto that kicks TX) for up to usecs, handling
// up to budget frames per poll (0: 64), instead of in softirq context. It
// pays off when the application polls the rings itself. Where the kernel
// lacks the options (before Linux 5.11) it returns a FeatureError matching
// ErrNotSupported and the socket works as before. Raising SO_BUSY_POLL
// above net.core.busy_poll needs CAP_NET_ADMIN.
//
// For the kernel to defer interrupts to the busy poller, the interface
// needs /sys/class/net/<if>/napi_defer_hard_irqs and gro_flush_timeout
// set; without them the socket still busy-polls in its system calls.
func (s *Socket) SetBusyPoll(usecs time.Duration, budget int) error {
	if s.closed {
		return ErrClosed
	}
	if budget == 0 {
		budget = 64
	}
	us := int(usecs / time.Microsecond)
	if us <= 0 || budget < 0 || budget > 65535 {
		return fmt.Errorf("%w: busy poll %v, budget %d", ErrBadConfig, usecs, budget)
	}
	for _, o := range []struct{ opt, val int }{
		{soPreferBusyPoll, 1},
		{soBusyPoll, us},
		{soBusyPollBudget, budget},
	} {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, o.opt, o.val); err != nil {
			if errors.Is(err, unix.ENOPROTOOPT) || (o.opt != soBusyPoll && errors.Is(err, unix.EINVAL)) {
				s.unsetBusyPoll()
				return notSupported(featBusyPoll, err)
			}
			s.unsetBusyPoll()
			return fmt.Errorf("xdp: setting busy poll option %d to %d: %w", o.opt, o.val, err)
		}
	}
	s.busyPoll = true
	return nil
}

// unsetBusyPoll undoes a partial SetBusyPoll.
func (s *Socket) unsetBusyPoll() {
	_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, soPreferBusyPoll, 0)
	_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, soBusyPoll, 0)
	s.busyPoll = false
}

// BusyPolling reports whether SetBusyPoll turned busy polling on.
func (s *Socket) BusyPolling() bool { return s.busyPoll }

// BusyPoll runs the kernel's busy poll for this socket once (a recvfrom
// with MSG_DONTWAIT): with SetBusyPoll it processes the device's receive
// and transmit work into the rings. It does nothing without SetBusyPoll.
func (s *Socket) BusyPoll() {
	if s.closed || !s.busyPoll {
		return
	}
	_ = kickRx(s.fd)
}

// RxReady reports whether the RX ring holds descriptors, without taking
// any. It reads only the ring words the kernel shares, never the socket's
// cached indices, so it may run while another goroutine receives: a waiter
// uses it to skip a poll(2) that would return at once.
func (s *Socket) RxReady() bool {
	if s.closed {
		return false
	}
	return atomic.LoadUint32(s.rx.producer) != atomic.LoadUint32(s.rx.consumer)
}
