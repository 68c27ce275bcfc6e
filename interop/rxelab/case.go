// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// CaseOptions bound one interop case.
type CaseOptions struct {
	// Timeout is the case's deadline, each attempt's own: a few minutes
	// beyond what the case needs, so that a hang fails in minutes.
	Timeout time.Duration
	// Guests are the guests the case uses (default: all of the lab's).
	Guests []*Guest
	// Grace is how long an attempt whose context ended may take to return
	// before it is abandoned (default 30 s).
	Grace time.Duration
	// Progress, if set, is a counter that moves while the case makes
	// progress (frames received, say); an attempt during which it stands
	// still for Stall (default 2 minutes) ends as a hang. A slow host slows
	// the counter but does not stop it, so a long Timeout can then cover the
	// slowest host while a hang still ends in minutes.
	Progress func() uint64
	Stall    time.Duration
}

// Case runs fn as one interop case, bounded by opts.Timeout, with a context
// that ends when the deadline passes or when one of the case's guests has a
// lab fault (see [ErrLabFault]). When fn fails or overruns and a guest had a
// lab fault meanwhile, Case logs the guest's diagnostics, restarts it and
// runs fn once more; that second attempt's result is the case's. Any other
// failure is the case's at once: only the lab's fault is retried.
//
// fn reports through tb as a test would (Fatal ends the attempt). Cleanups
// it registers run when its attempt ends.
func (l *Lab) Case(t testing.TB, opts CaseOptions, fn func(ctx context.Context, tb testing.TB)) {
	t.Helper()
	if opts.Timeout <= 0 {
		opts.Timeout = 4 * time.Minute
	}
	if opts.Grace <= 0 {
		opts.Grace = 30 * time.Second
	}
	if len(opts.Guests) == 0 {
		opts.Guests = l.Guests
	}
	if opts.Stall <= 0 {
		opts.Stall = 2 * time.Minute
	}
	for attempt := 1; ; attempt++ {
		for _, g := range opts.Guests {
			if g.Fault() != nil { // left over from an earlier case
				l.recover(t, g)
			}
		}
		a := runAttempt(t, opts, fn)
		var faulty []*Guest
		for _, g := range opts.Guests {
			if g.Fault() != nil {
				faulty = append(faulty, g)
			}
		}
		if len(faulty) == 0 || attempt == 2 {
			a.report(t, attempt)
			return
		}
		if !a.failed() {
			return // done before the fault mattered; the next case restarts the guest
		}
		t.Logf("rxelab: attempt 1 of this case failed during a lab fault; its messages:\n%s", a.messages())
		for _, g := range faulty {
			l.recover(t, g)
		}
		t.Logf("rxelab: rerunning the case once after the lab fault")
	}
}

// recover logs g's diagnostics and restarts it; a restart that fails ends
// the test.
func (l *Lab) recover(t testing.TB, g *Guest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), l.bootTimeout+2*time.Minute)
	defer cancel()
	t.Logf("%v\n%s", g.Fault(), g.Diagnose(ctx))
	if err := l.Restart(ctx, g); err != nil {
		t.Fatalf("rxelab: restarting guest %s after its lab fault: %v", g.Name, err)
	}
}

// attempt is the outcome of one run of a case's function.
type attempt struct {
	mu        sync.Mutex
	msgs      []string
	fail      bool
	skip      bool
	overrun   string // why the attempt was abandoned, if it was
	cleanups  []func()
	abandoned bool
}

func (a *attempt) failed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fail || a.overrun != ""
}

func (a *attempt) messages() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.msgs, "\n")
}

// report hands the attempt's outcome to the real test.
func (a *attempt) report(t testing.TB, n int) {
	t.Helper()
	a.mu.Lock()
	fail, skip, overrun, msgs := a.fail, a.skip, a.overrun, a.msgs
	a.mu.Unlock()
	if overrun != "" {
		t.Fatalf("rxelab: attempt %d: %s", n, overrun)
	}
	if fail {
		t.FailNow() // the messages were logged as they came
	}
	if skip {
		t.Skip(strings.Join(msgs[max(0, len(msgs)-1):], ""))
	}
}

// runAttempt runs fn once in a goroutine of its own, so that Fatal ends
// only it, and waits for it, its deadline or a lab fault, plus the grace.
func runAttempt(t testing.TB, opts CaseOptions, fn func(context.Context, testing.TB)) *attempt {
	a := &attempt{}
	ctx, cancel := context.WithTimeoutCause(context.Background(), opts.Timeout,
		fmt.Errorf("rxelab: the case's deadline of %v passed", opts.Timeout))
	defer cancel()
	ctx, cancelFault := context.WithCancelCause(ctx)
	defer cancelFault(nil)
	stop := make(chan struct{})
	defer close(stop)
	for _, g := range opts.Guests {
		go func() {
			select {
			case <-g.Faulted():
				cancelFault(g.Fault())
			case <-stop:
			}
		}()
	}
	if opts.Progress != nil {
		go watchProgress(ctx, opts.Progress, opts.Stall, cancelFault, stop)
	}
	tb := &caseTB{TB: t, a: a, ctx: ctx}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer a.runCleanups()
		fn(ctx, tb)
	}()
	select {
	case <-done:
		return a
	case <-ctx.Done():
	}
	select {
	case <-done:
	case <-time.After(opts.Grace):
		a.mu.Lock()
		a.abandoned = true
		a.overrun = fmt.Sprintf("%v; the case did not return within %v of it (abandoned)", context.Cause(ctx), opts.Grace)
		a.mu.Unlock()
		var stacks [1 << 16]byte
		t.Logf("rxelab: goroutines of the abandoned case:\n%s", stacks[:runtime.Stack(stacks[:], true)])
	}
	if errors.Is(context.Cause(ctx), ErrLabFault) || ctx.Err() != nil {
		t.Logf("rxelab: the case's context ended: %v", context.Cause(ctx))
	}
	if errors.Is(context.Cause(ctx), errNoProgress) {
		// A case that stalled may stand on a guest whose NIC stopped
		// transmitting without a word on its console: ask the guest.
		for _, g := range opts.Guests {
			if err := g.CheckTransmit(context.Background()); err != nil {
				t.Logf("%v", err)
			}
		}
	}
	return a
}

// errNoProgress ends an attempt whose progress counter stood still.
var errNoProgress = errors.New("rxelab: the case made no progress")

// watchProgress ends the attempt (cancel with a cause) when progress()
// stands still for stall.
func watchProgress(ctx context.Context, progress func() uint64, stall time.Duration, cancel context.CancelCauseFunc, stop <-chan struct{}) {
	every := min(stall/8, 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	last, at := progress(), time.Now()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case now := <-t.C:
			if v := progress(); v != last {
				last, at = v, now
			} else if now.Sub(at) >= stall {
				cancel(fmt.Errorf("%w for %v (a hang)", errNoProgress, now.Sub(at).Round(time.Second)))
				return
			}
		}
	}
}

func (a *attempt) runCleanups() {
	a.mu.Lock()
	c := a.cleanups
	a.cleanups = nil
	a.mu.Unlock()
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// caseTB is the testing.TB a case's function sees: failures are recorded
// for [Lab.Case] to judge, Fatal and Skip end the attempt's goroutine, and
// once the attempt has been abandoned nothing reaches the real test.
type caseTB struct {
	testing.TB
	a   *attempt
	ctx context.Context
}

func (c *caseTB) log(s string) {
	c.a.mu.Lock()
	c.a.msgs = append(c.a.msgs, s)
	gone := c.a.abandoned
	c.a.mu.Unlock()
	if !gone {
		c.TB.Log(s)
	}
}

func (c *caseTB) Log(args ...any)                 { c.log(fmt.Sprintln(args...)) }
func (c *caseTB) Logf(format string, args ...any) { c.log(fmt.Sprintf(format, args...)) }
func (c *caseTB) Error(args ...any)               { c.Log(args...); c.Fail() }
func (c *caseTB) Errorf(format string, args ...any) {
	c.Logf(format, args...)
	c.Fail()
}
func (c *caseTB) Fatal(args ...any)                 { c.Log(args...); c.FailNow() }
func (c *caseTB) Fatalf(format string, args ...any) { c.Logf(format, args...); c.FailNow() }
func (c *caseTB) Skip(args ...any)                  { c.Log(args...); c.SkipNow() }
func (c *caseTB) Skipf(format string, args ...any)  { c.Logf(format, args...); c.SkipNow() }

func (c *caseTB) Fail() {
	c.a.mu.Lock()
	c.a.fail = true
	c.a.mu.Unlock()
}

func (c *caseTB) Failed() bool {
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	return c.a.fail
}

func (c *caseTB) FailNow() { c.Fail(); runtime.Goexit() }

func (c *caseTB) SkipNow() {
	c.a.mu.Lock()
	c.a.skip = true
	c.a.mu.Unlock()
	runtime.Goexit()
}

func (c *caseTB) Skipped() bool {
	c.a.mu.Lock()
	defer c.a.mu.Unlock()
	return c.a.skip
}

func (c *caseTB) Cleanup(f func()) {
	c.a.mu.Lock()
	c.a.cleanups = append(c.a.cleanups, f)
	c.a.mu.Unlock()
}

func (c *caseTB) Context() context.Context { return c.ctx }

func (c *caseTB) Helper() {}
