package xdp_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/xdp"
)

// Frames still cross with preferred busy polling on (or the kernel says it
// lacks it, as a FeatureError), and bad values are refused.
func TestBusyPoll(t *testing.T) {
	a, b := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
	if err := b.sock.SetBusyPoll(0, 0); !errors.Is(err, xdp.ErrBadConfig) {
		t.Fatalf("SetBusyPoll(0) = %v", err)
	}
	for _, s := range []*xdp.Socket{a.sock, b.sock} {
		if err := s.SetBusyPoll(50*time.Microsecond, 0); err != nil {
			if errors.Is(err, xdp.ErrNotSupported) {
				t.Skipf("kernel without preferred busy polling: %v", err)
			}
			t.Fatal(err)
		}
		if !s.BusyPolling() {
			t.Fatal("BusyPolling false after SetBusyPoll")
		}
	}
	b.sock.BusyPoll()
	r := crossR(t, a, b, 2000, 1514, 32)
	t.Logf("%d frames with busy polling", r.got)
}
