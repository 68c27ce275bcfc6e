// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrLabFault is wrapped by the errors of a guest that stopped working for
// reasons of the lab, not of the code under test: its qemu exited or was
// stopped, its qemu made no progress, or its NIC's transmit queue timed out
// (the kernel's "NETDEV WATCHDOG"). [Case] reruns a case once after such a
// fault; nothing else is retried.
var ErrLabFault = errors.New("rxelab: lab fault")

// FaultError says what went wrong with which guest.
type FaultError struct {
	Guest  string
	Reason string
	At     time.Time
}

func (e *FaultError) Error() string {
	return fmt.Sprintf("rxelab: lab fault on guest %s: %s", e.Guest, e.Reason)
}

func (e *FaultError) Unwrap() error { return ErrLabFault }

// How the watcher judges a guest. A TCG guest always burns CPU (its timer
// ticks alone are emulated), so a qemu whose CPU time stands still for
// qemuStallAfter is stuck even if the host is busy; the kernel prints
// NETDEV WATCHDOG 5 s after a transmit stops completing.
const (
	watchEvery     = time.Second
	qemuStallAfter = 30 * time.Second
)

// faultSigns are console lines that mean the guest can no longer carry a
// test's traffic (seen: virtio_net's transmit queue timing out under TCG,
// never recovering).
var faultSigns = []string{"NETDEV WATCHDOG", "Kernel panic"}

// guestWatch is a guest's fault state, owned by the lab's watcher.
type guestWatch struct {
	mu      sync.Mutex
	fault   *FaultError
	faulted chan struct{} // closed when fault is set; replaced on restart
	conOff  int64         // console.log bytes already read
	cpu     uint64        // qemu's utime+stime in ticks, at cpuAt
	cpuAt   time.Time
}

func (w *guestWatch) init() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fault, w.faulted, w.conOff, w.cpu, w.cpuAt = nil, make(chan struct{}), 0, 0, time.Time{}
}

// Fault returns the guest's lab fault since it (re)started, or nil.
func (g *Guest) Fault() error {
	g.watch.mu.Lock()
	defer g.watch.mu.Unlock()
	if g.watch.fault == nil {
		return nil
	}
	return g.watch.fault
}

// Faulted is closed when the guest has a lab fault.
func (g *Guest) Faulted() <-chan struct{} {
	g.watch.mu.Lock()
	defer g.watch.mu.Unlock()
	if g.watch.faulted == nil {
		g.watch.faulted = make(chan struct{})
	}
	return g.watch.faulted
}

// setFault records the first fault of the guest's current life.
func (g *Guest) setFault(reason string) {
	g.watch.mu.Lock()
	defer g.watch.mu.Unlock()
	if g.watch.fault != nil {
		return
	}
	if g.watch.faulted == nil {
		g.watch.faulted = make(chan struct{})
	}
	g.watch.fault = &FaultError{Guest: g.Name, Reason: reason, At: time.Now()}
	close(g.watch.faulted)
	if g.lab != nil && g.lab.logf != nil {
		g.lab.logf("%v", g.watch.fault)
	}
}

// check looks at the guest from the host side only (no guest job: a guest
// whose qemu is stopped cannot run one) and records a fault it finds.
func (g *Guest) check(now time.Time) {
	if g.Fault() != nil || g.dir == "" {
		return
	}
	pid, err := g.qemuPID()
	if err != nil {
		g.setFault("qemu is gone: " + err.Error())
		return
	}
	state, cpu, err := procStat(pid)
	if err != nil {
		g.setFault(fmt.Sprintf("qemu (pid %d) is gone: %v", pid, err))
		return
	}
	if state == 'T' || state == 't' {
		g.setFault(fmt.Sprintf("qemu (pid %d) is stopped (state %c)", pid, state))
		return
	}
	g.watch.mu.Lock()
	switch {
	case g.watch.cpuAt.IsZero() || cpu != g.watch.cpu:
		g.watch.cpu, g.watch.cpuAt = cpu, now
	case now.Sub(g.watch.cpuAt) > qemuStallAfter:
		g.watch.mu.Unlock()
		g.setFault(fmt.Sprintf("qemu (pid %d) used no CPU for %v", pid, now.Sub(g.watch.cpuAt).Round(time.Second)))
		return
	}
	off := g.watch.conOff
	g.watch.mu.Unlock()
	line, next := scanConsole(filepath.Join(g.dir, "console.log"), off)
	g.watch.mu.Lock()
	g.watch.conOff = next
	g.watch.mu.Unlock()
	if line != "" {
		g.setFault("guest console: " + line)
	}
}

// scanConsole reads the console log from off and returns the first line
// with a fault sign, and the offset to read from next time (the start of an
// unfinished last line, so a sign split across two reads is still found).
func scanConsole(path string, off int64) (sign string, next int64) {
	f, err := os.Open(path)
	if err != nil {
		return "", off
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return "", off
	}
	b, err := io.ReadAll(io.LimitReader(f, 4<<20))
	if err != nil {
		return "", off
	}
	end := bytes.LastIndexByte(b, '\n') + 1
	for _, l := range strings.Split(string(b[:end]), "\n") {
		for _, s := range faultSigns {
			if strings.Contains(l, s) {
				return strings.TrimSpace(l), off + int64(end)
			}
		}
	}
	return "", off + int64(end)
}

func (g *Guest) qemuPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(g.dir, "qemu.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// procStat returns a process's state and its utime+stime in clock ticks.
func procStat(pid int) (state byte, cpu uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return f[0][0], ut + st, nil
}

// watch checks every guest each watchEvery until stop is closed.
func (l *Lab) watchGuests(stop <-chan struct{}) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			l.restartMu.Lock() // a guest being restarted is not judged meanwhile
			for _, g := range l.Guests {
				g.check(now)
			}
			l.restartMu.Unlock()
		}
	}
}

// Diagnose gathers what tells a lab fault from a fault of the code under
// test: qemu's state, the tap's counters (the guest's transmissions are its
// receptions), the guest console's last lines and, if the guest still runs
// jobs, its NIC counters, neighbour table, rxe counters and kernel log. It
// also writes them to a file in the lab's log folder and names it.
func (g *Guest) Diagnose(ctx context.Context) string {
	var b strings.Builder
	fmt.Fprintf(&b, "=== diagnostics of guest %s at %s\n", g.Name, time.Now().UTC().Format(time.RFC3339))
	if err := g.Fault(); err != nil {
		fmt.Fprintf(&b, "fault: %v\n", err)
	}
	if pid, err := g.qemuPID(); err == nil {
		st, cpu, err := procStat(pid)
		fmt.Fprintf(&b, "qemu pid %d: state %c, cpu ticks %d, err %v\n", pid, st, cpu, err)
	}
	if g.lab != nil {
		out, _ := execOut(ctx, "ip", "-n", g.lab.NS, "-s", "link", "show", "rxt-"+g.Name)
		fmt.Fprintf(&b, "--- host tap rxt-%s (its RX is the guest's TX)\n%s", g.Name, out)
	}
	if con, err := os.ReadFile(filepath.Join(g.dir, "console.log")); err == nil {
		lines := strings.Split(strings.TrimRight(string(con), "\n"), "\n")
		fmt.Fprintf(&b, "--- guest console, last %d of %d lines\n%s\n", min(40, len(lines)), len(lines),
			strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
	if pid, err := g.qemuPID(); err == nil {
		if st, _, _ := procStat(pid); st != 'T' && st != 't' {
			jctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			out, errOut, code, err := g.execUnwatched(jctx, "sh", "-c", diagScript)
			cancel()
			fmt.Fprintf(&b, "--- in the guest (exit %d, %v)\n%s%s", code, err, out, errOut)
		}
	}
	s := b.String()
	if dir := logDir(); dir != "" {
		p := filepath.Join(dir, fmt.Sprintf("%s-fault-%s.txt", g.Name, time.Now().UTC().Format("20060102T150405")))
		if os.WriteFile(p, []byte(s), 0o644) == nil {
			s += "(saved to " + p + ")\n"
		}
	}
	return s
}

const diagScript = `echo "--- eth0"; ip link show eth0; cd /sys/class/net/eth0/statistics && for f in *; do echo "$f $(cat $f)"; done; cd /
echo "--- ARP table"; cat /proc/net/arp
echo "--- rxe counters"; for f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do echo "$(basename $f) $(cat $f)"; done 2>/dev/null
echo "--- kernel log, last 30 lines"; dmesg | tail -30`

// logDir is the lab CLI's log folder (console logs of downed guests).
func logDir() string {
	dir := os.Getenv("RXE_LAB_STATE")
	if dir == "" {
		dir = "/run/goroce/rxe-lab"
	}
	dir = filepath.Join(dir, "logs")
	if os.MkdirAll(dir, 0o755) != nil {
		return ""
	}
	return dir
}

func execOut(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := execCommand(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Restart powers a faulted guest off at once and boots it again with the same
// address, MAC and settings, then has it resolve the peer again; its fault
// is cleared. The guest's rxe state is new: QPs and MRs of the old life are
// gone.
func (l *Lab) Restart(ctx context.Context, g *Guest) error {
	l.restartMu.Lock()
	defer l.restartMu.Unlock()
	if g.Fault() == nil {
		return nil // another test restarted it meanwhile
	}
	if _, stderr, code, err := l.run(ctx, "down", "--now", g.Name); err != nil || code != 0 {
		return fmt.Errorf("rxelab: down %s (exit %d, %v): %s", g.Name, code, err, stderr)
	}
	g.watch.init()
	if err := l.boot(ctx, g, l.bootTimeout); err != nil {
		return err
	}
	if err := g.ResolvePeer(ctx); err != nil {
		return err
	}
	l.logf("rxelab: guest %s restarted in %.1fs", g.Name, g.Boot.Seconds())
	return nil
}

// transmitScript prints eth0's tx_packets, pings the peer twice, and prints
// tx_packets again: a guest whose NIC still transmits sends at least the
// pings (or, with no neighbour entry, ARP requests) in between.
const transmitScript = `t=/sys/class/net/eth0/statistics/tx_packets
a=$(cat $t); ping -c 2 -W 1 "$1" >/dev/null 2>&1; sleep 1; b=$(cat $t)
echo "$a $b"`

// CheckTransmit asks the guest whether its NIC still transmits (eth0's
// tx_packets before and after a ping of the peer) and records a lab fault
// if it does not: seen in default series runs on a quiet host, a guest's
// virtio-net stopped transmitting minutes in, before its ring filled and
// the kernel's watchdog said so. It returns the fault, or nil.
func (g *Guest) CheckTransmit(ctx context.Context) error {
	if err := g.Fault(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, _, code, err := g.execUnwatched(ctx, "sh", "-c", transmitScript, "sh", g.lab.PeerAddr.String())
	if err != nil || code != 0 {
		return nil // no verdict: the watch judges a guest that runs no job
	}
	var before, after uint64
	if _, err := fmt.Sscan(string(out), &before, &after); err != nil {
		return nil
	}
	if after == before {
		g.setFault(fmt.Sprintf("guest eth0 transmits nothing (tx_packets stayed %d while it pinged the peer)", before))
	}
	return g.Fault()
}
