package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"golang.org/x/sys/unix"
)

// privateBPFFS mounts a bpffs of the test's own, so pins neither need nor
// touch /sys/fs/bpf.
func privateBPFFS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Skipf("cannot mount a bpf filesystem (CONFIG_BPF_SYSCALL, CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return filepath.Join(dir, "goroce")
}

// xdpOn reports the XDP program on v, from inside its namespace.
func xdpOn(t *testing.T, v *netnstest.Veth) bpf.AttachInfo {
	t.Helper()
	var info bpf.AttachInfo
	if err := v.NS.Do(func() (err error) {
		info, err = bpf.Attached(v.Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return info
}

// waitXDP waits until v has (or has not) an XDP program.
func waitXDP(t *testing.T, v *netnstest.Veth, attached bool) bpf.AttachInfo {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info := xdpOn(t, v)
		if info.Attached == attached {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: XDP attached %v, want %v", v.Name, info.Attached, attached)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func showJSON(t *testing.T, ns *netnstest.NS, args ...string) []linkEntry {
	t.Helper()
	code, out, errOut := runIn(t, ns, append([]string{"link", "show", "-j"}, args...)...)
	if code != 0 {
		t.Fatalf("link show: exit %d: %s", code, errOut)
	}
	var es []linkEntry
	if err := json.Unmarshal([]byte(out), &es); err != nil {
		t.Fatalf("link show -j: %v: %q", err, out)
	}
	return es
}

func TestLinkUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"link", "attach"}, &out, &errOut); code != 2 {
		t.Errorf("attach without -d: exit %d", code)
	}
	if code := run([]string{"link", "frob"}, &out, &errOut); code != 2 {
		t.Errorf("unknown subcommand: exit %d", code)
	}
	if code := run([]string{"link", "attach", "-d", "x", "--mode", "turbo"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "unknown mode") {
		t.Errorf("bad mode: exit %d, %q", code, errOut.String())
	}
	for _, bad := range []string{"..", "../x", "a:b", "0123456789abcdef"} {
		if code := run([]string{"link", "detach", "-d", bad}, &out, &errOut); code != 2 {
			t.Errorf("detach -d %q: exit %d", bad, code)
		}
	}
	out.Reset()
	if code := run([]string{"help", "link"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "until \"rocectl link detach\"") {
		t.Errorf("help link: exit %d, %q", code, out.String())
	}
}

// TestLinkAttachPinned: a pinned program outlives the attaching process,
// steers (counts) RoCEv2 frames, and leaves with detach.
func TestLinkAttachPinned(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	pins := privateBPFFS(t)
	a := p.VethA

	cmd := rocectlCmd("link", "attach", "-d", a.Name, "--pin-dir", pins)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := a.NS.Run(cmd); err != nil {
		t.Fatalf("link attach: %v: %s", err, out.String())
	}
	// The attaching process has exited; the pin keeps the program.
	info := xdpOn(t, a)
	if !info.Attached || info.Name != "goroce_steer" {
		t.Fatalf("after attach and exit: %+v", info)
	}
	es := showJSON(t, a.NS, "-d", a.Name, "--pin-dir", pins)
	if len(es) != 1 || !es[0].Goroce || es[0].Pinned == "" || es[0].Stale || es[0].ProgramID != info.ProgramID || es[0].Steering == nil {
		t.Fatalf("show: %+v", es)
	}
	if _, err := os.Stat(es[0].Pinned); err != nil {
		t.Fatalf("pin: %v", err)
	}

	// A RoCEv2 datagram with no socket registered: counted and passed.
	if err := p.B.Do(func() error {
		c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: a.Addr.Addr().AsSlice(), Port: 4791})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 40))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		es = showJSON(t, a.NS, "-d", a.Name, "--pin-dir", pins)
		if es[0].Steering != nil && es[0].Steering.NoSocket >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no_socket not counted: %+v", es[0].Steering)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, text, _ := runIn(t, a.NS, "link", "show", "--pin-dir", pins)
	if code != 0 || !strings.Contains(text, "goroce pinned") || !strings.Contains(text, "no_socket") {
		t.Errorf("show: exit %d, %q", code, text)
	}

	// stat shows the pinned program's counters with no device running.
	var es2 []statEntry
	_ = a.NS.Do(func() error { code, es2 = statJSON(t, "-d", a.Name); return nil })
	if code != 0 || len(es2) != 1 || es2[0].Running || es2[0].Steering == nil ||
		es2[0].Steering.NoSocket < 1 || es2[0].Steering.ProgramID != info.ProgramID {
		t.Errorf("stat with a pinned program: exit %d, %+v", code, es2)
	}

	// A second attach finds the interface busy.
	code, _, errOut := runIn(t, a.NS, "link", "attach", "-d", a.Name, "--pin-dir", pins)
	if code != 1 || !strings.Contains(errOut, "already has an XDP program") {
		t.Errorf("second attach: exit %d, %q", code, errOut)
	}

	code, _, errOut = runIn(t, a.NS, "link", "detach", "-d", a.Name, "--pin-dir", pins)
	if code != 0 {
		t.Fatalf("detach: exit %d: %s", code, errOut)
	}
	waitXDP(t, a, false)
	if _, err := os.Stat(es[0].Pinned); !os.IsNotExist(err) {
		t.Errorf("pin still there: %v", err)
	}
	code, _, errOut = runIn(t, a.NS, "link", "detach", "-d", a.Name, "--pin-dir", pins)
	if code != 1 || !strings.Contains(errOut, "no XDP program") {
		t.Errorf("detach again: exit %d, %q", code, errOut)
	}
	if es := showJSON(t, a.NS, "--pin-dir", pins); len(es) != 0 {
		t.Errorf("show after detach: %+v", es)
	}
}

// TestLinkAttachForeground: without a pin the program leaves with the
// process, also when it is killed.
func TestLinkAttachForeground(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	pins := privateBPFFS(t)
	a := p.VethA

	cmd := rocectlCmd("link", "attach", "-d", a.Name, "--foreground", "--mode", "generic", "--pin-dir", pins)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.NS.Start(cmd); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "not pinned") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("attach --foreground: %q, %v", line, err)
	}
	info := xdpOn(t, a)
	if !info.Attached || info.Mode != bpf.AttachGeneric || info.Name != "goroce_steer" {
		t.Errorf("while running: %+v", info)
	}
	es := showJSON(t, a.NS, "-d", a.Name, "--pin-dir", pins)
	if len(es) != 1 || !es[0].Goroce || es[0].Pinned != "" {
		t.Errorf("show: %+v", es)
	}
	// Held by a live process's bpf_link: detach refuses.
	code, _, errOut := runIn(t, a.NS, "link", "detach", "-d", a.Name, "--pin-dir", pins)
	if code != 1 || !strings.Contains(errOut, "running process") {
		t.Errorf("detach of a held program: exit %d, %q", code, errOut)
	}
	if err := cmd.Process.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitXDP(t, a, false)

	// With --duration it detaches by itself and reports the counters.
	cmd = rocectlCmd("link", "attach", "-d", a.Name, "--foreground", "--duration", "200ms")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := a.NS.Run(cmd); err != nil {
		t.Fatalf("attach --duration: %v: %s", err, out.String())
	}
	if !strings.Contains(out.String(), "redirected 0 no_socket") || !strings.Contains(out.String(), "detached") {
		t.Errorf("attach --duration output: %q", out.String())
	}
	waitXDP(t, a, false)
}

// TestLinkStalePin: a pin whose interface is gone is shown as stale and
// removed by detach.
func TestLinkStalePin(t *testing.T) {
	ns := netnstest.New(t)
	pins := privateBPFFS(t)
	a, _ := netnstest.NewVeth(t, ns, ns, netnstest.VethConfig{})
	code, _, errOut := runIn(t, ns, "link", "attach", "-d", a.Name, "--mode", "generic", "--pin-dir", pins)
	if code != 0 {
		t.Fatalf("attach: exit %d: %s", code, errOut)
	}
	if err := ns.Do(func() error {
		l, err := a.Link()
		if err != nil {
			return err
		}
		return ns.Netlink().LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	es := showJSON(t, ns, "--pin-dir", pins)
	if len(es) != 1 || !es[0].Stale || es[0].Interface != a.Name {
		t.Fatalf("show: %+v", es)
	}
	code, out, errOut := runIn(t, ns, "link", "detach", "-d", a.Name, "--pin-dir", pins)
	if code != 0 || !strings.Contains(out, "stale") {
		t.Fatalf("detach: exit %d, %q %q", code, out, errOut)
	}
	if es := showJSON(t, ns, "--pin-dir", pins); len(es) != 0 {
		t.Errorf("show after detach: %+v", es)
	}
}

// TestLinkMountsBPFFS: with the default pin directory, attach mounts a
// bpffs on /sys/fs/bpf when there is none, as bpftool does. The commands
// run in a private mount namespace, so the host's mounts are untouched (and
// the pin, with the program, goes when that namespace ends).
func TestLinkMountsBPFFS(t *testing.T) {
	p := netnstest.NewPair(t, 1500)
	a := p.VethA
	cmd := rocectlCmd("link", "attach", "-d", a.Name, "--mode", "generic", "+",
		"link", "show", "-d", a.Name, "+", "link", "detach", "-d", a.Name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := a.NS.Run(cmd); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	for _, w := range []string{"pinned at /sys/fs/bpf/goroce/netns-", "goroce pinned /sys/fs/bpf/goroce/netns-", "detached (pin"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	waitXDP(t, a, false)
}
