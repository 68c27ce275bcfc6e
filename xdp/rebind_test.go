package xdp_test

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/xdp"
)

// A socket opened on a queue that another socket still holds binds once
// that socket closes: the kernel frees a closed socket's queue in deferred
// work, so a quick close and reopen can find it taken for a while.
func TestBindWaitsForClosingSocket(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPair(t, 1500)
	err := p.A.Do(func() error {
		cfg := xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 64}}
		first, err := xdp.Open(p.VethA.Name, 0, cfg)
		if err != nil {
			return err
		}
		go func() {
			time.Sleep(50 * time.Millisecond)
			first.Close()
		}()
		second, err := xdp.Open(p.VethA.Name, 0, cfg)
		if err != nil {
			t.Errorf("a socket on a queue being released: %v", err)
			return nil
		}
		return second.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}
