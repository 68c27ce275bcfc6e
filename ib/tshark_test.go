package ib

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// writePcap writes frames as a classic little-endian Ethernet pcap.
func writePcap(path string, frames [][]byte) error {
	var b bytes.Buffer
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(hdr[4:], 2)
	binary.LittleEndian.PutUint16(hdr[6:], 4)
	binary.LittleEndian.PutUint32(hdr[16:], 65535)
	binary.LittleEndian.PutUint32(hdr[20:], 1)
	b.Write(hdr)
	for i, f := range frames {
		rec := make([]byte, 16)
		binary.LittleEndian.PutUint32(rec[0:], uint32(i))
		binary.LittleEndian.PutUint32(rec[8:], uint32(len(f)))
		binary.LittleEndian.PutUint32(rec[12:], uint32(len(f)))
		b.Write(rec)
		b.Write(f)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// TestWiresharkDissectsBuiltFrames builds every RC, UC and UD opcode over
// IPv4/IPv6 with and without VLAN and checks tshark decodes the same field
// values: an independent check of the opcode table's header order and of
// every encoder. Left out: FLUSH, ATOMIC_WRITE, XRC and CNP, which Wireshark
// 4.0 does not dissect, and RD, whose dissection in Wireshark 4.0 reads the
// RDETH 8 bytes late (rxe_opcode.c places RDETH right after the BTH, then
// DETH, as this package does).
func TestWiresharkDissectsBuiltFrames(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (Debian: apt-get install tshark)")
	}
	var frames [][]byte
	var specs []*FrameSpec
	for o := range 256 {
		op := Opcode(o)
		tr := op.Transport()
		if !op.Valid() || tr == TransportXRC || tr == TransportCNP || tr == TransportRD || op&0x1f >= opFlush {
			continue
		}
		for i, v6 := range []bool{false, true} {
			s := fullSpec(op, v6, i == 1, 13)
			s.UDPChecksum = o%2 == 0 // let Wireshark verify our UDP checksums too
			frames = append(frames, frameFor(t, s))
			specs = append(specs, s)
		}
	}
	path := filepath.Join(t.TempDir(), "built.pcap")
	if err := writePcap(path, frames); err != nil {
		t.Fatal(err)
	}
	fields := []string{
		"frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
		"infiniband.bth.padcnt", "infiniband.bth.p_key", "infiniband.bth.se", "infiniband.bth.m", "infiniband.bth.a",
		"infiniband.rdeth.eecnxt", "infiniband.deth.q_key", "infiniband.deth.srcqp",
		"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
		"infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt",
		"infiniband.aeth.syndrome", "infiniband.aeth.msn", "infiniband.atomicacketh.origremdt",
		"infiniband.immdt", "infiniband.ieth", "data.data", "infiniband.invariant.crc",
		"udp.checksum.status", "ip.checksum.status", "_ws.malformed", "_ws.expert.message",
	}
	args := []string{"-r", path, "-n", "-o", "udp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(frames) {
		t.Fatalf("tshark printed %d lines for %d frames", len(lines), len(frames))
	}
	num := func(s string) uint64 {
		if s == "" {
			return 1<<64 - 1
		}
		if s == "True" {
			return 1
		}
		if s == "False" {
			return 0
		}
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("number %q: %v", s, err)
		}
		return v
	}
	for i, line := range lines {
		col := strings.Split(line, "\t")
		for len(col) < len(fields) {
			col = append(col, "")
		}
		v := map[string]string{}
		for j, f := range fields {
			v[f] = col[j]
		}
		s := specs[i]
		name := s.BTH.Opcode.String()
		check := func(field string, want uint64, present bool) {
			t.Helper()
			got := v[field]
			if !present {
				if got != "" {
					t.Errorf("%s: Wireshark found %s = %s, header not built", name, field, got)
				}
				return
			}
			if num(got) != want {
				t.Errorf("%s: %s = %q, built %#x", name, field, got, want)
			}
		}
		check("infiniband.bth.opcode", uint64(s.BTH.Opcode), true)
		check("infiniband.bth.destqp", uint64(s.BTH.DestQP), true)
		check("infiniband.bth.psn", uint64(s.BTH.PSN), true)
		check("infiniband.bth.padcnt", uint64(-len(s.Payload)&3), true)
		check("infiniband.bth.p_key", uint64(s.BTH.PKey), true)
		check("infiniband.bth.se", b2u(s.BTH.Solicited), true)
		check("infiniband.bth.m", b2u(s.BTH.MigReq), true)
		check("infiniband.bth.a", b2u(s.BTH.AckReq), true)
		check("infiniband.rdeth.eecnxt", uint64(ptrOr(s.RDETH).EEC), s.RDETH != nil)
		check("infiniband.deth.q_key", uint64(ptrOr(s.DETH).QKey), s.DETH != nil)
		check("infiniband.deth.srcqp", uint64(ptrOr(s.DETH).SrcQP), s.DETH != nil)
		// Wireshark shows the AtomicETH VA and R_Key under the RETH field names.
		va, rkey := ptrOr(s.RETH).VA, ptrOr(s.RETH).RKey
		if s.AtomicETH != nil {
			va, rkey = s.AtomicETH.VA, s.AtomicETH.RKey
		}
		check("infiniband.reth.va", va, s.RETH != nil || s.AtomicETH != nil)
		check("infiniband.reth.r_key", uint64(rkey), s.RETH != nil || s.AtomicETH != nil)
		check("infiniband.reth.dmalen", uint64(ptrOr(s.RETH).DMALen), s.RETH != nil)
		check("infiniband.atomiceth.swapdt", ptrOr(s.AtomicETH).SwapAdd, s.AtomicETH != nil)
		check("infiniband.atomiceth.cmpdt", ptrOr(s.AtomicETH).Compare, s.AtomicETH != nil)
		check("infiniband.aeth.syndrome", uint64(ptrOr(s.AETH).Syndrome), s.AETH != nil)
		check("infiniband.aeth.msn", uint64(ptrOr(s.AETH).MSN), s.AETH != nil)
		check("infiniband.atomicacketh.origremdt", ptrOr(s.AtomicAckETH).Orig, s.AtomicAckETH != nil)
		if s.ImmDt != nil {
			if want := hex.EncodeToString(binary.BigEndian.AppendUint32(nil, s.ImmDt.Imm)); v["infiniband.immdt"] != want {
				t.Errorf("%s: immdt %q, built %s", name, v["infiniband.immdt"], want)
			}
		}
		if s.IETH != nil {
			if want := hex.EncodeToString(binary.BigEndian.AppendUint32(nil, s.IETH.RKey)); v["infiniband.ieth"] != want {
				t.Errorf("%s: ieth %q, built %s", name, v["infiniband.ieth"], want)
			}
		}
		if s.BTH.Opcode.Info().Payload {
			// Wireshark hands payload and pad together to its data dissector.
			if want := hex.EncodeToString(append(bytes.Clone(s.Payload), make([]byte, -len(s.Payload)&3)...)); v["data.data"] != want {
				t.Errorf("%s: payload %q, built %s", name, v["data.data"], want)
			}
		}
		f := frames[i]
		if want := uint64(binary.BigEndian.Uint32(f[len(f)-4:])); num(v["infiniband.invariant.crc"]) != want {
			t.Errorf("%s: ICRC field %q, built %#x", name, v["infiniband.invariant.crc"], want)
		}
		// Checksum status 1 is "good"; 3 is "not present" (a zero UDP checksum
		// over IPv4 means none), 4 "illegal" (zero over IPv6).
		wantUDP := map[bool]string{true: "1", false: "3"}[s.UDPChecksum]
		if !s.UDPChecksum && !s.isIPv4() {
			wantUDP = "4"
		}
		if v["udp.checksum.status"] != wantUDP {
			t.Errorf("%s: UDP checksum status %q, want %s", name, v["udp.checksum.status"], wantUDP)
		}
		if s.isIPv4() && v["ip.checksum.status"] != "1" {
			t.Errorf("%s: IPv4 checksum status %q", name, v["ip.checksum.status"])
		}
		// A zero UDP checksum is what rxe sends; Wireshark flags it under IPv6.
		if msg := v["_ws.expert.message"]; v["_ws.malformed"] != "" || (msg != "" && msg != "Illegal checksum value (0)") {
			t.Errorf("%s: Wireshark reports %q %q", name, v["_ws.malformed"], v["_ws.expert.message"])
		}
	}
	t.Logf("%d built frames dissected identically by %s", len(frames), tshark)
}

// ptrOr returns *p, or the zero value for a nil p.
func ptrOr[T any](p *T) T {
	if p == nil {
		var z T
		return z
	}
	return *p
}
