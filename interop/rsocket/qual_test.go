package rsocket

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcapdump"
)

// TestRstreamModes: the guest's rstream with blocking (-T b), nonblocking
// (-T n) and asynchronous (-T a, rpoll before each call) calls, in both
// roles, every byte verified on both sides.
func TestRstreamModes(t *testing.T) {
	lab, g, _ := rxeSetup(t)
	for _, mode := range []string{"b", "n", "a"} {
		c := rstreamCase{size: 10000, count: 20, iters: 2, verify: true, mode: mode}
		t.Run("T"+mode+"/goroce-client", func(t *testing.T) { rstreamGuestServer(t, g.Addr, c) })
		t.Run("T"+mode+"/goroce-server", func(t *testing.T) { rstreamGuestClient(t, lab.PeerAddr, c) })
	}
}

// TestCapture records what goroce sent and received during rstream runs
// in both roles (rdma_cm handshake and teardown MADs, data and control
// RDMA WRITEs with immediate, keepalives, ACKs): every frame is RoCEv2 with
// a valid ICRC, and tshark dissects every frame as InfiniBand with none
// malformed.
func TestCapture(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (.ci/run installs it): %v", err)
	}
	file := filepath.Join(t.TempDir(), "rsocket.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := dev.SetCapture(f); err != nil {
		t.Fatal(err)
	}
	c := rstreamCase{size: 5000, count: 10, iters: 1, verify: true, keepalive: 1}
	okc := t.Run("goroce-client", func(t *testing.T) { rstreamGuestServer(t, g.Addr, c) })
	oks := t.Run("goroce-server", func(t *testing.T) { rstreamGuestClient(t, lab.PeerAddr, c) })
	if err := dev.SetCapture(nil); err != nil {
		t.Fatal(err)
	}
	if !okc || !oks {
		t.Fatal("a run failed: the capture misses its traffic")
	}

	// Our decoder: every frame RoCEv2 with a valid ICRC, and the kinds of
	// frame an rsocket exchange is made of, in both directions.
	ours := lab.PeerAddr.String()
	kinds := map[string]map[string]int{"goroce→rxe": {}, "rxe→goroce": {}}
	frames, bad := 0, 0
	var d pcapdump.Decoder
	var r pcapdump.Record
	rf, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	err = pcapdump.ReadFrames(rf, func(fr pcapdump.Frame) error {
		frames++
		d.Decode(fr, &r)
		if r.Failed() || r.NotRoCE {
			if bad++; bad <= 10 {
				t.Errorf("frame %d: %s (ICRC ok %v)", r.Frame, r.Error, r.ICRCOK)
			}
			return nil
		}
		dir := "rxe→goroce"
		if r.Src == ours {
			dir = "goroce→rxe"
		}
		kinds[dir][frameKind(r)]++
		return nil
	})
	if err != nil {
		t.Fatalf("reading the capture: %v", err)
	}
	if bad > 0 {
		t.Errorf("%d of %d frames failed to decode or verify", bad, frames)
	}
	for dir, k := range kinds {
		// Keepalives (write-empty) appear only in runs longer than their
		// period, so they are not required. Zero-length control writes
		// (write-imm-empty: a DISCONNECT, or credits sent alone) are
		// required in one direction only: librdmacm's second closer sends no
		// DISCONNECT, and which side closes first depends on scheduling.
		for _, w := range []string{"cm-mad", "write-imm", "ack"} {
			if k[w] == 0 {
				t.Errorf("%s: no %s frame (%v)", dir, w, k)
			}
		}
	}
	if kinds["goroce→rxe"]["write-imm-empty"]+kinds["rxe→goroce"]["write-imm-empty"] == 0 {
		t.Errorf("no zero-length control write in either direction")
	}
	t.Logf("%d frames, all RoCEv2 with a valid ICRC\n  goroce→rxe: %s\n  rxe→goroce: %s", frames,
		kindString(kinds["goroce→rxe"]), kindString(kinds["rxe→goroce"]))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts := func(filter string) []string {
		out, err := exec.CommandContext(ctx, tshark, "-n", "-r", file, "-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("tshark -Y %q: %v\n%s", filter, err, stderr)
		}
		return strings.Fields(string(out))
	}
	if m := ts("_ws.malformed || _ws.expert.severity >= error"); len(m) != 0 {
		if len(m) > 20 {
			m = m[:20]
		}
		t.Errorf("tshark: malformed or erroneous frames %v", m)
	}
	// rstream's port in the service ID of each REQ: tshark read the
	// rdma_cm service ID (and its IP private data) of both runs.
	all, ibf, cmf := ts("frame"), ts("infiniband"), ts("infiniband.cm.req.serviceid.dport == 7471")
	if len(all) != frames || len(ibf) != len(all) {
		t.Errorf("tshark dissected %d of %d frames as InfiniBand (our decoder read %d)", len(ibf), len(all), frames)
	}
	if len(cmf) < 2 {
		t.Errorf("tshark found %d REQs to rstream's port, want one per run", len(cmf))
	}
	t.Logf("tshark: %d frames, all InfiniBand (%d REQs to port 7471), none malformed", len(all), len(cmf))
	if t.Failed() {
		if dir := os.Getenv("GOROCE_RSOCKET_ARTIFACTS"); dir != "" {
			if b, err := os.ReadFile(file); err == nil {
				os.WriteFile(filepath.Join(dir, "rsocket.pcap"), b, 0o644)
			}
		}
	}
}

// frameKind names the frames of an rsocket exchange: zero-length writes
// with immediate are credit and control messages, zero-length writes
// without are keepalives.
func frameKind(r pcapdump.Record) string {
	switch op := ib.Opcode(r.Opcode); {
	case r.DestQP == 1:
		return "cm-mad"
	case op == ib.RCWriteOnlyImm && r.PayloadLen == 0:
		return "write-imm-empty"
	case op == ib.RCWriteOnlyImm || op == ib.RCWriteLastImm:
		return "write-imm"
	case op == ib.RCWriteOnly && r.PayloadLen == 0:
		return "write-empty"
	case op == ib.RCWriteFirst || op == ib.RCWriteMiddle || op == ib.RCWriteOnly || op == ib.RCWriteLast:
		return "write"
	case op == ib.RCAck:
		return "ack"
	default:
		return op.String()
	}
}

func kindString(k map[string]int) string {
	keys := make([]string, 0, len(k))
	for n := range k {
		keys = append(keys, n)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, n := range keys {
		fmt.Fprintf(&b, "%s=%d ", n, k[n])
	}
	return b.String()
}

// TestRocectl runs the commands, "rocectl rstream" and "rocectl
// riostream" as a user would (built from cmd/rocectl, in the lab's peer
// netns, on its interface over AF_XDP), tool to tool against the guest's
// rstream and riostream in both roles: both exit 0 and print the same
// header and result lines (measurements aside).
func TestRocectl(t *testing.T) {
	lab, g, _ := rxeSetup(t)
	labDev.release() // rocectl opens the lab interface itself
	bin := buildRocectl(t)
	c := rstreamCase{size: 10000, count: 20, iters: 2, verify: true}
	rocectl := func(ctx context.Context, tool string, args ...string) (string, error) {
		a := append([]string{"netns", "exec", lab.PeerNS, bin, tool, "-d", lab.PeerIf, "-link", "xdp"}, args...)
		out, err := exec.CommandContext(ctx, "ip", a...).CombinedOutput()
		return string(out), err
	}
	for _, tool := range []string{"rstream", "riostream"} {
		t.Run(tool+"/goroce-client", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			var out string
			var err error
			var stdout, stderr []byte
			var code int
			var jerr error
			// riostream's server gives a connection that comes between its
			// rlisten and its RDMA_IOMAPSIZE no iomap (riomap: ENOMEM): that
			// race of the tool's is retried with a fresh server.
			for attempt := 0; attempt < 3; attempt++ {
				jctx, stop := context.WithCancel(ctx)
				job := g.Start(jctx, append([]string{tool}, c.args()...)...)
				for {
					out, err = rocectl(ctx, tool, append([]string{"-s", g.Addr.String()}, c.args()...)...)
					// Before the server listens, rconnect is rejected.
					if err == nil || !strings.Contains(out, "rconnect") || ctx.Err() != nil {
						break
					}
					select {
					case <-job.Done():
						stdout, stderr, code, _ := job.Wait()
						stop()
						t.Fatalf("guest %s server exited %d before we connected\n%s%s", tool, code, stdout, stderr)
					case <-time.After(200 * time.Millisecond):
					}
				}
				if err != nil {
					stop()
				}
				stdout, stderr, code, jerr = job.Wait()
				stop()
				if tool != "riostream" || err == nil || !strings.Contains(out, "riomap") {
					break
				}
				t.Logf("attempt %d: the server took the connection without its iomap; again\n%s", attempt, out)
			}
			t.Logf("rocectl %s:\n%sguest %s:\n%s%s", tool, out, tool, stdout, stderr)
			if err != nil {
				t.Fatalf("rocectl %s: %v", tool, err)
			}
			if jerr != nil || code != 0 {
				t.Fatalf("guest %s server: exit %d (%v)", tool, code, jerr)
			}
			compareOutputs(t, c, out, string(stdout))
		})
		t.Run(tool+"/goroce-server", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			type result struct {
				out string
				err error
			}
			srv := make(chan result, 1)
			go func() {
				out, err := rocectl(ctx, tool, append([]string{"-b", lab.PeerAddr.String()}, c.args()...)...)
				srv <- result{out, err}
			}()
			args := append([]string{tool, "-s", lab.PeerAddr.String()}, c.args()...)
			var stdout, stderr []byte
			var code int
			var err error
			for {
				stdout, stderr, code, err = g.Exec(ctx, args...)
				// Until rocectl listens, the guest's rconnect is rejected.
				if err != nil || code == 0 || !strings.Contains(string(stdout)+string(stderr), "rconnect") || ctx.Err() != nil {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if err != nil || code != 0 {
				cancel()
			}
			r := <-srv
			t.Logf("guest %s:\n%s%s\nrocectl %s:\n%s", tool, stdout, stderr, tool, r.out)
			if err != nil || code != 0 {
				t.Fatalf("guest %s client: exit %d (%v)", tool, code, err)
			}
			if r.err != nil {
				t.Fatalf("rocectl %s: %v", tool, r.err)
			}
			compareOutputs(t, c, r.out, string(stdout))
		})
	}
}

// compareOutputs: the same header line, and the same result lines but for
// the measured fields.
func compareOutputs(t *testing.T, c rstreamCase, ours, theirs string) {
	t.Helper()
	header := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "name ") {
				return l
			}
		}
		return ""
	}
	if h := header(theirs); h == "" || header(ours) != h {
		t.Errorf("header lines differ:\n goroce %q\n guest  %q", header(ours), h)
	}
	checkResults(t, c, ours, theirs)
}

// buildRocectl builds the rocectl command into a temporary directory.
func buildRocectl(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(string(bytes.TrimSpace(out)))
	bin := filepath.Join(t.TempDir(), "rocectl")
	if out, err := exec.Command("go", "build", "-o", bin, filepath.Join(root, "cmd", "rocectl")).CombinedOutput(); err != nil {
		t.Fatalf("building rocectl: %v\n%s", err, out)
	}
	return bin
}
