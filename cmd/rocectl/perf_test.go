package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPerfCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "pingpong") || !strings.Contains(out.String(), "perf") {
		t.Errorf("help: exit %d, out %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"help", "perf"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "--loopback") && !strings.Contains(out.String(), "-loopback") ||
		!strings.Contains(out.String(), "-run_infinitely") || !strings.Contains(out.String(), "--qp (-q)") {
		t.Errorf("help perf: exit %d, out %q", code, out.String())
	}
	out.Reset()
	// The README's command: both ends in one process, no root needed.
	if code := run([]string{"perf", "write-bw", "--loopback", "-n", "50"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "BW average[MB/sec]") || !strings.Contains(out.String(), " 65536      50   ") {
		t.Errorf("perf write-bw --loopback: exit %d\nstdout %s\nstderr %s", code, out.String(), errOut.String())
	}
	out.Reset()
	// perftest's long forms, and -q's sum over the QPs.
	if code := run([]string{"perf", "write-bw", "--loopback", "--iters=20", "--size=4096", "--qp=2", "--post_list=4",
		"--inline_size=0", "--qp-timeout=16", "--gid-index=-1", "--tos=0"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), " 4096       40   ") || !strings.Contains(out.String(), "Number of qps   : 2") {
		t.Errorf("perf long options: exit %d\nstdout %s\nstderr %s", code, out.String(), errOut.String())
	}
}

// A running perf publishes its devices for "rocectl stat" and serves
// --metrics; --run_infinitely prints a row per period until interrupted,
// then ends cleanly.
func TestStatShowsRunningPerf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("devstat publishes on Linux only")
	}
	cmd := rocectlCmd("perf", "write-bw", "--loopback", "--run_infinitely", "-D", "1", "-s", "4096", "--metrics", "127.0.0.1:0")
	stdout, serr := new(syncBuffer), new(syncBuffer)
	cmd.Stdout, cmd.Stderr = stdout, serr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
		}
	})
	pid := cmd.Process.Pid
	var entries []statEntry
	var out, errOut bytes.Buffer
	found := 0
	for deadline := time.Now().Add(30 * time.Second); found < 2; time.Sleep(50 * time.Millisecond) {
		out.Reset()
		entries, found = nil, 0
		run([]string{"stat", "-j"}, &out, &errOut)
		json.Unmarshal(out.Bytes(), &entries)
		for _, e := range entries {
			if e.Running && e.PID == pid && e.Command == "perf" {
				found++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stat lists %d of perf's 2 devices: %s\nperf stderr: %s", found, out.String(), serr.String())
		}
	}
	m := regexp.MustCompile(`metrics on (http://\S+/metrics)`).FindStringSubmatch(serr.String())
	if m == nil {
		t.Fatalf("no metrics address on stderr: %s", serr.String())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "roce_sent_pkts_total") {
		t.Errorf("/metrics:\n%s", body)
	}
	// A row per second; wait for one, then interrupt.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stdout.String(), "\n 4096 "); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no row:\n%s\n%s", stdout.String(), serr.String())
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGINT: %v\n%s\n%s", err, stdout.String(), serr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after SIGINT:\n%s", stdout.String())
	}
	if !strings.HasSuffix(stdout.String(), "-----\n") {
		t.Errorf("output does not end with perftest's closing line:\n%s", stdout.String())
	}
}
