package wirecheck

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/goroce/goroce/internal/pcapdump"
)

// ErrToolMissing is returned (wrapped) when tshark or a python3 with scapy
// cannot be found.
var ErrToolMissing = errors.New("wirecheck: tool not installed")

// TsharkFields are the fields Tshark extracts, in column order (see also
// TsharkFrame.Problem). Field names
// are Wireshark 4.0's (tshark -G fields). Wireshark has no FECN/BECN or
// XRCETH/FETH fields; the raw BTH bytes (infiniband.bth) let the tests check
// FECN/BECN where tshark located the BTH. The AtomicETH VA and R_Key come out
// as infiniband.reth.va and infiniband.reth.r_key.
var TsharkFields = []string{
	"frame.number",
	"ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "vlan.id",
	"udp.srcport", "udp.dstport",
	"infiniband.bth",
	"infiniband.bth.opcode", "infiniband.bth.se", "infiniband.bth.m", "infiniband.bth.padcnt",
	"infiniband.bth.tver", "infiniband.bth.p_key", "infiniband.bth.destqp", "infiniband.bth.a",
	"infiniband.bth.psn",
	"infiniband.rdeth.eecnxt",
	"infiniband.deth.q_key", "infiniband.deth.srcqp",
	"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
	"infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
	"infiniband.aeth.syndrome", "infiniband.aeth.msn",
	"infiniband.atomicacketh.origremdt",
	"infiniband.immdt", "infiniband.ieth",
	"infiniband.invariant.crc",
	"data.len",
	"_ws.malformed", "_ws.expert.severity", "_ws.expert.message",
}

// tsharkArgs are common to every tshark run: no name resolution; IPv4 and UDP
// checksums verified (an error-level expert info when wrong, which
// TsharkProblems reports); and no RPC-over-RDMA dissector, which otherwise
// claims some zero-length SEND payloads and flags them malformed.
var tsharkArgs = []string{"-n", "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
	"--disable-protocol", "rpcordma"}

// tsharkPayloadHeuristics are Wireshark 4.0's heuristic dissectors on the
// InfiniBand payload (tshark -G heuristic-decodes, table infiniband.payload).
// They are disabled so that a payload is always plain data whose length can be
// compared: random payloads otherwise look like EoIB, SDP, SMC-R, ... now and
// then. Names this tshark does not know are dropped (see Tshark).
var tsharkPayloadHeuristics = []string{
	"smcr_infiniband", "smb_direct_infiniband", "rpcrdma_infiniband", "nvme_rdma", "lnet_ib",
	"iser_infiniband", "eth_over_ib", "mellanox_eoib", "sdp_infiniband", "fc_infiniband",
}

// TsharkPath returns the tshark executable or an error wrapping
// ErrToolMissing.
func TsharkPath() (string, error) {
	p, err := exec.LookPath("tshark")
	if err != nil {
		return "", fmt.Errorf("%w: tshark (apt install tshark): %v", ErrToolMissing, err)
	}
	return p, nil
}

// TsharkFrame is one frame as tshark dissected it: field name → value, ""
// when absent; several occurrences are joined with ",".
type TsharkFrame map[string]string

// Tshark dissects file and returns TsharkFields for every frame.
func Tshark(ctx context.Context, file string) ([]TsharkFrame, error) {
	tshark, err := TsharkPath()
	if err != nil {
		return nil, err
	}
	args := append([]string{"-r", file}, tsharkArgs...)
	args = append(args, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,")
	for _, f := range TsharkFields {
		args = append(args, "-e", f)
	}
	heur := tsharkPayloadHeuristics
	var out []byte
	for {
		a := args
		for _, h := range heur {
			a = append(a, "--disable-heuristic", h)
		}
		out, err = runTool(ctx, tshark, a...)
		if err == nil {
			break
		}
		// Another Wireshark version may lack or rename a heuristic: tshark
		// then fails with "No such protocol NAME, can't disable".
		var keep []string
		for _, h := range heur {
			if !strings.Contains(err.Error(), "No such protocol "+h+",") {
				keep = append(keep, h)
			}
		}
		if len(keep) == len(heur) {
			return nil, err
		}
		heur = keep
	}
	var frames []TsharkFrame
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "\t")
		if len(cols) != len(TsharkFields) {
			return nil, fmt.Errorf("tshark: %d columns, want %d: %q", len(cols), len(TsharkFields), sc.Text())
		}
		f := make(TsharkFrame, len(cols))
		for i, c := range cols {
			f[TsharkFields[i]] = c
		}
		frames = append(frames, f)
	}
	return frames, sc.Err()
}

// expertError is Wireshark's PI_ERROR severity (_ws.expert.severity).
const expertError = 0x00800000

// Problem returns what tshark found wrong with the frame: it is malformed or
// carries an error-level expert info (which includes bad IPv4/UDP checksums,
// verified per tsharkArgs); "" if nothing.
func (f TsharkFrame) Problem() string {
	bad := f["_ws.malformed"] != ""
	for _, sev := range strings.Split(f["_ws.expert.severity"], ",") {
		if v, err := strconv.ParseUint(sev, 0, 32); err == nil && v >= expertError {
			bad = true
		}
	}
	if !bad {
		return ""
	}
	if m := f["_ws.expert.message"]; m != "" {
		return m
	}
	return "malformed"
}

var (
	pythonOnce sync.Once
	python     string
	pythonErr  error
)

// PythonWithScapy returns a python3 interpreter that can import
// scapy.contrib.roce: python3 from PATH, else /usr/bin/python3 (where Debian's
// python3-scapy lives when a version manager such as pyenv puts its own
// python3 first on PATH). The answer is cached for the process.
func PythonWithScapy(ctx context.Context) (string, error) {
	pythonOnce.Do(func() { python, pythonErr = findPythonWithScapy(ctx) })
	return python, pythonErr
}

func findPythonWithScapy(ctx context.Context) (string, error) {
	var cands []string
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/python3")
	var tried []string
	for _, p := range cands {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if _, err := runTool(ctx, p, "-c", "import scapy.contrib.roce"); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("%w: no python3 that imports scapy.contrib.roce (apt install python3-scapy); tried %v",
		ErrToolMissing, tried)
}

// ScapyFrame is one line of testdata/roce_icrc.py: the ICRC bytes in wire
// order as computed by scapy (IPv4 only, else nil), by the script's own
// masked pseudo-header CRC, and as carried by the frame.
type ScapyFrame struct {
	Frame  int
	Family int // 4, 6, or 0 when not RoCEv2
	Scapy  []byte
	Masked []byte
	Wire   []byte
}

// ScapyICRC runs script (testdata/roce_icrc.py) with python on files, in one
// process since importing scapy takes seconds, and returns each file's frames.
func ScapyICRC(ctx context.Context, python, script string, files ...string) (map[string][]ScapyFrame, error) {
	out, err := runTool(ctx, python, append([]string{script}, files...)...)
	if err != nil {
		return nil, err
	}
	res := make(map[string][]ScapyFrame, len(files))
	cur := ""
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, ok := strings.CutPrefix(l, "== "); ok {
			cur = name
			res[cur] = []ScapyFrame{}
			continue
		}
		bad := fmt.Errorf("roce_icrc.py: bad line %q", l)
		cols := strings.Split(l, "\t")
		if len(cols) != 5 || cur == "" {
			return nil, bad
		}
		var f ScapyFrame
		if f.Frame, err = strconv.Atoi(cols[0]); err != nil {
			return nil, bad
		}
		if cols[1] != "-" {
			if f.Family, err = strconv.Atoi(cols[1]); err != nil {
				return nil, bad
			}
		}
		for i, dst := range []*[]byte{&f.Scapy, &f.Masked, &f.Wire} {
			if c := cols[2+i]; c != "-" {
				if *dst, err = hex.DecodeString(c); err != nil {
					return nil, bad
				}
			}
		}
		res[cur] = append(res[cur], f)
	}
	for _, f := range files {
		if _, ok := res[f]; !ok {
			return nil, fmt.Errorf("roce_icrc.py: no output for %s", f)
		}
	}
	return res, nil
}

// Layout runs script (testdata/roce_layout.py) with python on files and
// returns, per file, its decoding of every RoCEv2 frame, in the schema of
// "rocectl pcap --json" (only the fields that script decodes are set).
func Layout(ctx context.Context, python, script string, files ...string) (map[string][]pcapdump.Record, error) {
	out, err := runTool(ctx, python, append([]string{script}, files...)...)
	if err != nil {
		return nil, err
	}
	res := make(map[string][]pcapdump.Record, len(files))
	cur := ""
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, ok := strings.CutPrefix(l, "== "); ok {
			cur = name
			res[cur] = []pcapdump.Record{}
			continue
		}
		var r pcapdump.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil || cur == "" {
			return nil, fmt.Errorf("roce_layout.py: bad line %q: %v", l, err)
		}
		res[cur] = append(res[cur], r)
	}
	for _, f := range files {
		if _, ok := res[f]; !ok {
			return nil, fmt.Errorf("roce_layout.py: no output for %s", f)
		}
	}
	return res, nil
}

// LayoutOpcodes returns the opcodes roce_layout.py's table defines.
func LayoutOpcodes(ctx context.Context, python, script string) ([]int, error) {
	out, err := runTool(ctx, python, script, "--opcodes")
	if err != nil {
		return nil, err
	}
	var ops []int
	for _, l := range strings.Fields(string(out)) {
		n, err := strconv.Atoi(l)
		if err != nil {
			return nil, fmt.Errorf("roce_layout.py --opcodes: %q", l)
		}
		ops = append(ops, n)
	}
	return ops, nil
}

func runTool(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, filterStderr(stderr.String()))
	}
	return out, nil
}

// filterStderr drops tshark's warning about running as root, which is noise.
func filterStderr(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if l != "" && !strings.Contains(l, "could be dangerous") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
