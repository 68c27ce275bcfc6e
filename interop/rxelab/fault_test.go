// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestScanConsole(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	write := func(s string) {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	write("[  1.0] booting\n[  2.0] rxe ready\n[ 474.1] virtio_net virtio0 eth0: NETDEV WATCH")
	sign, off := scanConsole(p, 0)
	if sign != "" {
		t.Fatalf("a sign split across reads was reported early: %q", sign)
	}
	write("DOG: CPU: 0: transmit queue 0 timed out 5120 ms\n")
	sign, _ = scanConsole(p, off)
	if !strings.Contains(sign, "NETDEV WATCHDOG") || !strings.Contains(sign, "transmit queue 0 timed out") {
		t.Fatalf("sign = %q", sign)
	}
	if s, _ := scanConsole(filepath.Join(t.TempDir(), "none"), 0); s != "" {
		t.Fatalf("missing log: %q", s)
	}
}

func TestProcStat(t *testing.T) {
	st, cpu, err := procStat(os.Getpid())
	if err != nil || (st != 'R' && st != 'S') {
		t.Fatalf("procStat(self) = %c, %d, %v", st, cpu, err)
	}
	if _, _, err := procStat(1 << 30); err == nil {
		t.Fatal("procStat of no process succeeded")
	}
}

// A case's Fatal ends only its attempt; Case then fails the test with the
// attempt's messages, and a case that ignores its context past its
// deadline is abandoned within its grace, not waited for.
func TestRunAttempt(t *testing.T) {
	a := runAttempt(t, CaseOptions{Timeout: time.Minute, Grace: time.Second}, func(ctx context.Context, tb testing.TB) {
		tb.Cleanup(func() { tb.Log("cleanup ran") })
		tb.Fatalf("boom %d", 7)
		t.Error("Fatal returned")
	})
	if !a.failed() || !strings.Contains(a.messages(), "boom 7") || !strings.Contains(a.messages(), "cleanup ran") {
		t.Fatalf("failed %v, messages %q", a.failed(), a.messages())
	}

	a = runAttempt(t, CaseOptions{Timeout: 50 * time.Millisecond, Grace: 200 * time.Millisecond}, func(ctx context.Context, tb testing.TB) {
		time.Sleep(5 * time.Second) // ignores ctx
		tb.Log("late")              // must not reach t after the test moved on
	})
	if !a.failed() || !strings.Contains(a.overrun, "deadline") || !strings.Contains(a.overrun, "abandoned") {
		t.Fatalf("overrun %q", a.overrun)
	}

	// A counter that stops moving ends the attempt long before its deadline.
	var n atomic.Uint64
	t0 := time.Now()
	a = runAttempt(t, CaseOptions{Timeout: time.Hour, Grace: time.Second, Stall: 400 * time.Millisecond, Progress: n.Load},
		func(ctx context.Context, tb testing.TB) {
			for range 20 { // moving: no hang
				n.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
			<-ctx.Done() // then still
			tb.Fatal(context.Cause(ctx))
		})
	if !a.failed() || !strings.Contains(a.messages(), "no progress") || time.Since(t0) > time.Minute {
		t.Fatalf("a stalled case: failed %v after %v: %q", a.failed(), time.Since(t0), a.messages())
	}

	a = runAttempt(t, CaseOptions{Timeout: time.Minute}, func(ctx context.Context, tb testing.TB) {
		if tb.Context() != ctx {
			tb.Error("Context() is not the case's context")
		}
	})
	if a.failed() {
		t.Fatalf("a passing attempt failed: %q", a.messages())
	}
}

// stallCase is a case that, on its first attempt, makes the guest fail in
// the way inject does and then waits on a guest job that cannot end by
// itself; Case must see the lab fault, restart the guest and pass on the
// second attempt, all within minutes.
func stallCase(t *testing.T, inject func(ctx context.Context, tb testing.TB, g *Guest)) {
	lab := Get(t)
	g := lab.Guests[0]
	var attempts atomic.Int32
	t0 := time.Now()
	lab.Case(t, CaseOptions{Timeout: 8 * time.Minute}, func(ctx context.Context, tb testing.TB) {
		n := attempts.Add(1)
		if n == 1 {
			inject(ctx, tb, g)
			_, _, _, err := g.Exec(ctx, "sleep", "3600")
			if !errors.Is(err, ErrLabFault) {
				tb.Fatalf("the stalled guest's job ended with %v, want a lab fault", err)
			}
			tb.Fatalf("job ended by the fault: %v", err)
		}
		out, _, code, err := g.Exec(ctx, "ping", "-c", "1", "-W", "5", lab.PeerAddr.String())
		if err != nil || code != 0 {
			tb.Fatalf("restarted guest cannot reach the peer: exit %d, %v\n%s", code, err, out)
		}
	})
	if n := attempts.Load(); n != 2 {
		t.Fatalf("the case ran %d times, want 2", n)
	}
	t.Logf("stall detected, guest restarted and case rerun in %.1fs", time.Since(t0).Seconds())
	if g.Fault() != nil {
		t.Fatalf("fault not cleared: %v", g.Fault())
	}
}

// TestCaseRecoversStoppedQEMU: qemu frozen by SIGSTOP.
func TestCaseRecoversStoppedQEMU(t *testing.T) {
	stallCase(t, func(ctx context.Context, tb testing.TB, g *Guest) {
		pid, err := g.qemuPID()
		if err != nil {
			tb.Fatal(err)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			tb.Fatal(err)
		}
		tb.Logf("qemu pid %d stopped", pid)
	})
}

// TestCaseRecoversStalledNIC: the guest's NIC stops and its kernel logs a
// transmit timeout, as virtio_net did under TCG (the message is written to
// the kernel log by hand; the NIC is really stopped).
func TestCaseRecoversStalledNIC(t *testing.T) {
	stallCase(t, func(ctx context.Context, tb testing.TB, g *Guest) {
		script := `ip link set eth0 down; echo "<4>virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5120 ms (simulated by rxelab's test)" > /dev/kmsg`
		// The watch may end the job itself once the line is logged.
		if _, errOut, code, err := g.Exec(ctx, "sh", "-c", script); !errors.Is(err, ErrLabFault) && (err != nil || code != 0) {
			tb.Fatalf("stopping the NIC: exit %d, %v, %s", code, err, errOut)
		}
		tb.Log("guest NIC stopped")
	})
}

func TestFaultErrorWraps(t *testing.T) {
	err := error(&FaultError{Guest: "g1-a", Reason: "qemu (pid " + strconv.Itoa(1) + ") is stopped"})
	if !errors.Is(err, ErrLabFault) || !strings.Contains(err.Error(), "g1-a") {
		t.Fatalf("%v", err)
	}
}

// TestCaseRecoversSilentNIC: the guest's NIC stops transmitting without a
// word on its console (as virtio-net did in default series runs); the case
// stalls, Case asks the guest (CheckTransmit), finds eth0 transmitting
// nothing, restarts the guest and reruns the case.
func TestCaseRecoversSilentNIC(t *testing.T) {
	lab := Get(t)
	g := lab.Guests[0]
	var attempts atomic.Int32
	var still atomic.Uint64
	lab.Case(t, CaseOptions{Timeout: 8 * time.Minute, Stall: 5 * time.Second, Progress: still.Load}, func(ctx context.Context, tb testing.TB) {
		if attempts.Add(1) == 1 {
			if _, errOut, code, err := g.Exec(ctx, "sh", "-c", "ip link set eth0 down"); err != nil || code != 0 {
				tb.Fatalf("stopping the NIC: exit %d, %v, %s", code, err, errOut)
			}
			<-ctx.Done()
			tb.Fatal(context.Cause(ctx))
		}
	})
	if n := attempts.Load(); n != 2 {
		t.Fatalf("the case ran %d times, want 2", n)
	}
}
