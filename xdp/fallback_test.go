package xdp

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeKernel plays a kernel for openOn: bind fails with EINVAL for any flag
// in unknown, with EOPNOTSUPP for zero-copy unless zc, and otherwise
// succeeds. It records the flags tried.
type fakeKernel struct {
	unknown uint16
	zc      bool
	tried   []uint16
}

func (k *fakeKernel) install(t *testing.T) {
	old := bind
	bind = func(ifindex int, ifname string, queue int, u *UMEM, first, n uint32, cfg *Config, flags uint16, sharedFD int) (*Socket, error) {
		k.tried = append(k.tried, flags)
		if flags&k.unknown != 0 {
			return nil, unix.EINVAL
		}
		if flags&unix.XDP_ZEROCOPY != 0 && !k.zc {
			return nil, unix.EOPNOTSUPP
		}
		s := &Socket{fd: -1, umem: u, zeroCopy: flags&unix.XDP_ZEROCOPY != 0,
			needWakeup: flags&unix.XDP_USE_NEED_WAKEUP != 0, sg: flags&unix.XDP_USE_SG != 0}
		u.owner, u.ownerFD = s, 1000
		return s, nil
	}
	t.Cleanup(func() { bind = old })
}

// TestBindFallbacks checks the order of bind attempts and how a refused
// flag is reported, on kernels that lack a feature.
func TestBindFallbacks(t *testing.T) {
	const (
		zc = unix.XDP_ZEROCOPY
		cp = unix.XDP_COPY
		nw = unix.XDP_USE_NEED_WAKEUP
		sg = unix.XDP_USE_SG
	)
	for _, tc := range []struct {
		name    string
		k       fakeKernel
		cfg     Config
		tried   []uint16
		wantErr string // substring; empty: success
		zc, nw  bool
	}{
		{name: "zero-copy driver", k: fakeKernel{zc: true}, cfg: Config{}, tried: []uint16{zc | nw}, zc: true, nw: true},
		{name: "copy fallback", k: fakeKernel{}, cfg: Config{}, tried: []uint16{zc | nw, cp | nw}, nw: true},
		{name: "zero-copy demanded", k: fakeKernel{}, cfg: Config{Mode: ModeZeroCopy}, tried: []uint16{zc | nw}, wantErr: "XDP_ZEROCOPY"},
		{name: "copy demanded", k: fakeKernel{zc: true}, cfg: Config{Mode: ModeCopy}, tried: []uint16{cp | nw}, nw: true},
		{name: "no SG before 6.6", k: fakeKernel{unknown: sg}, cfg: Config{Multibuffer: true, Mode: ModeCopy},
			tried: []uint16{cp | nw | sg, cp | nw}, wantErr: "XDP_USE_SG) not supported (requires Linux >= 6.6)"},
		{name: "no need_wakeup before 5.4", k: fakeKernel{unknown: nw}, cfg: Config{Mode: ModeCopy},
			tried: []uint16{cp | nw, cp}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := tc.k
			k.install(t)
			u := &UMEM{ownerFD: -1}
			s, err := openOn(1, "fake0", 0, u, 0, 64, &tc.cfg)
			if !equalFlags(k.tried, tc.tried) {
				t.Errorf("tried flags %#x, want %#x", k.tried, tc.tried)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrNotSupported) {
					t.Fatalf("err = %v, want ErrNotSupported mentioning %q", err, tc.wantErr)
				}
				if u.owner != nil || u.ownerFD != -1 {
					t.Error("a refused open left the UMEM registered")
				}
				t.Log(err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.zeroCopy != tc.zc || s.needWakeup != tc.nw {
				t.Fatalf("zero-copy %v need_wakeup %v, want %v %v", s.zeroCopy, s.needWakeup, tc.zc, tc.nw)
			}
		})
	}
}

func equalFlags(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
