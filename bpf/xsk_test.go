//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// testXSK is the smallest AF_XDP socket that can receive: a UMEM, a fill
// ring handed every frame, and an RX ring. It exists to observe the
// program's redirects; the real socket implementation lives elsewhere.
type testXSK struct {
	fd      int
	umem    []byte
	fillMem []byte
	rxMem   []byte
	off     unix.XDPMmapOffsets
	nframes uint32
}

const (
	xskFrameSize = 4096
	xskFrames    = 64
)

func newTestXSK(t testing.TB, ifindex, queue int) *testXSK {
	t.Helper()
	return newTestXSKFlags(t, ifindex, queue, 0)
}

// newTestXSKFlags binds in copy mode with extra bind flags (XDP_USE_SG).
func newTestXSKFlags(t testing.TB, ifindex, queue int, flags uint16) *testXSK {
	t.Helper()
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("AF_XDP sockets unavailable (CONFIG_XDP_SOCKETS, Linux 4.18): %v", err)
	}
	x := &testXSK{fd: fd, nframes: xskFrames}
	t.Cleanup(x.close)
	x.umem, err = unix.Mmap(-1, 0, xskFrames*xskFrameSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(len(x.umem)), Size: xskFrameSize}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		t.Fatalf("XDP_UMEM_REG: %v", err)
	}
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, xskFrames); err != nil {
			t.Fatalf("ring setsockopt %d: %v", opt, err)
		}
	}
	l := uint32(unsafe.Sizeof(x.off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&x.off)), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		t.Fatalf("XDP_MMAP_OFFSETS: %v", e)
	}
	x.fillMem, err = unix.Mmap(fd, unix.XDP_UMEM_PGOFF_FILL_RING, int(x.off.Fr.Desc)+xskFrames*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap fill ring: %v", err)
	}
	x.rxMem, err = unix.Mmap(fd, unix.XDP_PGOFF_RX_RING, int(x.off.Rx.Desc)+xskFrames*int(unsafe.Sizeof(unix.XDPDesc{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap rx ring: %v", err)
	}
	for i := range uint32(xskFrames) {
		*(*uint64)(unsafe.Pointer(&x.fillMem[x.off.Fr.Desc+8*uint64(i)])) = uint64(i) * xskFrameSize
	}
	x.ptr(x.fillMem, x.off.Fr.Producer).Store(xskFrames)
	if err := unix.Bind(fd, &unix.SockaddrXDP{Flags: unix.XDP_COPY | flags, Ifindex: uint32(ifindex), QueueID: uint32(queue)}); err != nil {
		if flags&unix.XDP_USE_SG != 0 && errors.Is(err, unix.EINVAL) {
			t.Skipf("multi-buffer AF_XDP (XDP_USE_SG) unsupported (requires Linux 6.6): %v", err)
		}
		t.Fatalf("bind AF_XDP socket to ifindex %d queue %d: %v", ifindex, queue, err)
	}
	return x
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0); e != 0 {
		return e
	}
	return nil
}

func (x *testXSK) ptr(mem []byte, off uint64) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

// recv waits up to timeout for one frame and returns a copy of it (nil on
// timeout), joining the descriptors of a multi-buffer frame. The buffers go
// back to the fill ring.
func (x *testXSK) recv(timeout time.Duration) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	var out []byte
	for {
		cons := x.ptr(x.rxMem, x.off.Rx.Consumer).Load()
		prod := x.ptr(x.rxMem, x.off.Rx.Producer).Load()
		for cons != prod {
			d := *(*unix.XDPDesc)(unsafe.Pointer(&x.rxMem[x.off.Rx.Desc+uint64(cons%x.nframes)*uint64(unsafe.Sizeof(unix.XDPDesc{}))]))
			if d.Addr+uint64(d.Len) > uint64(len(x.umem)) {
				return nil, fmt.Errorf("descriptor %+v outside the UMEM", d)
			}
			out = append(out, x.umem[d.Addr:d.Addr+uint64(d.Len)]...)
			cons++
			x.ptr(x.rxMem, x.off.Rx.Consumer).Store(cons)
			fp := x.ptr(x.fillMem, x.off.Fr.Producer).Load()
			*(*uint64)(unsafe.Pointer(&x.fillMem[x.off.Fr.Desc+8*uint64(fp%x.nframes)])) = d.Addr - d.Addr%xskFrameSize
			x.ptr(x.fillMem, x.off.Fr.Producer).Store(fp + 1)
			if d.Options&unix.XDP_PKT_CONTD == 0 {
				return out, nil
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			if out != nil {
				return nil, fmt.Errorf("multi-buffer frame cut short after %d bytes", len(out))
			}
			return nil, nil
		}
		pfd := []unix.PollFd{{Fd: int32(x.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(min(left, 100*time.Millisecond)/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return nil, err
		}
	}
}

func (x *testXSK) close() {
	for _, m := range [][]byte{x.rxMem, x.fillMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	unix.Close(x.fd)
	if x.umem != nil {
		unix.Munmap(x.umem)
	}
}
