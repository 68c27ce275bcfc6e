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
	mu      sync.Mutex
	cfg     Config
	started bool
	lab     *Lab
	err     error
	closed  bool
}

// Main runs the tests of a package that uses the lab and then tears the lab
// down; call it from TestMain as os.Exit(rxelab.Main(m, cfg)). The lab is
// started lazily by the first [Get], so "go test -run X" that needs no lab
// boots nothing. It is also torn down on SIGINT/SIGTERM and 30 s before the
// -test.timeout alarm fires (the alarm kills the process without running
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
			margin := min(30*time.Second, d/10)
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

// shutdown closes the shared lab (once) and refuses later starts.
func shutdown() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.closed = true
	if shared.lab == nil {
		return nil
	}
	return shared.lab.Close()
}

// Get returns the test binary's lab, starting it on the first call with the
// Config given to [Main]. It skips tb when the machine lacks a capability
// (naming it), and fails tb if the lab could not be started.
func Get(tb testing.TB) *Lab {
	tb.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.closed {
		tb.Fatal("rxelab: the lab has been torn down")
	}
	if !shared.started {
		shared.started = true
		cfg := shared.cfg
		if cfg.Logf == nil {
			cfg.Logf = tb.Logf
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		shared.lab, shared.err = Start(ctx, cfg)
		cancel()
	}
	if shared.err != nil {
		if errors.Is(shared.err, ErrNotSupported) {
			tb.Skip(shared.err)
		}
		tb.Fatal(shared.err)
	}
	return shared.lab
}
