// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
)

// labMTU gives rxe an active MTU of 2048 (3000 − 80 rounded down to an IB
// MTU) while a frame still fits one 4096-byte UMEM chunk; path MTU 1024 is
// asked for with -m.
const labMTU = 3000

func TestMain(m *testing.M) {
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: labMTU,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	shared.close()
	os.Exit(code)
}

// sharedDevice is the goroce device on rxeh0, opened once.
type sharedDevice struct {
	once sync.Once
	dev  *roce.Device
	err  error
}

var shared sharedDevice

func (s *sharedDevice) close() {
	if s.dev != nil {
		s.dev.Close()
	}
}

// env is what every test needs: the lab, its guest and our device.
type env struct {
	lab *rxelab.Lab
	g   *rxelab.Guest
	dev *roce.Device
	// gidIndex is the guest's GID index of its IPv4 address.
	gidIndex int
}

func setup(t *testing.T) *env {
	t.Helper()
	lab := rxelab.Get(t)
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		shared.err = lab.InPeerNS(func() error {
			var err error
			shared.dev, err = roce.Open(ctx, lab.PeerIf, roce.Options{Link: roce.LinkXDP, Logger: logger})
			return err
		})
	})
	if shared.err != nil {
		if errors.Is(shared.err, roce.ErrNotSupported) {
			t.Skipf("AF_XDP on %s: %v", lab.PeerIf, shared.err)
		}
		t.Fatalf("opening goroce on %s over AF_XDP: %v", lab.PeerIf, shared.err)
	}
	g := lab.Guests[0]
	idx, ok := g.GIDIndex(g.Addr)
	if !ok {
		t.Fatalf("guest %s has no GID for %v: %v", g.Name, g.Addr, g.GIDs)
	}
	return &env{lab: lab, g: g, dev: shared.dev, gidIndex: idx}
}

// listen opens the out-of-band listener on rxeh0's address in the peer
// netns, for a guest tool that connects to us.
func (e *env) listen(t *testing.T) perfcmd.OOB {
	t.Helper()
	var ln net.Listener
	err := e.lab.InPeerNS(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(e.lab.PeerAddr, rxelab.OOBPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listening on the OOB port: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return perfcmd.OOB{Listener: ln}
}

// dialer connects to the guest tool's server from the peer netns, retrying
// until it listens or exits.
func (e *env) dialer(serverDone <-chan struct{}) perfcmd.OOB {
	addr := netip.AddrPortFrom(e.g.Addr, rxelab.OOBPort).String()
	return perfcmd.OOB{Dial: func(ctx context.Context) (net.Conn, error) {
		for {
			var c net.Conn
			err := e.lab.InPeerNS(func() error {
				var err error
				d := net.Dialer{Timeout: 2 * time.Second}
				c, err = d.DialContext(ctx, "tcp", addr)
				return err
			})
			if err == nil {
				return c, nil
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("connecting to the guest tool: %w (last: %v)", ctx.Err(), err)
			case <-serverDone:
				return nil, fmt.Errorf("guest tool exited before accepting (last dial: %v)", err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}}
}

// toolResult is a finished guest tool.
type toolResult struct {
	stdout, stderr string
	code           int
	err            error
}

func (r toolResult) String() string {
	return fmt.Sprintf("exit %d (%v)\nstdout:\n%s\nstderr:\n%s", r.code, r.err, r.stdout, r.stderr)
}

func (r toolResult) ok() bool { return r.err == nil && r.code == 0 }

// start runs a tool in the guest in the background.
func (e *env) start(ctx context.Context, args ...string) (*rxelab.Job, func() toolResult) {
	job := e.g.Start(ctx, args...)
	return job, func() toolResult {
		o, se, code, err := job.Wait()
		return toolResult{string(o), string(se), code, err}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// counters returns the guest's rxe0 counters and ours, for failure reports.
func (e *env) counters() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _, _, err := e.g.Exec(ctx, "sh", "-c", "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
	s := "guest rxe0:\n" + string(out)
	if err != nil {
		s += err.Error()
	}
	return s + fmt.Sprintf("\ngoroce: %v", e.dev.Counters().Map())
}
