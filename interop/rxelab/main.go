// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The lab of this test binary, started by the first Get.
var shared struct {
	mu          sync.Mutex
	cfg         Config
	started     bool
	starting    chan struct{} // closed when Start has returned
	startCancel context.CancelFunc
	lab         *Lab
	err         error
	closed      bool
}

// Main runs the tests of a package that uses the lab and then tears the lab
// down; call it from TestMain as os.Exit(rxelab.Main(m, cfg)). The lab is
// started lazily by the first [Get], so "go test -run X" that needs no lab
// boots nothing. It is also torn down on SIGINT/SIGTERM and 30 s (a quarter
// of short timeouts) before the -test.timeout alarm fires (the alarm kills the process without running
// deferred calls).
func Main(m *testing.M, cfg Config) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	shared.mu.Lock()
	shared.cfg = cfg
	shared.mu.Unlock()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "rxelab: %v: tearing the lab down\n", s)
		shutdown()
		os.Exit(2)
	}()
	if f := flag.Lookup("test.timeout"); f != nil {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d > 0 {
			margin := min(30*time.Second, d/4)
			t := time.AfterFunc(d-margin, func() {
				fmt.Fprintf(os.Stderr, "rxelab: -test.timeout %v is near: tearing the lab down\n", d)
				shutdown()
			})
			defer t.Stop()
		}
	}
	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	if err := shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// shutdown closes the shared lab (once) and refuses later starts. A start
// in progress is cancelled; Start then removes what it had set up.
func shutdown() error {
	shared.mu.Lock()
	shared.closed = true
	starting, cancel := shared.starting, shared.startCancel
	shared.mu.Unlock()
	if starting != nil {
		cancel()
		select {
		case <-starting:
		case <-time.After(2 * time.Minute):
			return fmt.Errorf("rxelab: the lab start did not end after cancellation")
		}
	}
	shared.mu.Lock()
	lab := shared.lab
	shared.mu.Unlock()
	if lab == nil {
		return nil
	}
	return lab.Close()
}

// Get returns the test binary's lab, starting it on the first call with the
// Config given to [Main]. It skips tb when the machine lacks a capability
// (naming it), and fails tb if the lab could not be started.
func Get(tb testing.TB) *Lab {
	tb.Helper()
	shared.mu.Lock()
	if shared.closed {
		shared.mu.Unlock()
		tb.Fatal("rxelab: the lab has been torn down")
	}
	if !shared.started {
		shared.started = true
		cfg := shared.cfg
		if cfg.Logf == nil {
			cfg.Logf = tb.Logf
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		starting := make(chan struct{})
		shared.starting, shared.startCancel = starting, cancel
		// Start runs unlocked so that shutdown can cancel it.
		shared.mu.Unlock()
		lab, err := Start(ctx, cfg)
		cancel()
		shared.mu.Lock()
		shared.lab, shared.err = lab, err
		shared.starting = nil
		close(starting)
	} else if starting := shared.starting; starting != nil {
		// Another test (t.Parallel) is starting the lab.
		shared.mu.Unlock()
		<-starting
		shared.mu.Lock()
	}
	lab, err := shared.lab, shared.err
	shared.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrNotSupported) {
			tb.Skip(err)
		}
		tb.Fatal(err)
	}
	// A guest that failed under an earlier test (outside [Lab.Case]) is
	// restarted before this one uses it, so one lab fault costs one test.
	for _, g := range lab.Guests {
		if g.Fault() != nil {
			lab.recover(tb, g)
		}
	}
	return lab
}
