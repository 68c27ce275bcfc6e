package xdp

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setsockoptPtr sets a socket option whose value is a struct.
func setsockoptPtr(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

// getsockoptPtr reads a socket option whose value is a struct; it returns
// the length the kernel wrote.
func getsockoptPtr(fd, level, opt int, p unsafe.Pointer, size uintptr) (uintptr, error) {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0, e
	}
	return uintptr(l), nil
}

func bindXDP(fd int, sa *unix.RawSockaddrXDP) error {
	_, _, e := unix.Syscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(sa)), unix.SizeofSockaddrXDP)
	if e != 0 {
		return e
	}
	return nil
}

// kickTx is the sendto(fd, NULL, 0, MSG_DONTWAIT) that makes the kernel
// process the TX ring.
func kickTx(fd int) error {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// kickRx is the recvfrom(fd, NULL, 0, MSG_DONTWAIT) that makes the kernel
// look at the fill ring again.
func kickRx(fd int) error {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// pollFDs is poll(2) without allocation.
func pollFDs(fds []unix.PollFd, timeoutMs int) (int, error) {
	for {
		n, _, e := unix.Syscall(unix.SYS_POLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(timeoutMs))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}

// mmapShared maps one ring of an AF_XDP socket.
func mmapShared(fd int, off int64, size int) ([]byte, error) {
	return unix.Mmap(fd, off, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
}

// ethtoolChannels mirrors struct ethtool_channels.
type ethtoolChannels struct {
	Cmd           uint32
	MaxRx         uint32
	MaxTx         uint32
	MaxOther      uint32
	MaxCombined   uint32
	RxCount       uint32
	TxCount       uint32
	OtherCount    uint32
	CombinedCount uint32
}

// ifreqData mirrors struct ifreq with ifr_data set.
type ifreqData struct {
	Name [unix.IFNAMSIZ]byte
	Data uintptr
	_    [16]byte
}

const ethtoolGChannels = 0x3c // ETHTOOL_GCHANNELS

// rxQueueCount returns how many RX queues ifname has, asking the driver
// through ETHTOOL_GCHANNELS first (this works in any network namespace)
// and falling back to /sys/class/net/IF/queues.
func rxQueueCount(ifname string, ifindex int) (int, error) {
	if n, err := ethtoolRxQueues(ifname); err == nil && n > 0 {
		return n, nil
	}
	// sysfs shows the namespace it was mounted in; trust it only if the
	// index matches.
	dir := filepath.Join("/sys/class/net", ifname)
	b, err := os.ReadFile(filepath.Join(dir, "ifindex"))
	if err != nil {
		return 0, fmt.Errorf("xdp: counting queues of %s: %w", ifname, err)
	}
	if idx, _ := strconv.Atoi(strings.TrimSpace(string(b))); idx != ifindex {
		return 0, fmt.Errorf("xdp: counting queues of %s: sysfs shows another namespace", ifname)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "queues"))
	if err != nil {
		return 0, fmt.Errorf("xdp: counting queues of %s: %w", ifname, err)
	}
	n := 0
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "rx-") {
			n++
		}
	}
	return n, nil
}

func ethtoolRxQueues(ifname string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	ch := ethtoolChannels{Cmd: ethtoolGChannels}
	var ifr ifreqData
	copy(ifr.Name[:unix.IFNAMSIZ-1], ifname)
	ifr.Data = uintptr(unsafe.Pointer(&ch))
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if e != 0 {
		return 0, e
	}
	// Drivers report either dedicated rx queues, combined ones, or both.
	return int(ch.RxCount + ch.CombinedCount), nil
}

// lookupInterface resolves ifname in the calling thread's namespace.
func lookupInterface(ifname string) (*net.Interface, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		if strings.Contains(err.Error(), "no such network interface") {
			return nil, fmt.Errorf("%w: %q", ErrNoSuchInterface, ifname)
		}
		return nil, fmt.Errorf("xdp: looking up %q: %w", ifname, err)
	}
	return ifi, nil
}
