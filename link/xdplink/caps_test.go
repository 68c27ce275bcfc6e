package xdplink_test

import (
	"errors"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/xdplink"
)

// TestMissingCapBPF opens a link on a thread without CAP_BPF and
// CAP_SYS_ADMIN (capabilities are per thread): the steering program cannot
// be loaded and the error says so.
func TestMissingCapBPF(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF, unix.CAP_SYS_ADMIN)
	p := netnstest.NewPair(t, 1500)
	var openErr error
	err := p.A.Do(func() error {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var saved [2]unix.CapUserData
		if err := unix.Capget(&hdr, &saved[0]); err != nil {
			runtime.UnlockOSThread()
			return err
		}
		data := saved
		for _, c := range []int{unix.CAP_BPF, unix.CAP_SYS_ADMIN} {
			data[c/32].Effective &^= 1 << (uint(c) % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			runtime.UnlockOSThread()
			return err
		}
		var l *xdplink.Link
		l, openErr = xdplink.Open(p.VethA.Name, xdplink.Options{})
		if l != nil {
			l.Close()
		}
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			return err // the thread stays locked and is discarded
		}
		runtime.UnlockOSThread()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(openErr, bpf.ErrPermission) {
		t.Fatalf("Open without CAP_BPF/CAP_SYS_ADMIN = %v, want bpf.ErrPermission", openErr)
	}
	t.Log(openErr)
}
