package ib

import (
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/goroce/goroce/internal/pcaptest"
)

// wsField is one field of Wireshark's InfiniBand dissection (tshark -V) and
// how to read the same field from a parsed Packet.
type wsField struct {
	re  *regexp.Regexp
	hex bool // the captured value is bare hex
	get func(p *Packet) (uint64, bool)
}

var wsFields = map[string]wsField{
	"opcode":  {re: regexp.MustCompile(`(?m)^\s+Opcode: .*\((\d+)\)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.BTH.Opcode()), true }},
	"destqp":  {re: regexp.MustCompile(`(?m)^\s+Destination Queue Pair: (\S+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.BTH.DestQP()), true }},
	"psn":     {re: regexp.MustCompile(`(?m)^\s+Packet Sequence Number: (\d+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.BTH.PSN()), true }},
	"pad":     {re: regexp.MustCompile(`(?m)= Pad Count: (\d+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.BTH.PadCount()), true }},
	"pkey":    {re: regexp.MustCompile(`(?m)^\s+Partition Key: (\d+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.BTH.PKey()), true }},
	"ackreq":  {re: regexp.MustCompile(`(?m)= Acknowledge Request: (True|False)$`), get: func(p *Packet) (uint64, bool) { return b2u(p.BTH.AckReq()), true }},
	"se":      {re: regexp.MustCompile(`(?m)= Solicited Event: (True|False)$`), get: func(p *Packet) (uint64, bool) { return b2u(p.BTH.Solicited()), true }},
	"syn":     {re: regexp.MustCompile(`(?m)^\s+Syndrome: (\d+),`), get: func(p *Packet) (uint64, bool) { return uint64(p.AETH.Syndrome()), p.AETH != nil }},
	"msn":     {re: regexp.MustCompile(`(?m)^\s+Message Sequence Number: (\d+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.AETH.MSN()), p.AETH != nil }},
	"qkey":    {re: regexp.MustCompile(`(?m)^\s+Queue Key: (\S+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.DETH.QKey()), p.DETH != nil }},
	"srcqp":   {re: regexp.MustCompile(`(?m)^\s+Source Queue Pair: (\S+)$`), get: func(p *Packet) (uint64, bool) { return uint64(p.DETH.SrcQP()), p.DETH != nil }},
	"dmalen":  {re: regexp.MustCompile(`(?m)^\s+DMA Length: (\d+)`), get: func(p *Packet) (uint64, bool) { return uint64(p.RETH.DMALen()), p.RETH != nil }},
	"swapadd": {re: regexp.MustCompile(`(?m)^\s+Swap \(Or Add\) Data: (\d+)$`), get: func(p *Packet) (uint64, bool) { return p.AtomicETH.SwapAdd(), p.AtomicETH != nil }},
	"compare": {re: regexp.MustCompile(`(?m)^\s+Compare Data: (\d+)$`), get: func(p *Packet) (uint64, bool) { return p.AtomicETH.Compare(), p.AtomicETH != nil }},
	"orig":    {re: regexp.MustCompile(`(?m)^\s+Original Remote Data: (\d+)$`), get: func(p *Packet) (uint64, bool) { return p.AtomicAckETH.Orig(), p.AtomicAckETH != nil }},
	"imm":     {re: regexp.MustCompile(`(?m)^\s+Immediate Data: ([0-9a-f]+)$`), hex: true, get: func(p *Packet) (uint64, bool) { return uint64(p.ImmDt.Imm()), p.ImmDt != nil }},
	"va": {re: regexp.MustCompile(`(?m)^\s+Virtual Address: (\S+)$`), get: func(p *Packet) (uint64, bool) {
		switch {
		case p.RETH != nil:
			return p.RETH.VA(), true
		case p.AtomicETH != nil:
			return p.AtomicETH.VA(), true
		}
		return 0, false
	}},
	"rkey": {re: regexp.MustCompile(`(?m)^\s+Remote Key: (\S+)$`), get: func(p *Packet) (uint64, bool) {
		switch {
		case p.RETH != nil:
			return uint64(p.RETH.RKey()), true
		case p.AtomicETH != nil:
			return uint64(p.AtomicETH.RKey()), true
		}
		return 0, false
	}},
	// Wireshark prints the ICRC bytes as one big-endian number.
	"icrc": {re: regexp.MustCompile(`(?m)^\s+Invariant CRC: 0x([0-9a-f]{8})$`), hex: true, get: func(p *Packet) (uint64, bool) {
		v, err := strconv.ParseUint(hex.EncodeToString(p.ICRC), 16, 64)
		return v, err == nil
	}},
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestCapturesMatchWireshark compares every header field Wireshark decoded
// from the lab captures (the .decode.txt next to each .pcap) with Parse.
func TestCapturesMatchWireshark(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	frameRE := regexp.MustCompile(`(?m)^Frame (\d+):`)
	checked := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".pcap") {
			return err
		}
		dec, err := os.ReadFile(strings.TrimSuffix(path, ".pcap") + ".decode.txt")
		if err != nil {
			return nil // no Wireshark dissection recorded for this capture
		}
		pkts, err := readFrames(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		text := string(dec)
		locs := frameRE.FindAllStringSubmatchIndex(text, -1)
		for i, loc := range locs {
			n, _ := strconv.Atoi(text[loc[2]:loc[3]])
			end := len(text)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			block := text[loc[0]:end]
			ibStart := strings.Index(block, "\nInfiniBand\n")
			if ibStart < 0 || n < 1 || n > len(pkts) {
				continue
			}
			block = block[ibStart:]
			var p Packet
			if err := Parse(pkts[n-1], &p); err != nil {
				t.Errorf("%s #%d: Wireshark dissected it, Parse: %v", rel, n, err)
				continue
			}
			for name, f := range wsFields {
				m := f.re.FindStringSubmatch(block)
				if m == nil {
					continue
				}
				var want uint64
				switch {
				case m[1] == "True":
					want = 1
				case m[1] == "False":
					want = 0
				case f.hex:
					want, err = strconv.ParseUint(m[1], 16, 64)
				default:
					want, err = strconv.ParseUint(m[1], 0, 64)
				}
				if err != nil {
					t.Fatalf("%s #%d: %s: %q: %v", rel, n, name, m[1], err)
				}
				got, ok := f.get(&p)
				if !ok || got != want {
					t.Errorf("%s #%d: %s = %#x (present %v), Wireshark %#x", rel, n, name, got, ok, want)
				}
				checked++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Skip("no Wireshark dissections found next to the captures")
	}
	t.Logf("%d field values agree with Wireshark", checked)
}
