package ib

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/goroce/goroce/internal/pcaptest"
)

// isRoCE classifies a frame independently of Parse: IPv4/IPv6 (optionally
// VLAN-tagged) carrying UDP to port 4791.
func isRoCE(f []byte) bool {
	if len(f) < 14 {
		return false
	}
	et, off := binary.BigEndian.Uint16(f[12:]), 14
	if et == 0x8100 && len(f) >= 18 {
		et, off = binary.BigEndian.Uint16(f[16:]), 18
	}
	switch {
	case et == 0x0800 && len(f) >= off+28:
		ihl := int(f[off]&15) * 4
		return f[off+9] == 17 && len(f) >= off+ihl+4 && binary.BigEndian.Uint16(f[off+ihl+2:]) == 4791
	case et == 0x86dd && len(f) >= off+48:
		return f[off+6] == 17 && binary.BigEndian.Uint16(f[off+42:]) == 4791
	}
	return false
}

// extStore holds the extended header fields a FrameSpec points to.
type extStore struct {
	rdeth  RDETHFields
	deth   DETHFields
	reth   RETHFields
	atomic AtomicETHFields
	aeth   AETHFields
	atmack AtomicAckETHFields
	imm    ImmDtFields
	ieth   IETHFields
	feth   FETHFields
	xrc    XRCETHFields
}

// specFromPacket fills s with everything needed to rebuild p's frame.
func specFromPacket(p *Packet, s *FrameSpec, st *extStore) {
	*s = FrameSpec{
		SrcMAC: p.Eth.Src(), DstMAC: p.Eth.Dst(),
		SrcPort: p.UDP.SrcPort(), DstPort: p.UDP.DstPort(), UDPChecksum: p.UDP.Checksum() != 0,
		BTH: p.BTH.Fields(), Payload: p.Payload,
	}
	if p.VLAN != nil {
		s.VLAN, s.VLANID, s.VLANPCP = true, p.VLAN.VID(), p.VLAN.PCP()
	}
	if p.IPv4 != nil {
		f := p.IPv4.Fields()
		s.Src, s.Dst, s.TrafficClass, s.HopLimit, s.IPID, s.DontFragment = f.Src, f.Dst, f.TOS, f.TTL, f.ID, f.DontFragment
	} else {
		f := p.IPv6.Fields()
		s.Src, s.Dst, s.TrafficClass, s.HopLimit, s.FlowLabel = f.Src, f.Dst, f.TrafficClass, f.HopLimit, f.FlowLabel
	}
	if p.RDETH != nil {
		st.rdeth = p.RDETH.Fields()
		s.RDETH = &st.rdeth
	}
	if p.DETH != nil {
		st.deth = p.DETH.Fields()
		s.DETH = &st.deth
	}
	if p.RETH != nil {
		st.reth = p.RETH.Fields()
		s.RETH = &st.reth
	}
	if p.AtomicETH != nil {
		st.atomic = p.AtomicETH.Fields()
		s.AtomicETH = &st.atomic
	}
	if p.AETH != nil {
		st.aeth = p.AETH.Fields()
		s.AETH = &st.aeth
	}
	if p.AtomicAckETH != nil {
		st.atmack = p.AtomicAckETH.Fields()
		s.AtomicAckETH = &st.atmack
	}
	if p.ImmDt != nil {
		st.imm = p.ImmDt.Fields()
		s.ImmDt = &st.imm
	}
	if p.IETH != nil {
		st.ieth = p.IETH.Fields()
		s.IETH = &st.ieth
	}
	if p.FETH != nil {
		st.feth = p.FETH.Fields()
		s.FETH = &st.feth
	}
	if p.XRCETH != nil {
		st.xrc = p.XRCETH.Fields()
		s.XRCETH = &st.xrc
	}
}

// TestCaptures parses every frame rxe put on the wire in the lab captures,
// verifies its ICRC and rebuilds it byte for byte from the decoded fields.
func TestCaptures(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	files := pcaptest.Files(t, "*.pcap")
	if len(files) == 0 {
		t.Skipf("no .pcap files under %s", dir)
	}
	var roce, other int
	opcodes := map[Opcode]int{}
	buf := make([]byte, 10000)
	for _, path := range files {
		rel, _ := filepath.Rel(dir, path)
		pkts, err := readFrames(path)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		for i, f := range pkts {
			var p Packet
			err := Parse(f, &p)
			if !isRoCE(f) {
				// Out-of-band TCP exchanges of the perftest tools.
				other++
				if !errors.Is(err, ErrUnsupported) {
					t.Errorf("%s #%d: non-RoCE frame: got %v, want ErrUnsupported", rel, i+1, err)
				}
				continue
			}
			roce++
			if err != nil {
				t.Errorf("%s #%d: %v", rel, i+1, err)
				continue
			}
			opcodes[p.BTH.Opcode()]++
			if err := p.VerifyICRC(); err != nil {
				t.Errorf("%s #%d (%v): %v", rel, i+1, p.BTH.Opcode(), err)
			}
			if p.IPv4 != nil && !p.IPv4.ChecksumValid() {
				t.Errorf("%s #%d: bad IPv4 header checksum", rel, i+1)
			}
			if !p.UDPChecksumValid() {
				t.Errorf("%s #%d: bad UDP checksum", rel, i+1)
			}
			var s FrameSpec
			var st extStore
			specFromPacket(&p, &s, &st)
			n, err := Build(buf, &s)
			if err != nil {
				t.Errorf("%s #%d: Build: %v", rel, i+1, err)
				continue
			}
			if !bytes.Equal(buf[:n], f) {
				t.Errorf("%s #%d (%v): rebuilt frame differs\n got %x\nwant %x", rel, i+1, p.BTH.Opcode(), buf[:n], f)
			}
		}
	}
	if roce == 0 {
		t.Fatal("no RoCEv2 frames found in the captures")
	}
	t.Logf("%d pcap files: %d RoCEv2 frames parsed, verified and rebuilt; %d non-RoCE frames rejected", len(files), roce, other)
	for op := range 256 {
		if n := opcodes[Opcode(op)]; n > 0 {
			t.Logf("  %-40v %d", Opcode(op), n)
		}
	}
}

// readFrames returns the frames of a lab capture, refusing records the
// capture's snaplen cut short: every test here needs whole frames.
func readFrames(path string) ([][]byte, error) {
	recs, err := pcaptest.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if len(r.Data) != r.OrigLen {
			return nil, fmt.Errorf("pcap: record %d truncated by snaplen (%d of %d)", i+1, len(r.Data), r.OrigLen)
		}
	}
	return pcaptest.Frames(recs), nil
}
