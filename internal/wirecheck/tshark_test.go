package wirecheck

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcapdump"
)

// coverage is how much of a packet of some opcode Wireshark 4.0 (Debian 12's
// tshark) dissects, established by dissecting the generated pcap.
type coverage int

const (
	// full: the BTH, every extension header, the ICRC and the payload
	// length must all be reported and equal (RC, UC, UD).
	full coverage = iota
	// partial: opcodes Wireshark 4.0 does not know (XRC 0xA0-0xB7, CNP 0x81,
	// RC FLUSH 0x1C and ATOMIC_WRITE 0x1D): it dissects the BTH only, so the
	// BTH must match; anything else it does report is compared too.
	partial
	// bthOnly: RD. Wireshark 4.0 makes the RD BTH item 20 bytes long and
	// reads the RDETH, DETH and every later header 8 bytes past where they
	// are (rxe_opcode.c and IBA put the RDETH right after the 12-byte BTH),
	// so only the BTH, and the ICRC when reported, are compared.
	bthOnly
)

func tsharkCoverage(o ib.Opcode) coverage {
	switch o.Transport() {
	case ib.TransportRD:
		return bthOnly
	case ib.TransportRC:
		if o&0x1f == 0x1c || o&0x1f == 0x1d {
			return partial
		}
		return full
	case ib.TransportUC, ib.TransportUD:
		return full
	}
	return partial
}

func tsharkUint(s string) (uint64, error) {
	switch s {
	case "True":
		return 1, nil
	case "False":
		return 0, nil
	}
	return strconv.ParseUint(s, 0, 64)
}

// single collapses repeated occurrences of one field (Wireshark 4.0 adds
// infiniband.immdt and infiniband.ieth twice: once for the header, once for
// its value) into one value; ok is false if they differ.
func single(s string) (string, bool) {
	first, rest, found := strings.Cut(s, ",")
	for found {
		var next string
		next, rest, found = strings.Cut(rest, ",")
		if next != first {
			return s, false
		}
	}
	return first, true
}

func tsharkBytes(s string) ([]byte, error) {
	return hex.DecodeString(strings.ReplaceAll(s, ":", ""))
}

// compareTshark compares one rocectl record with tshark's dissection of the
// same frame. diffs are disagreements; gaps name headers rocectl decoded that
// tshark did not (allowed only where tsharkCoverage says so).
func compareTshark(r *pcapdump.Record, tf TsharkFrame) (diffs, gaps []string) {
	diff := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }
	num := func(field string, want uint64) {
		s, ok := single(tf[field])
		if !ok {
			diff("%s: tshark reports differing occurrences %q", field, tf[field])
			return
		}
		if s == "" {
			diff("%s: tshark has no value, rocectl %d", field, want)
			return
		}
		got, err := tsharkUint(s)
		if err != nil {
			diff("%s: tshark value %q: %v", field, s, err)
			return
		}
		if got != want {
			diff("%s: tshark %d (%q), rocectl %d", field, got, s, want)
		}
	}
	str := func(field, want string) {
		if got := tf[field]; got != want {
			diff("%s: tshark %q, rocectl %q", field, got, want)
		}
	}
	b2u := func(b bool) uint64 {
		if b {
			return 1
		}
		return 0
	}

	num("frame.number", uint64(r.Frame))
	if r.Error != "" {
		if r.NotRoCE && tf["infiniband.bth.opcode"] != "" {
			diff("rocectl says %q but tshark dissected a BTH (opcode %s)", r.Error, tf["infiniband.bth.opcode"])
		}
		if !r.NotRoCE {
			diff("rocectl could not decode the frame: %s", r.Error)
		}
		return diffs, gaps
	}
	o := ib.Opcode(r.Opcode)
	switch r.IPVersion {
	case 4:
		str("ip.src", r.Src)
		str("ip.dst", r.Dst)
	case 6:
		str("ipv6.src", r.Src)
		str("ipv6.dst", r.Dst)
	default:
		diff("ip_version %d", r.IPVersion)
	}
	if r.VLAN != nil {
		num("vlan.id", uint64(*r.VLAN))
	} else if tf["vlan.id"] != "" {
		diff("tshark sees VLAN %s, rocectl none", tf["vlan.id"])
	}
	num("udp.srcport", uint64(r.UDPSport))
	num("udp.dstport", uint64(r.UDPDport))

	num("infiniband.bth.opcode", uint64(r.Opcode))
	num("infiniband.bth.se", b2u(r.Solicited))
	num("infiniband.bth.m", b2u(r.MigReq))
	num("infiniband.bth.padcnt", uint64(r.Pad))
	num("infiniband.bth.tver", uint64(r.TVer))
	num("infiniband.bth.p_key", uint64(r.PKey))
	num("infiniband.bth.destqp", uint64(r.DestQP))
	num("infiniband.bth.a", b2u(r.AckReq))
	num("infiniband.bth.psn", uint64(r.PSN))
	// Wireshark has no FECN/BECN fields (it shows BTH byte 4 as
	// "Reserved"), so they are checked in the BTH bytes tshark located.
	if raw, err := tsharkBytes(tf["infiniband.bth"]); err != nil || len(raw) < ib.BTHSize {
		diff("infiniband.bth: raw BTH %q unusable (%v)", tf["infiniband.bth"], err)
	} else {
		if fecn := raw[4]&0x80 != 0; fecn != r.FECN {
			diff("FECN: tshark's BTH byte 4 %#02x, rocectl fecn=%v", raw[4], r.FECN)
		}
		if becn := raw[4]&0x40 != 0; becn != r.BECN {
			diff("BECN: tshark's BTH byte 4 %#02x, rocectl becn=%v", raw[4], r.BECN)
		}
	}

	cov := tsharkCoverage(o)
	// header compares one extension header: present says whether tshark
	// dissected it, have whether rocectl did.
	header := func(name string, present, have bool, cmp func()) {
		if cov == bthOnly && name != "icrc" {
			if have {
				gaps = append(gaps, name+" (not compared)")
			}
			return
		}
		switch {
		case have && present:
			cmp()
		case have && !present:
			gaps = append(gaps, name)
			if cov == full {
				diff("%s: rocectl decoded it, tshark did not", name)
			}
		case !have && present:
			diff("%s: tshark dissected it, rocectl did not", name)
		}
	}
	has := func(field string) bool { return tf[field] != "" }

	header("rdeth", has("infiniband.rdeth.eecnxt"), r.RDETH != nil, func() {
		num("infiniband.rdeth.eecnxt", uint64(r.RDETH.EEC))
	})
	header("deth", has("infiniband.deth.q_key"), r.DETH != nil, func() {
		num("infiniband.deth.q_key", uint64(r.DETH.QKey))
		num("infiniband.deth.srcqp", uint64(r.DETH.SrcQP))
	})
	// The AtomicETH VA and R_Key are reported under the RETH field names, so
	// RETH presence is keyed on its DMA length.
	header("reth", has("infiniband.reth.dmalen"), r.RETH != nil, func() {
		num("infiniband.reth.va", r.RETH.VA)
		num("infiniband.reth.r_key", uint64(r.RETH.RKey))
		num("infiniband.reth.dmalen", uint64(r.RETH.DMALen))
	})
	header("atomic", has("infiniband.atomiceth.swapdt"), r.Atomic != nil, func() {
		num("infiniband.reth.va", r.Atomic.VA)
		num("infiniband.reth.r_key", uint64(r.Atomic.RKey))
		num("infiniband.atomiceth.swapdt", r.Atomic.SwapAdd)
		num("infiniband.atomiceth.cmpdt", r.Atomic.Compare)
	})
	header("aeth", has("infiniband.aeth.syndrome"), r.AETH != nil, func() {
		num("infiniband.aeth.syndrome", uint64(r.AETH.Syndrome))
		num("infiniband.aeth.msn", uint64(r.AETH.MSN))
	})
	header("atomic_ack", has("infiniband.atomicacketh.origremdt"), r.AtomicAck != nil, func() {
		num("infiniband.atomicacketh.origremdt", r.AtomicAck.Orig)
	})
	bytes32 := func(field string, want uint32) {
		s, _ := single(tf[field])
		b, err := tsharkBytes(s)
		if err != nil || len(b) != 4 {
			diff("%s: tshark %q is not 4 bytes", field, tf[field])
			return
		}
		if got := binary.BigEndian.Uint32(b); got != want {
			diff("%s: tshark %#08x, rocectl %#08x", field, got, want)
		}
	}
	header("imm", has("infiniband.immdt"), r.Imm != nil, func() { bytes32("infiniband.immdt", *r.Imm) })
	header("ieth", has("infiniband.ieth"), r.IETH != nil, func() { bytes32("infiniband.ieth", *r.IETH) })
	// tshark prints the ICRC bytes as a big-endian number; rocectl reports the
	// CRC value, which is stored little-endian.
	header("icrc", has("infiniband.invariant.crc"), true, func() {
		num("infiniband.invariant.crc", uint64(bits.ReverseBytes32(r.ICRC)))
	})
	// tshark hands the payload to the "data" dissector, pad included, except
	// where a payload dissector claims it (MADs on QP1), so data.len is
	// compared only when present.
	if s := tf["data.len"]; s != "" && cov != bthOnly {
		num("data.len", uint64(r.PayloadLen)+uint64(r.Pad))
	}
	return diffs, gaps
}

// crossCheckTshark compares rocectl and tshark on every frame of file and
// returns the documented gaps it met, by header name.
func crossCheckTshark(t *testing.T, file string) map[string]int {
	t.Helper()
	tfs, err := Tshark(toolCtx(t), file)
	if err != nil {
		t.Fatal(err)
	}
	recs := rocectlJSON(t, file)
	if len(tfs) != len(recs) {
		t.Fatalf("%s: tshark reports %d frames, rocectl %d", relName(t, file), len(tfs), len(recs))
	}
	gapCount := map[string]int{}
	for i := range recs {
		diffs, gaps := compareTshark(&recs[i], tfs[i])
		for _, g := range gaps {
			gapCount[fmt.Sprintf("%s in %s", g, ib.Opcode(recs[i].Opcode))]++
		}
		for _, d := range diffs {
			t.Errorf("%s frame %d (%s): %s", relName(t, file), recs[i].Frame, ib.Opcode(recs[i].Opcode), d)
		}
	}
	for i := range recs {
		p := tfs[i].Problem()
		if p == "" || tfs[i]["infiniband.bth.opcode"] == "" {
			continue // only problems with RoCE frames count
		}
		if recs[i].Error == "" && tsharkCoverage(ib.Opcode(recs[i].Opcode)) == bthOnly {
			// Wireshark's misplaced RD headers run past the end of short
			// packets (no payload); see bthOnly.
			gapCount["malformed in "+ib.Opcode(recs[i].Opcode).String()]++
			continue
		}
		t.Errorf("%s: tshark flags frame %d: %s", relName(t, file), recs[i].Frame, p)
	}
	return gapCount
}

// logGaps logs, per header, the opcodes whose header tshark did not
// dissect (all allowed by tsharkCoverage).
func logGaps(t *testing.T, gaps map[string]int) {
	byHeader := map[string][]string{}
	for k, n := range gaps {
		h, op, _ := strings.Cut(k, " in ")
		byHeader[h] = append(byHeader[h], fmt.Sprintf("%s (%d)", op, n))
	}
	keys := make([]string, 0, len(byHeader))
	for k := range byHeader {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sort.Strings(byHeader[k])
		t.Logf("tshark gap, %s: %s", k, strings.Join(byHeader[k], ", "))
	}
}

func needTshark(t *testing.T) {
	t.Helper()
	if _, err := TsharkPath(); err != nil {
		if errors.Is(err, ErrToolMissing) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
}

func TestTsharkGenerated(t *testing.T) {
	needTshark(t)
	path, cases := generatedPCAP(t)
	gaps := crossCheckTshark(t, path)
	logGaps(t, gaps)
	t.Logf("%d generated frames compared", len(cases))
}

func TestTsharkCaptures(t *testing.T) {
	needTshark(t)
	files := captures(t)
	frames := 0
	for _, f := range files {
		gaps := crossCheckTshark(t, f)
		logGaps(t, gaps)
		frames += len(rocectlJSON(t, f))
	}
	t.Logf("%d frames in %d captures compared", frames, len(files))
}

// TestCompareTsharkDetects makes sure the comparison is not vacuous: a record
// that disagrees with tshark in any one field is reported.
func TestCompareTsharkDetects(t *testing.T) {
	needTshark(t)
	path, _ := generatedPCAP(t)
	tfs, err := Tshark(toolCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	recs := rocectlJSON(t, path)
	type mutation struct {
		bth bool // a BTH or IP field, compared for every opcode
		f   func(r *pcapdump.Record) bool
	}
	mutations := map[string]mutation{
		"psn":     {true, func(r *pcapdump.Record) bool { r.PSN ^= 1; return true }},
		"dest_qp": {true, func(r *pcapdump.Record) bool { r.DestQP ^= 0x800000; return true }},
		"pkey":    {true, func(r *pcapdump.Record) bool { r.PKey ^= 0x8000; return true }},
		"pad":     {true, func(r *pcapdump.Record) bool { r.Pad ^= 1; return true }},
		"ack_req": {true, func(r *pcapdump.Record) bool { r.AckReq = !r.AckReq; return true }},
		"fecn":    {true, func(r *pcapdump.Record) bool { r.FECN = !r.FECN; return true }},
		"becn":    {true, func(r *pcapdump.Record) bool { r.BECN = !r.BECN; return true }},
		"src":     {true, func(r *pcapdump.Record) bool { r.Src = "192.0.2.1"; return true }},
		"icrc":    {false, func(r *pcapdump.Record) bool { r.ICRC++; return true }},
		"payload": {false, func(r *pcapdump.Record) bool { r.PayloadLen++; return r.PayloadLen > 1 }},
		"reth":    {false, func(r *pcapdump.Record) bool { return r.RETH != nil && mut(&r.RETH.DMALen) }},
		"aeth":    {false, func(r *pcapdump.Record) bool { return r.AETH != nil && mut(&r.AETH.MSN) }},
		"deth":    {false, func(r *pcapdump.Record) bool { return r.DETH != nil && mut(&r.DETH.QKey) }},
		"imm":     {false, func(r *pcapdump.Record) bool { return r.Imm != nil && mut(r.Imm) }},
		"ieth":    {false, func(r *pcapdump.Record) bool { return r.IETH != nil && mut(r.IETH) }},
		"atomic": {false, func(r *pcapdump.Record) bool {
			if r.Atomic == nil {
				return false
			}
			r.Atomic.Compare++
			return true
		}},
		"atomic_ack": {false, func(r *pcapdump.Record) bool {
			if r.AtomicAck == nil {
				return false
			}
			r.AtomicAck.Orig++
			return true
		}},
		"drop_reth": {false, func(r *pcapdump.Record) bool {
			if r.RETH == nil {
				return false
			}
			r.RETH = nil
			return true
		}},
	}
	for name, m := range mutations {
		hit := 0
		for i := range recs {
			if base, _ := compareTshark(&recs[i], tfs[i]); len(base) != 0 {
				continue // a frame tshark cannot check (reported by TestTsharkGenerated)
			}
			if !m.bth && tsharkCoverage(ib.Opcode(recs[i].Opcode)) != full {
				continue
			}
			r := deepCopy(recs[i])
			if !m.f(&r) {
				continue
			}
			if diffs, _ := compareTshark(&r, tfs[i]); len(diffs) == 0 {
				t.Errorf("mutation %s of frame %d (%v) not detected", name, r.Frame, ib.Opcode(r.Opcode))
			}
			hit++
		}
		if hit == 0 {
			t.Errorf("mutation %s applied to no frame", name)
		}
	}
}

// deepCopy copies r including the headers it points to.
func deepCopy(r pcapdump.Record) pcapdump.Record {
	b, err := json.Marshal(&r)
	if err != nil {
		panic(err)
	}
	var c pcapdump.Record
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return c
}

func mut(p *uint32) bool { *p ^= 0x10; return true }

// TestTsharkFlagsChecksums checks that the problem detection works and that
// tshark really verifies the IPv4 and UDP checksums ib.Build writes: a frame
// with either checksum broken (both are masked out of the ICRC, so the frame
// is otherwise valid) must be flagged, and the intact frames must not.
func TestTsharkFlagsChecksums(t *testing.T) {
	needTshark(t)
	cases, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	var good, badIP, badUDP []byte
	for _, c := range cases {
		if c.Spec.UDPChecksum && c.Spec.Src.Unmap().Is4() && !c.Spec.VLAN {
			good = c.Frame
			break
		}
	}
	if good == nil {
		t.Fatal("no IPv4 frame with a UDP checksum generated")
	}
	badIP = bytes.Clone(good)
	badIP[14+10] ^= 0xff // IPv4 header checksum
	badUDP = bytes.Clone(good)
	badUDP[14+20+6] ^= 0xff // UDP checksum
	for _, f := range [][]byte{badIP, badUDP} {
		if err := ib.VerifyFrameICRC(f); err != nil {
			t.Fatalf("checksum change broke the ICRC: %v", err)
		}
	}
	path := filepath.Join(t.TempDir(), "checksums.pcap")
	var buf bytes.Buffer
	if err := WritePCAP(&buf, [][]byte{good, badIP, badUDP}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tfs, err := Tshark(toolCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	if len(tfs) != 3 {
		t.Fatalf("tshark read %d frames, want 3", len(tfs))
	}
	if p := tfs[0].Problem(); p != "" {
		t.Errorf("intact frame flagged: %s", p)
	}
	for i, what := range []string{"", "IPv4 checksum", "UDP checksum"} {
		if i > 0 && tfs[i].Problem() == "" {
			t.Errorf("bad %s not flagged by tshark", what)
		}
	}
}
