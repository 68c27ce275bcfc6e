package xdp_test

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/xdp"
)

// withoutCaps runs fn on a thread whose effective capability set lacks
// caps. Capabilities are per thread, so the rest of the process keeps them.
func withoutCaps(t *testing.T, fn func(), caps ...int) {
	t.Helper()
	runtime.LockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved, data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		runtime.UnlockOSThread()
		t.Skipf("capget: %v", err)
	}
	data = saved
	for _, c := range caps {
		data[c/32].Effective &^= 1 << (uint(c) % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("capset: %v", err)
	}
	fn()
	if err := unix.Capset(&hdr, &saved[0]); err != nil {
		// The thread stays locked and dies with the goroutine.
		t.Fatalf("restoring capabilities: %v", err)
	}
	runtime.UnlockOSThread()
}

func TestMissingCapNetRaw(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW)
	ns := netnstest.New(t) // its lo: one queue, no traffic
	err := ns.Do(func() error {
		var err error
		withoutCaps(t, func() { _, err = xdp.Open("lo", 0, xdp.Config{}) }, unix.CAP_NET_RAW)
		return err
	})
	if !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "CAP_NET_RAW") {
		t.Fatalf("Open without CAP_NET_RAW = %v, want a permission error naming CAP_NET_RAW", err)
	}
	t.Log(err)
}
