// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package stress

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
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

// TestCapture records a goroce–rxe exchange twice, with goroce's capture
// tap (what goroce sent and received, as AF_XDP saw it) and with tcpdump on
// the guest's tap in the lab netns (what reached and left the guest, which
// AF_XDP hides from the kernel's own capture on rxeh0): rc_pingpong and
// perftest's write, read and atomic BW tests, goroce as server and as
// client, so requests and responses of every kind travel both ways. In
// both files every RoCEv2 frame must decode and carry a correct ICRC (the
// decoder "rocectl pcap" runs, and its exit status), and tshark must find
// no malformed packet.
func TestCapture(t *testing.T) {
	e := setup(t)
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (the lab's build step installs it): %v", err)
	}
	tcpdump, err := exec.LookPath("tcpdump")
	if err != nil {
		t.Fatalf("tcpdump is not installed (the lab's build step installs it): %v", err)
	}
	dir := t.TempDir()
	tapFile := filepath.Join(dir, "guest-tap.pcap")
	stopDump := startTcpdump(t, tcpdump, e.Lab.NS, e.tap(), tapFile)

	if err := e.Dev.FlushCapture(); err != nil {
		t.Fatal(err)
	}
	e.cap.start()
	run := func(name string, fn func(t *testing.T)) {
		if !t.Run(name, fn) {
			t.Errorf("%s failed: the capture misses its traffic", name)
		}
	}
	pp := perfrun.PingpongConfig{Type: roce.RC, Size: 4096, Iters: 10, MTU: ib.MTU1024, GIDIndex: -1}
	run("rc_pingpong/goroce-server", func(t *testing.T) { runPingpong(t, e, pp, true) })
	run("rc_pingpong/goroce-client", func(t *testing.T) { runPingpong(t, e, pp, false) })
	for _, v := range []perftest.Verb{perftest.Write, perftest.Read, perftest.Atomic} {
		c := perfrun.PerfConfig{Verb: v, Size: 4096, Iters: 20, MTU: ib.MTU1024, GIDIndex: -1}
		if v == perftest.Atomic {
			c.Size = 8
		}
		name := "ib_" + [...]string{"send", "write", "read", "atomic"}[v] + "_bw"
		run(name+"/goroce-server", func(t *testing.T) { runPerf(t, e, name, c, true) })
		run(name+"/goroce-client", func(t *testing.T) { runPerf(t, e, name, c, false) })
	}
	if err := e.Dev.FlushCapture(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // let tcpdump write the last frames
	ourFile := filepath.Join(dir, "goroce.pcap")
	if err := os.WriteFile(ourFile, e.cap.stop(), 0o644); err != nil {
		t.Fatal(err)
	}
	stopDump()

	ourIP := e.Lab.PeerAddr.String()
	for _, f := range []string{ourFile, tapFile} {
		t.Run(filepath.Base(f), func(t *testing.T) {
			checkCapture(t, f, ourIP)
			checkTshark(t, tshark, f)
		})
	}
	// goroce's tap must have recorded exactly the frames that crossed the
	// guest's tap: nothing invented, nothing missed, byte for byte.
	ours, theirs := frameSet(t, ourFile), frameSet(t, tapFile)
	missing, extra := 0, 0
	for f, n := range theirs {
		if ours[f] < n {
			missing += n - ours[f]
		}
	}
	for f, n := range ours {
		if theirs[f] < n {
			extra += n - theirs[f]
		}
	}
	if missing != 0 || extra != 0 {
		t.Errorf("goroce's capture lacks %d frames seen on the guest's tap and has %d not seen there", missing, extra)
	}
	if t.Failed() {
		keepCaptures(t, ourFile, tapFile)
	}
}

// frameSet counts the distinct frames of a capture.
func frameSet(t *testing.T, file string) map[string]int {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	set := map[string]int{}
	err = pcapdump.ReadFrames(f, func(fr pcapdump.Frame) error {
		set[string(fr.Data)]++
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	return set
}

// startTcpdump captures RoCEv2 frames on ifname in netns ns to file, and
// returns once tcpdump listens. The returned func stops it and fails t if
// the kernel dropped frames before tcpdump read them.
//
// Immediate mode (so the last frames are written before the stop) makes
// libpcap use fixed ring slots of the snap length: a small snap length and
// a large buffer keep the ring from overflowing while the machine is busy.
func startTcpdump(t *testing.T, tcpdump, ns, ifname, file string) func() {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, tcpdump, "-i", ifname, "--immediate-mode",
		"-s", "4096", "-B", "32768", "-U", "-n", "-w", file, "udp", "port", "4791")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting tcpdump: %v", err)
	}
	listening := make(chan bool, 1)
	readDone := make(chan struct{})
	var errOut bytes.Buffer
	go func() {
		defer close(readDone)
		buf := make([]byte, 4096)
		sent := false
		for {
			n, err := stderr.Read(buf)
			errOut.Write(buf[:n])
			if !sent && strings.Contains(errOut.String(), "listening on") {
				listening <- true
				sent = true
			}
			if err != nil {
				if !sent {
					listening <- false
				}
				return
			}
		}
	}()
	select {
	case ok := <-listening:
		if !ok {
			<-readDone
			cmd.Wait()
			t.Fatalf("tcpdump on %s did not start: %s", ifname, errOut.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-readDone
		cmd.Wait()
		t.Fatalf("tcpdump on %s did not start within 30 s", ifname)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-readDone:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-readDone
		}
		cmd.Wait()
		out := errOut.String()
		if i := strings.Index(out, " packets dropped by kernel"); i >= 0 {
			j := strings.LastIndexByte(out[:i], '\n') + 1
			if n := strings.TrimSpace(out[j:i]); n != "0" {
				t.Errorf("tcpdump on %s: %s packets dropped by kernel: the capture is incomplete\n%s", ifname, n, out)
			}
		}
	}
	t.Cleanup(stop)
	return stop
}

// checkCapture decodes every frame of file: each must be RoCEv2 with a
// correct ICRC. Both directions must be present with the operations the
// runs produce: each side's requests (SEND, WRITE, READ, atomics) and the
// other side's responses (ACK, READ response, atomic ACK).
func checkCapture(t *testing.T, file, ourIP string) {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d pcapdump.Decoder
	var r pcapdump.Record
	kinds := map[string]map[string]int{"goroce→rxe": {}, "rxe→goroce": {}}
	frames, bad := 0, 0
	type pktKey struct {
		src    string
		qp     uint32
		psn    uint32
		opcode uint8
	}
	seen := map[pktKey]bool{}
	resent := map[string]int{}
	err = pcapdump.ReadFrames(f, func(fr pcapdump.Frame) error {
		frames++
		d.Decode(fr, &r)
		if r.Failed() || r.NotRoCE {
			bad++
			if bad <= 10 {
				t.Errorf("frame %d: %s (ICRC ok %v)", r.Frame, r.Error, r.ICRCOK)
			}
			return nil
		}
		dir := "rxe→goroce"
		if r.Src == ourIP {
			dir = "goroce→rxe"
		}
		kinds[dir][opKind(ib.Opcode(r.Opcode))]++
		k := pktKey{r.Src, r.DestQP, r.PSN, r.Opcode}
		if seen[k] {
			resent[dir]++
		}
		seen[k] = true
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s: %v", file, err)
	}
	if bad > 0 {
		t.Errorf("%d of %d frames failed to decode or verify", bad, frames)
	}
	want := []string{"send", "write", "read-request", "atomic", "ack", "read-response", "atomic-ack"}
	for dir, k := range kinds {
		for _, w := range want {
			if k[w] == 0 {
				t.Errorf("%s: no %s frame (%v)", dir, w, k)
			}
		}
	}
	t.Logf("%s: %d frames, all RoCEv2 with a valid ICRC\n  goroce→rxe: %s(%d repeated)\n  rxe→goroce: %s(%d repeated)",
		filepath.Base(file), frames, kindString(kinds["goroce→rxe"]), resent["goroce→rxe"],
		kindString(kinds["rxe→goroce"]), resent["rxe→goroce"])

	// The command's own verdict: exit status 0 when every frame verifies.
	var out, errOut bytes.Buffer
	if code := pcapdump.Run([]string{file}, &out, &errOut); code != 0 {
		t.Errorf("rocectl pcap %s: exit %d\n%s", filepath.Base(file), code, errOut.String())
	}
}

func opKind(op ib.Opcode) string {
	switch op {
	case ib.RCSendFirst, ib.RCSendMiddle, ib.RCSendLast, ib.RCSendOnly, ib.RCSendLastImm, ib.RCSendOnlyImm:
		return "send"
	case ib.RCWriteFirst, ib.RCWriteMiddle, ib.RCWriteLast, ib.RCWriteOnly, ib.RCWriteLastImm, ib.RCWriteOnlyImm:
		return "write"
	case ib.RCReadRequest:
		return "read-request"
	case ib.RCReadResponseFirst, ib.RCReadResponseMiddle, ib.RCReadResponseLast, ib.RCReadResponseOnly:
		return "read-response"
	case ib.RCCompareSwap, ib.RCFetchAdd:
		return "atomic"
	case ib.RCAtomicAck:
		return "atomic-ack"
	case ib.RCAck:
		return "ack"
	}
	return op.String()
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

// checkTshark runs tshark over file: every frame must dissect as
// InfiniBand (RoCEv2 on UDP 4791) and none may be malformed. The RPC over
// RDMA heuristic is off: it claims SEND payloads that merely look like RPC
// headers.
func checkTshark(t *testing.T, tshark, file string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ts := func(filter string) []string {
		out, err := exec.CommandContext(ctx, tshark, "-n", "-r", file, "--disable-protocol", "rpcordma",
			"-Y", filter, "-T", "fields", "-e", "frame.number").Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("tshark -Y %q: %v\n%s", filter, err, stderr)
		}
		return strings.Fields(string(out))
	}
	if m := ts("_ws.malformed || _ws.expert.severity >= error"); len(m) != 0 {
		t.Errorf("tshark: %d malformed or erroneous frames: %v", len(m), head(m))
	}
	all, ibf := ts("frame"), ts("infiniband")
	if len(all) == 0 || len(ibf) != len(all) {
		t.Errorf("tshark dissected %d of %d frames as InfiniBand", len(ibf), len(all))
	}
	t.Logf("tshark: %d frames, all InfiniBand, none malformed", len(all))
}

func head(s []string) []string {
	if len(s) > 20 {
		return s[:20]
	}
	return s
}

// keepCaptures copies the captures of a failed run where CI can collect
// them ($GOROCE_STRESS_ARTIFACTS), else names them in the log.
func keepCaptures(t *testing.T, files ...string) {
	dir := os.Getenv("GOROCE_STRESS_ARTIFACTS")
	if dir == "" {
		t.Logf("set GOROCE_STRESS_ARTIFACTS to keep the captures of a failed run")
		return
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
		}
		if err != nil {
			t.Logf("keeping %s: %v", f, err)
		}
	}
}
