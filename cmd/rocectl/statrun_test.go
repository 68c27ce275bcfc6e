package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startCuobjServe runs "rocectl cuobj serve" on the embedded UDP link (no
// root) in a subprocess, with extra flags, until the test ends. It returns
// the device's interface name, the process and its first stdout line.
func startCuobjServe(t *testing.T, addr string, extra ...string) (name string, pid int, banner string) {
	t.Helper()
	port := strconv.Itoa(freeUDPPort(t, addr, "127.0.0.1"))
	args := append([]string{"cuobj", "serve", "--listen", "127.0.0.1:0", "--rdma", addr, "--udp-port", port}, extra...)
	cmd := rocectlCmd(append(args, t.TempDir())...)
	var serr syncBuffer
	cmd.Stderr = &serr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
		}
	}()
	select {
	case banner = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatalf("cuobj serve did not start: %s", serr.String())
	}
	if !strings.HasPrefix(banner, "serving") {
		t.Fatalf("cuobj serve: %q, stderr %s", banner, serr.String())
	}
	return addr + ":" + port, cmd.Process.Pid, banner
}

// A long-running command publishes its device for "rocectl stat" while it
// runs, and the device disappears when the process is gone.
func TestStatShowsRunningCommand(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("devstat publishes on Linux only")
	}
	name, pid, _ := startCuobjServe(t, "127.0.0.9")
	var entries []statEntry
	var out, errOut bytes.Buffer
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out.Reset()
		errOut.Reset()
		entries = nil
		run([]string{"stat", "-j"}, &out, &errOut)
		if json.Unmarshal(out.Bytes(), &entries) == nil && findStat(entries, name) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stat does not list %s: %s %s", name, out.String(), errOut.String())
		}
	}
	e := findStat(entries, name)
	if !e.Running || e.PID != pid || e.Command != "cuobj serve" || e.Link != "udp" {
		t.Errorf("stat entry: %+v", *e)
	}
	if _, ok := e.Counters["sent_pkts"]; !ok {
		t.Errorf("no sent_pkts counter: %v", e.Counters)
	}
	out.Reset()
	if code := run([]string{"stat", "-d", name}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "link "+name+"/1 pid "+strconv.Itoa(pid)+" (cuobj serve)") ||
		!strings.Contains(out.String(), "rcvd_pkts") {
		t.Errorf("stat -d %s: exit %d\n%s", name, code, out.String())
	}

	p, _ := os.FindProcess(pid)
	p.Kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out.Reset()
		code := run([]string{"stat", "-d", name}, &out, &errOut)
		if code == 1 && strings.Contains(out.String(), "no running device") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stat -d %s after kill: exit %d\n%s", name, code, out.String())
		}
	}
}

func findStat(entries []statEntry, name string) *statEntry {
	for i := range entries {
		if entries[i].Interface == name {
			return &entries[i]
		}
	}
	return nil
}
