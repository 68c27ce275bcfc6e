package pcapdump

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/goroce/goroce/ib"
)

func baseSpec(op ib.Opcode, v6 bool) ib.FrameSpec {
	s := ib.FrameSpec{
		SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddr("10.77.0.2"), Dst: netip.MustParseAddr("10.77.0.3"),
		HopLimit: 64, IPID: 7, DontFragment: true, SrcPort: 0xc123, DstPort: ib.RoCEv2Port,
		BTH: ib.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x11, AckReq: true, PSN: 0xabcdef},
	}
	if v6 {
		s.Src, s.Dst = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	}
	return s
}

func build(t testing.TB, s ib.FrameSpec) []byte {
	t.Helper()
	buf := make([]byte, s.Len())
	n, err := ib.Build(buf, &s)
	if err != nil {
		t.Fatalf("ib.Build(%v): %v", s.BTH.Opcode, err)
	}
	return buf[:n]
}

// sampleFrames returns one frame of each header combination, named by the
// JSON keys it must carry beyond the common ones.
func sampleFrames(t testing.TB) (frames [][]byte, extra [][]string) {
	add := func(s ib.FrameSpec, keys ...string) {
		frames = append(frames, build(t, s))
		extra = append(extra, keys)
	}
	s := baseSpec(ib.RCSendOnly, false)
	s.Payload = []byte("hello, RoCE") // 11 bytes: pad 1
	add(s)

	s = baseSpec(ib.RCWriteOnlyImm, true)
	s.RETH = &ib.RETHFields{VA: 0x7f0000001000, RKey: 0x1234, DMALen: 4}
	s.ImmDt = &ib.ImmDtFields{Imm: 0xdeadbeef}
	s.Payload = []byte{1, 2, 3, 4}
	add(s, "reth", "imm")

	s = baseSpec(ib.RCAck, false)
	s.AETH = &ib.AETHFields{Syndrome: ib.NAKSyndrome(ib.NAKPSNSequenceError), MSN: 9}
	add(s, "aeth")

	s = baseSpec(ib.UDSendOnlyImm, false)
	s.DETH = &ib.DETHFields{QKey: 0x11111111, SrcQP: 0x22}
	s.ImmDt = &ib.ImmDtFields{Imm: 5}
	s.Payload = make([]byte, 40)
	add(s, "deth", "imm")

	s = baseSpec(ib.RCCompareSwap, false)
	s.AtomicETH = &ib.AtomicETHFields{VA: 0x1000, RKey: 0x77, SwapAdd: 1, Compare: 2}
	add(s, "atomic")

	s = baseSpec(ib.RCAtomicAck, true)
	s.AETH = &ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: 3}
	s.AtomicAckETH = &ib.AtomicAckETHFields{Orig: 0xfeedface}
	add(s, "aeth", "atomic_ack")

	s = baseSpec(ib.RCSendOnlyInv, false)
	s.IETH = &ib.IETHFields{RKey: 0xabc}
	s.Payload = []byte{9}
	add(s, "ieth")
	return frames, extra
}

func writePCAP(t testing.TB, frames [][]byte) string {
	t.Helper()
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(f), Length: len(f)}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "in.pcap")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func writePCAPNG(t testing.TB, frames [][]byte) string {
	t.Helper()
	var buf bytes.Buffer
	w, err := pcapgo.NewNgWriter(&buf, layers.LinkTypeEthernet)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(f), Length: len(f)}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "in.pcapng")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func runPcap(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Run(args, &o, &e)
	return code, o.String(), e.String()
}

func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		objs = append(objs, m)
	}
	return objs
}

var commonKeys = []string{"frame", "ip_version", "src", "dst", "udp_sport", "opcode", "opcode_name",
	"solicited", "mig_req", "pad", "pkey", "dest_qp", "ack_req", "psn", "icrc_ok", "payload_len"}

var optionalKeys = []string{"reth", "aeth", "deth", "imm", "ieth", "atomic", "atomic_ack", "rdeth", "xrceth", "feth", "dceth", "dcceth"}

func TestJSONKeys(t *testing.T) {
	frames, extra := sampleFrames(t)
	code, out, errOut := runPcap(t, "--json", writePCAP(t, frames))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	objs := jsonLines(t, out)
	if len(objs) != len(frames) {
		t.Fatalf("%d lines for %d frames", len(objs), len(frames))
	}
	for i, m := range objs {
		for _, k := range commonKeys {
			if _, ok := m[k]; !ok {
				t.Errorf("frame %d: key %q missing in %v", i+1, k, m)
			}
		}
		for _, k := range optionalKeys {
			_, ok := m[k]
			if want := slices.Contains(extra[i], k); ok != want {
				t.Errorf("frame %d (%v): key %q present=%v, want %v", i+1, m["opcode_name"], k, ok, want)
			}
		}
		if m["frame"] != float64(i+1) || m["icrc_ok"] != true || m["error"] != nil {
			t.Errorf("frame %d: %v", i+1, m)
		}
	}
	// Spot-check values and the nested objects' keys.
	if m := objs[0]; m["opcode_name"] != "RC SEND_ONLY" || m["pad"] != float64(1) || m["payload_len"] != float64(11) ||
		m["psn"] != float64(0xabcdef) || m["src"] != "10.77.0.2" || m["ip_version"] != float64(4) || m["ack_req"] != true {
		t.Errorf("RC SEND_ONLY: %v", m)
	}
	if m := objs[1]; m["ip_version"] != float64(6) || m["dst"] != "2001:db8::2" || m["imm"] != float64(0xdeadbeef) {
		t.Errorf("RC WRITE_ONLY_IMM: %v", m)
	}
	wantNested := map[int]map[string][]string{
		1: {"reth": {"va", "rkey", "dma_len"}},
		2: {"aeth": {"syndrome", "msn"}},
		3: {"deth": {"qkey", "src_qp"}},
		4: {"atomic": {"va", "rkey", "swap_add", "compare"}},
		5: {"atomic_ack": {"orig"}},
	}
	for i, objKeys := range wantNested {
		for obj, keys := range objKeys {
			sub, _ := objs[i][obj].(map[string]any)
			for _, k := range keys {
				if _, ok := sub[k]; !ok {
					t.Errorf("frame %d: %s.%s missing: %v", i+1, obj, k, objs[i][obj])
				}
			}
		}
	}
	if syn := objs[2]["aeth"].(map[string]any)["syndrome"]; syn != float64(0x60) {
		t.Errorf("aeth.syndrome = %v, want the whole byte 0x60", syn)
	}
}

func TestErrorFrames(t *testing.T) {
	good, _ := sampleFrames(t)
	arp := make([]byte, 42)
	copy(arp, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06})
	truncated := good[1][:14+40+8+6] // IPv6 RoCE frame cut inside the BTH
	frames := [][]byte{good[0], arp, truncated}
	code, out, errOut := runPcap(t, "--json", writePCAP(t, frames))
	objs := jsonLines(t, out)
	if len(objs) != 3 {
		t.Fatalf("%d lines: %s", len(objs), out)
	}
	if objs[0]["error"] != nil {
		t.Errorf("good frame: %v", objs[0])
	}
	for _, i := range []int{1, 2} {
		m := objs[i]
		if m["frame"] != float64(i+1) || m["error"] == nil || m["error"] == "" {
			t.Errorf("frame %d: want frame and error keys: %v", i+1, m)
		}
		if _, ok := m["opcode"]; ok {
			t.Errorf("frame %d: error record carries packet fields: %v", i+1, m)
		}
	}
	if objs[1]["not_roce"] != true || !strings.Contains(objs[1]["error"].(string), "not RoCEv2") {
		t.Errorf("ARP frame: %v", objs[1])
	}
	if objs[2]["not_roce"] != nil {
		t.Errorf("truncated RoCE frame reported as not RoCE: %v", objs[2])
	}
	// The truncated RoCEv2 frame fails the run; the ARP frame alone would not.
	if code != 1 || !strings.Contains(errOut, "1 undecodable") {
		t.Errorf("exit %d, stderr %q; want 1 and a count of 1 undecodable", code, errOut)
	}
	if code, _, errOut := runPcap(t, "--json", writePCAP(t, frames[:2])); code != 0 {
		t.Errorf("good + ARP: exit %d (%s), want 0", code, errOut)
	}
}

func TestBadICRC(t *testing.T) {
	frames, _ := sampleFrames(t)
	bad := bytes.Clone(frames[0])
	bad[len(bad)-5] ^= 0xff // last pad/payload byte, covered by the ICRC
	frames = append(frames, bad)
	path := writePCAP(t, frames)
	code, out, errOut := runPcap(t, "--json", path)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(errOut, "1 bad ICRC") {
		t.Errorf("stderr %q lacks the bad-ICRC count", errOut)
	}
	objs := jsonLines(t, out)
	if last := objs[len(objs)-1]; last["icrc_ok"] != false || last["error"] != nil {
		t.Errorf("corrupted frame: %v", last)
	}
	code, out, _ = runPcap(t, path)
	if code != 1 || !strings.Contains(out, "icrc BAD") || strings.Count(out, "icrc ok") != len(frames)-1 {
		t.Errorf("human output (exit %d):\n%s", code, out)
	}
}

func TestPCAPNG(t *testing.T) {
	frames, _ := sampleFrames(t)
	code, fromNG, errOut := runPcap(t, "--json", writePCAPNG(t, frames))
	if code != 0 {
		t.Fatalf("pcapng: exit %d: %s", code, errOut)
	}
	_, fromPcap, _ := runPcap(t, "--json", writePCAP(t, frames))
	if fromNG != fromPcap {
		t.Errorf("pcapng and pcap output differ:\n%s\n---\n%s", fromNG, fromPcap)
	}
}

func TestHumanOutput(t *testing.T) {
	frames, _ := sampleFrames(t)
	code, out, errOut := runPcap(t, writePCAP(t, frames))
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(frames)+1 {
		t.Fatalf("%d lines for %d frames:\n%s", len(lines), len(frames), out)
	}
	for _, want := range []string{
		"1 10.77.0.2 > 10.77.0.3 RC SEND_ONLY qp=0x000011 psn=11259375 A len=11+1pad icrc ok",
		"2001:db8::1 > 2001:db8::2 RC RDMA_WRITE_ONLY_WITH_IMMEDIATE",
		"va=0x7f0000001000 rkey=0x1234 dmalen=4", "imm=0xdeadbeef",
		"NAK(0) msn=9", "qkey=0x11111111 srcqp=0x22", "orig=0xfeedface", "inv_rkey=0xabc",
		"7 frames: 7 RoCEv2, 0 bad ICRC, 0 undecodable, 0 not RoCEv2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestUsage(t *testing.T) {
	if code, _, _ := runPcap(t); code != 2 {
		t.Errorf("no files: exit %d, want 2", code)
	}
	if code, _, _ := runPcap(t, "--bogus", "x"); code != 2 {
		t.Errorf("bad flag: exit %d, want 2", code)
	}
	if code, _, errOut := runPcap(t, filepath.Join(t.TempDir(), "missing.pcap")); code != 1 || errOut == "" {
		t.Errorf("missing file: exit %d, stderr %q", code, errOut)
	}
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte("not a capture at all"), 0o644)
	if code, _, errOut := runPcap(t, junk); code != 1 || !strings.Contains(errOut, "not a pcap") {
		t.Errorf("junk file: exit %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runPcap(t, "-h"); code != 0 || !strings.Contains(errOut, "usage: rocectl pcap") {
		t.Errorf("-h: exit %d, stderr %q", code, errOut)
	}
}

func TestMultipleFiles(t *testing.T) {
	frames, _ := sampleFrames(t)
	a, b := writePCAP(t, frames[:2]), writePCAPNG(t, frames[2:3])
	code, out, errOut := runPcap(t, "--json", a, b)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	objs := jsonLines(t, out)
	if len(objs) != 3 || objs[0]["file"] != a || objs[2]["file"] != b || objs[2]["frame"] != float64(1) {
		t.Errorf("multi-file output: %s", out)
	}
}

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		if parent := filepath.Dir(dir); parent != dir {
			dir = parent
			continue
		}
		t.Fatal("go.mod not found")
	}
}

// TestRealCaptures decodes the Soft-RoCE captures: every RoCEv2 frame must
// decode with a good ICRC.
func TestRealCaptures(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "..", "shared", "rxe-lab", "captures")
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*.pcap"))
	if len(files) == 0 {
		t.Skipf("no captures under %s (CI places shared/ next to the repository)", dir)
	}
	roce := 0
	for _, f := range files {
		code, out, errOut := runPcap(t, "--json", f)
		if code != 0 {
			t.Errorf("%s: exit %d: %s", filepath.Base(f), code, errOut)
		}
		for _, m := range jsonLines(t, out) {
			if m["error"] == nil {
				roce++
			}
		}
	}
	if roce == 0 {
		t.Error("no RoCEv2 frame decoded")
	}
	t.Logf("%d captures, %d RoCEv2 frames, all ICRCs good", len(files), roce)
}

func TestDecodeAllocs(t *testing.T) {
	// Decoding is not on the data path, but it reuses one ib.Packet, so a
	// frame costs only the two address strings and one allocation per
	// optional header object in the record.
	frames, extra := sampleFrames(t)
	var d Decoder
	var r Record
	for i, fr := range frames {
		f := Frame{Number: 1, LinkType: layers.LinkTypeEthernet, Data: fr}
		n := testing.AllocsPerRun(100, func() { d.Decode(f, &r) })
		if want := float64(2 + len(extra[i])); n > want {
			t.Errorf("Decode of %s: %v allocs, want <= %v", r.OpcodeName, n, want)
		}
	}
}

// TestCutFile checks that a file cut inside a record is an error, not a
// silent end, and that a frame cut by the capture's snap length says so.
func TestCutFile(t *testing.T) {
	frames, _ := sampleFrames(t)
	b, err := os.ReadFile(writePCAP(t, frames[:1]))
	if err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{24 + 8, 24 + 16, len(b) - 3} {
		err := ReadFrames(bytes.NewReader(b[:cut]), func(Frame) error { return nil })
		if err == nil {
			t.Errorf("file cut at %d of %d bytes: no error", cut, len(b))
		}
	}

	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(64, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	f := frames[0]
	ci := gopacket.CaptureInfo{Timestamp: time.Unix(1, 0), CaptureLength: 64, Length: len(f)}
	if err := w.WritePacket(ci, f[:64]); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "snap.pcap")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runPcap(t, "--json", path)
	if want := fmt.Sprintf("kept 64 of %d bytes", len(f)); code != 1 || !strings.Contains(out, want) {
		t.Errorf("snap-cut frame: exit %d, output %s; want %q", code, out, want)
	}
}

func TestStdin(t *testing.T) {
	frames, _ := sampleFrames(t)
	f, err := os.Open(writePCAPNG(t, frames))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()
	code, out, errOut := runPcap(t, "--json", "-")
	if code != 0 || len(jsonLines(t, out)) != len(frames) {
		t.Errorf("stdin: exit %d (%s), output:\n%s", code, errOut, out)
	}
}
