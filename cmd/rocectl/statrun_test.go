package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/roce"
)

// startCuobjServe runs "rocectl cuobj serve" on the embedded UDP link (no
// root) in a subprocess, with extra flags, until the test ends. It returns
// the device's interface name, the process id and its stderr.
func startCuobjServe(t *testing.T, addr string, extra ...string) (name string, pid int, stderr *syncBuffer) {
	t.Helper()
	port := strconv.Itoa(freeUDPPort(t, addr, "127.0.0.1"))
	args := append([]string{"cuobj", "serve", "--listen", "127.0.0.1:0", "--rdma", addr, "--udp-port", port}, extra...)
	cmd := rocectlCmd(append(args, t.TempDir())...)
	serr := new(syncBuffer)
	cmd.Stderr = serr
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
	var banner string
	select {
	case banner = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatalf("cuobj serve did not start: %s", serr.String())
	}
	if !strings.HasPrefix(banner, "serving") {
		t.Fatalf("cuobj serve: %q, stderr %s", banner, serr.String())
	}
	return addr + ":" + port, cmd.Process.Pid, serr
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

// --metrics serves the device's counters and cuObject's to Prometheus.
func TestMetricsFlag(t *testing.T) {
	name, _, serr := startCuobjServe(t, "127.0.0.10", "--metrics", "127.0.0.1:0")
	// The banner on stdout and the metrics line on stderr come in either
	// order.
	re := regexp.MustCompile(`metrics on (http://\S+/metrics)`)
	var m []string
	for deadline := time.Now().Add(20 * time.Second); m == nil; time.Sleep(20 * time.Millisecond) {
		if m = re.FindStringSubmatch(serr.String()); m == nil && time.Now().After(deadline) {
			t.Fatalf("no metrics address on stderr: %s", serr.String())
		}
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %s", m[1], err, resp.Status)
	}
	for _, want := range []string{
		`roce_rcvd_pkts_total{device="` + name + `"}`,
		`roce_device_info{device="` + name + `",fallback="false",interface="` + name + `",link="udp"} 1`,
		"cuobj_server_gets_total 0",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}

// A --metrics address that is not one is refused before anything opens.
func TestMetricsFlagInvalid(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"rping", "-c", "-a", "127.0.0.1", "--metrics", "9100"}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), "-metrics 9100: not host:port") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// naaice serve's --metrics shows the software NAA's counters.
func TestNAAICEMetrics(t *testing.T) {
	la, _ := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	dev, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	reg := prometheus.NewRegistry()
	naaiceMetrics(reg, naaice.NewServer(dev, naaice.ServerOptions{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"naaice_server_rpcs_total", "naaice_server_accepted_total", "naaice_server_active_connections"} {
		if !names[n] {
			t.Errorf("no %s in %v", n, names)
		}
	}
}

// rstream, riostream and rcopy's --metrics shows package rsocket's counters.
func TestRsocketMetrics(t *testing.T) {
	mfs, err := rsocketMetrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	for _, n := range []string{"rsocket_connections", "rsocket_protocol_errors_total", "rsocket_handshake_timeouts_total"} {
		if !names[n] {
			t.Errorf("no %s in %v", n, names)
		}
	}
}
