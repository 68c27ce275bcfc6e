package wirecheck

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcapdump"
)

// With -wirecheck.pcap=FILE, TestGenerateCoversEveryOpcode also writes the
// generated frames to FILE, for looking at them with tshark or Wireshark:
//
//	go test ./internal/wirecheck -run Covers -args -wirecheck.pcap=/tmp/gen.pcap
var pcapOut = flag.String("wirecheck.pcap", "", "also write the generated frames to this pcap file")

func TestGenerateCoversEveryOpcode(t *testing.T) {
	cases, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	type key struct {
		op ib.Opcode
		v6 bool
	}
	seen := map[key]int{}
	pads := map[uint8]bool{}
	transports := map[ib.Transport]bool{}
	for _, c := range cases {
		seen[key{c.Spec.BTH.Opcode, c.Spec.Src.Is6() && !c.Spec.Src.Is4In6()}]++
		pads[uint8((-len(c.Spec.Payload))&3)] = true
		transports[c.Spec.BTH.Opcode.Transport()] = true
	}
	defined := 0
	for op := 0; op < 256; op++ {
		o := ib.Opcode(op)
		if !o.Info().Valid {
			continue
		}
		defined++
		for _, v6 := range []bool{false, true} {
			if seen[key{o, v6}] != variants {
				t.Errorf("%v (IPv6 %v): %d frames, want %d", o, v6, seen[key{o, v6}], variants)
			}
		}
	}
	if len(pads) != 4 {
		t.Errorf("pad counts generated: %v, want all of 0..3", pads)
	}
	for _, tr := range []ib.Transport{ib.TransportRC, ib.TransportUC, ib.TransportRD, ib.TransportUD, ib.TransportCNP, ib.TransportXRC} {
		if !transports[tr] {
			t.Errorf("no frame of transport %v", tr)
		}
	}
	t.Logf("%d defined opcodes, %d frames", defined, len(cases))
	if *pcapOut != "" {
		var buf bytes.Buffer
		if err := WritePCAP(&buf, Frames(cases)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*pcapOut, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, c := range cases {
			t.Logf("frame %d: %s", i+1, c.Name)
		}
	}

	again, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cases {
		if !bytes.Equal(cases[i].Frame, again[i].Frame) {
			t.Fatalf("%s: Generate is not deterministic", cases[i].Name)
		}
	}
}

// TestGeneratedDecode checks that rocectl's decoder reports exactly the
// values each frame was built from.
func TestGeneratedDecode(t *testing.T) {
	cases, err := Generate(testSeed)
	if err != nil {
		t.Fatal(err)
	}
	var d pcapdump.Decoder
	for i, c := range cases {
		var r pcapdump.Record
		d.Decode(pcapdump.Frame{Number: i + 1, LinkType: layers.LinkTypeEthernet, Data: c.Frame}, &r)
		for _, diff := range specDiffs(&c.Spec, &r) {
			t.Errorf("%s: %s", c.Name, diff)
		}
	}
}

func specDiffs(s *ib.FrameSpec, r *pcapdump.Record) []string {
	var d []string
	check := func(name string, got, want any) {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			d = append(d, fmt.Sprintf("%s = %v, built with %v", name, got, want))
		}
	}
	if r.Error != "" {
		return []string{"decode error: " + r.Error}
	}
	wantVer := 6
	if s.Src.Unmap().Is4() {
		wantVer = 4
	}
	check("ip_version", r.IPVersion, wantVer)
	check("src", r.Src, s.Src.Unmap())
	check("dst", r.Dst, s.Dst.Unmap())
	if s.VLAN {
		if r.VLAN == nil {
			d = append(d, "vlan missing")
		} else {
			check("vlan", *r.VLAN, s.VLANID)
		}
	}
	check("udp_sport", r.UDPSport, s.SrcPort)
	check("udp_dport", r.UDPDport, s.DstPort)
	b := s.BTH
	check("opcode", r.Opcode, uint8(b.Opcode))
	check("opcode_name", r.OpcodeName, b.Opcode.String())
	check("solicited", r.Solicited, b.Solicited)
	check("mig_req", r.MigReq, b.MigReq)
	check("pad", r.Pad, (-len(s.Payload))&3)
	check("pkey", r.PKey, b.PKey)
	check("fecn", r.FECN, b.FECN)
	check("becn", r.BECN, b.BECN)
	check("dest_qp", r.DestQP, b.DestQP)
	check("ack_req", r.AckReq, b.AckReq)
	check("psn", r.PSN, uint32(b.PSN))
	check("payload_len", r.PayloadLen, len(s.Payload))
	check("icrc_ok", r.ICRCOK, true)
	// Optional headers: present exactly when built, with the built values.
	opt := func(name string, have, built bool, cmp func()) {
		if have != built {
			d = append(d, fmt.Sprintf("%s present=%v, built=%v", name, have, built))
		} else if have {
			cmp()
		}
	}
	opt("rdeth", r.RDETH != nil, s.RDETH != nil, func() { check("rdeth.eec", r.RDETH.EEC, s.RDETH.EEC) })
	opt("deth", r.DETH != nil, s.DETH != nil, func() {
		check("deth.qkey", r.DETH.QKey, s.DETH.QKey)
		check("deth.src_qp", r.DETH.SrcQP, s.DETH.SrcQP)
	})
	opt("xrceth", r.XRCETH != nil, s.XRCETH != nil, func() { check("xrceth.srqn", r.XRCETH.SRQN, s.XRCETH.SRQN) })
	opt("feth", r.FETH != nil, s.FETH != nil, func() {
		check("feth.placement", r.FETH.Placement, s.FETH.Placement)
		check("feth.selectivity", r.FETH.Selectivity, s.FETH.Selectivity)
	})
	opt("reth", r.RETH != nil, s.RETH != nil, func() {
		check("reth.va", r.RETH.VA, s.RETH.VA)
		check("reth.rkey", r.RETH.RKey, s.RETH.RKey)
		check("reth.dma_len", r.RETH.DMALen, s.RETH.DMALen)
	})
	opt("atomic", r.Atomic != nil, s.AtomicETH != nil, func() {
		check("atomic.va", r.Atomic.VA, s.AtomicETH.VA)
		check("atomic.rkey", r.Atomic.RKey, s.AtomicETH.RKey)
		check("atomic.swap_add", r.Atomic.SwapAdd, s.AtomicETH.SwapAdd)
		check("atomic.compare", r.Atomic.Compare, s.AtomicETH.Compare)
	})
	opt("aeth", r.AETH != nil, s.AETH != nil, func() {
		check("aeth.syndrome", r.AETH.Syndrome, uint8(s.AETH.Syndrome))
		check("aeth.msn", r.AETH.MSN, s.AETH.MSN)
	})
	opt("atomic_ack", r.AtomicAck != nil, s.AtomicAckETH != nil, func() { check("atomic_ack.orig", r.AtomicAck.Orig, s.AtomicAckETH.Orig) })
	opt("imm", r.Imm != nil, s.ImmDt != nil, func() { check("imm", *r.Imm, s.ImmDt.Imm) })
	opt("ieth", r.IETH != nil, s.IETH != nil, func() { check("ieth", *r.IETH, s.IETH.RKey) })
	return d
}
