package cuobj

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

func TestMain(m *testing.M) {
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 1500, IPv6: true,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	if labDev.dev != nil {
		labDev.dev.Close()
	}
	os.Exit(code)
}

// guestPeer is where the guest finds cuobjpeer.
const guestPeer = "/mnt/lab/files/cuobjpeer"

var labDev struct {
	once  sync.Once
	dev   *roce.Device
	share string // host path of the guest's /mnt/lab/files
	err   error
}

// setup boots the lab, builds cuobjpeer into the guest's share and opens
// goroce on the lab's host interface.
func setup(t *testing.T) (*rxelab.Lab, *rxelab.Guest, *roce.Device, string) {
	t.Helper()
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			t.Skipf("needs libibverbs-dev and librdmacm-dev on the host to build cpeer/cuobjpeer.c (%s)", h)
		}
	}
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	labDev.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		share, err := g.Share(ctx)
		if err != nil {
			labDev.err = err
			return
		}
		labDev.share = share
		if b, err := exec.Command("cc", "-O2", "-Wall", "-o", filepath.Join(share, "cuobjpeer"),
			"cpeer/cuobjpeer.c", "-libverbs", "-lrdmacm").CombinedOutput(); err != nil {
			labDev.err = fmt.Errorf("building cuobjpeer: %v\n%s", err, b)
			return
		}
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		labDev.err = lab.InPeerNS(func() error {
			var err error
			labDev.dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Link: netdev.LinkXDP, Device: roce.Options{Logger: logger}})
			return err
		})
		if labDev.err == nil {
			t.Logf("goroce on %s: %+v", lab.PeerIf, labDev.dev.Info())
		}
	})
	if labDev.err != nil {
		t.Fatalf("lab setup: %v", labDev.err)
	}
	return lab, g, labDev.dev, labDev.share
}
