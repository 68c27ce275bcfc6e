package ib

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// Test vectors V1-V5 of ib-wire.md §5.3 and the CM REQ frame of §8.9,
// regenerated independently by ib-wire-vectors.py (zlib CRC-32) and scapy.
const (
	vecV1 = "02000000000202000000000108004500003c123440004011a529c0a80101c0a80102df9412b7002800000420ffff000000128000000148656c6c6f2c20526f434576322100009bee0b28"
	vecV2 = "02000000000202000000000186dd600000000030114020010db800000000000000000000000120010db8000000000000000000000002df9412b7003000000a30ffff0000001380ffffff00007f00000010000000123400000005010203040500000048f37feb"
	vecV3 = "020000000002020000000001080045000030000140004011b768c0a80102c0a80101f80612b7001c00001100ffff00000011000000011f00000134acb1c5"
	vecV4 = "020000000002020000000001080045000038000240004011b75fc0a80101c0a80102df9412b7002400006400ffff00000020000000001111111100000011deadbeef4230538e"
	vecV5 = "0200000000020200000000010800456b003c123440001111d3bec0a80101c0a80102df9412b7002800000420ffff800000128000000148656c6c6f2c20526f434576322100009bee0b28"
	vecCM = "020000000002020000000001080045000134000340004011b662c0a80101c0a80102d87212b7012000006400ffff000000010000000080010000000000010107" +
		"020300000000000000011a2b3c4d00100000000000001a2b3c4d000000000000000001064e21000000fffe000001000000000000000000001180000000800000" +
		"00a0123456a7ffff37f0ffffffff00000000000000000000ffffc0a8010100000000000000000000ffffc0a8010283ca00030040008800000000000000000000" +
		"000000000000000000000000000000000000000000000000000000000000000000000040c5a1000000000000000000000000c0a8010100000000000000000000" +
		"0000c0a8010248454c4c4f000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000bb6c" +
		"3d9a"
	// crcInputV1 is the full pseudo-packet of V1 whose zlib CRC-32 is the ICRC.
	crcInputV1 = "ffffffffffffffff45ff003c12344000ff11ffffc0a80101c0a80102df9412b70028ffff0420ffffff0000128000000148656c6c6f2c20526f43457632210000"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	macA = [6]byte{2, 0, 0, 0, 0, 1}
	macB = [6]byte{2, 0, 0, 0, 0, 2}
)

func TestVectorV1(t *testing.T) {
	frame := mustHex(t, vecV1)
	var p Packet
	if err := Parse(frame, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(p.ICRC); got != "9bee0b28" {
		t.Fatalf("ICRC bytes %s", got)
	}
	b := p.BTH.Fields()
	want := BTHFields{Opcode: RCSendOnly, PadCount: 2, PKey: 0xffff, DestQP: 0x12, AckReq: true, PSN: 1}
	if b != want {
		t.Fatalf("BTH %+v, want %+v", b, want)
	}
	if string(p.Payload) != "Hello, RoCEv2!" || len(p.Pad) != 2 {
		t.Fatalf("payload %q pad %x", p.Payload, p.Pad)
	}
	if p.IPv4.ID() != 0x1234 || !p.IPv4.DontFragment() || p.IPv4.TTL() != 64 || !p.IPv4.ChecksumValid() {
		t.Fatalf("ipv4 %+v", p.IPv4.Fields())
	}
	if p.UDP.SrcPort() != RXESourcePort(0x11) || p.UDP.SrcPort() != 0xdf94 {
		t.Fatalf("sport %#x", p.UDP.SrcPort())
	}
	// The ICRC equals the IEEE CRC-32 of the documented pseudo-packet.
	if got := ICRC(p.ip, p.datagram[:len(p.datagram)-4]); got != crc32IEEE(mustHex(t, crcInputV1)) {
		t.Fatalf("ICRC %#x differs from CRC-32 of the documented CRC input", got)
	}

	spec := FrameSpec{
		SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.168.1.1"), Dst: netip.MustParseAddr("192.168.1.2"),
		HopLimit: 64, IPID: 0x1234, DontFragment: true, SrcPort: RXESourcePort(0x11),
		BTH:     BTHFields{Opcode: RCSendOnly, PKey: 0xffff, DestQP: 0x12, AckReq: true, PSN: 1},
		Payload: []byte("Hello, RoCEv2!"),
	}
	buildEqual(t, &spec, frame)
	// v4-mapped GIDs select IPv4 as well.
	spec.Src = GIDFromAddr(spec.Src).asMapped()
	spec.Dst = GIDFromAddr(spec.Dst).asMapped()
	buildEqual(t, &spec, frame)
}

// asMapped returns the GID as a (possibly v4-mapped) 16-byte address.
func (g GID) asMapped() netip.Addr { return netip.AddrFrom16(g) }

func buildEqual(t *testing.T, s *FrameSpec, want []byte) {
	t.Helper()
	buf := make([]byte, 9000)
	n, err := Build(buf, s)
	if err != nil {
		t.Fatal(err)
	}
	if n != s.Len() {
		t.Fatalf("Build wrote %d, Len %d", n, s.Len())
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("Build:\n got %x\nwant %x", buf[:n], want)
	}
}

func TestVectorV2(t *testing.T) {
	frame := mustHex(t, vecV2)
	var p Packet
	if err := Parse(frame, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	if p.IPv6 == nil || p.IPv4 != nil || p.BTH.PSN() != 0xffffff || p.BTH.PSN().Next() != 0 {
		t.Fatalf("unexpected %+v", p.BTH.Fields())
	}
	r := p.RETH.Fields()
	if r != (RETHFields{VA: 0x00007f0000001000, RKey: 0x1234, DMALen: 5}) {
		t.Fatalf("RETH %+v", r)
	}
	if !bytes.Equal(p.Payload, []byte{1, 2, 3, 4, 5}) || len(p.Pad) != 3 {
		t.Fatalf("payload %x pad %x", p.Payload, p.Pad)
	}
	spec := FrameSpec{
		SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"),
		HopLimit: 64, SrcPort: 0xdf94,
		BTH:     BTHFields{Opcode: RCWriteOnly, PKey: 0xffff, DestQP: 0x13, AckReq: true, PSN: 0xffffff},
		RETH:    &r,
		Payload: []byte{1, 2, 3, 4, 5},
	}
	buildEqual(t, &spec, frame)
	// Flow label, traffic class and hop limit are masked.
	for _, i := range []int{14 + 0, 14 + 1, 14 + 2, 14 + 3, 14 + 7} {
		f := bytes.Clone(frame)
		f[i] ^= 0x0f
		if err := VerifyFrameICRC(f); err != nil {
			t.Errorf("flip masked IPv6 byte %d: %v", i-14, err)
		}
	}
	f := bytes.Clone(frame)
	f[14+4] ^= 1 // payload length: covered (and makes the frame inconsistent)
	if err := VerifyFrameICRC(f); err == nil {
		t.Error("payload length change not detected")
	}
	f = bytes.Clone(frame)
	f[14+8] ^= 1 // source address
	if err := VerifyFrameICRC(f); !errors.Is(err, ErrBadICRC) {
		t.Errorf("source address flip: %v", err)
	}
}

func TestVectorV3V4(t *testing.T) {
	v3 := mustHex(t, vecV3)
	if len(v3) != 62 {
		t.Fatalf("V3 is %d bytes", len(v3))
	}
	var p Packet
	if err := Parse(v3, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	a := p.AETH.Fields()
	if a.Syndrome != SyndromeACKUnlimited || a.MSN != 1 || a.Syndrome.Type() != SyndromeACK || len(p.Payload) != 0 {
		t.Fatalf("AETH %+v", a)
	}
	buildEqual(t, &FrameSpec{
		SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.168.1.2"), Dst: netip.MustParseAddr("192.168.1.1"),
		HopLimit: 64, IPID: 1, DontFragment: true, SrcPort: RXESourcePort(0x12),
		BTH:  BTHFields{Opcode: RCAck, PKey: 0xffff, DestQP: 0x11, PSN: 1},
		AETH: &AETHFields{Syndrome: ACKSyndrome(0x1f), MSN: 1},
	}, v3)

	v4 := mustHex(t, vecV4)
	if err := Parse(v4, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	d := p.DETH.Fields()
	if d != (DETHFields{QKey: 0x11111111, SrcQP: 0x11}) || !bytes.Equal(p.Payload, []byte{0xde, 0xad, 0xbe, 0xef}) {
		t.Fatalf("DETH %+v payload %x", d, p.Payload)
	}
	buildEqual(t, &FrameSpec{
		SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.168.1.1"), Dst: netip.MustParseAddr("192.168.1.2"),
		HopLimit: 64, IPID: 2, DontFragment: true, SrcPort: 0xdf94,
		BTH:     BTHFields{Opcode: UDSendOnly, PKey: 0xffff, DestQP: 0x20},
		DETH:    &d,
		Payload: []byte{0xde, 0xad, 0xbe, 0xef},
	}, v4)
}

// TestVectorV5Masking checks the ICRC masks of §5.1 on V1/V5.
func TestVectorV5Masking(t *testing.T) {
	v1, v5 := mustHex(t, vecV1), mustHex(t, vecV5)
	if err := VerifyFrameICRC(v5); err != nil {
		t.Fatalf("V5: %v", err)
	}
	if !bytes.Equal(v1[len(v1)-4:], v5[len(v5)-4:]) {
		t.Fatal("V5 ICRC differs from V1")
	}
	var p Packet
	if err := Parse(v5, &p); err != nil {
		t.Fatal(err)
	}
	if p.IPv4.TOS() != 0x6b || p.IPv4.TTL() != 17 || !p.BTH.FECN() || !p.IPv4.ChecksumValid() {
		t.Fatalf("V5 fields %+v FECN %v", p.IPv4.Fields(), p.BTH.FECN())
	}
	const ip, udp, bth = 14, 34, 42
	masked := map[string]int{
		"IPv4 TOS": ip + 1, "IPv4 TTL": ip + 8, "IPv4 checksum hi": ip + 10, "IPv4 checksum lo": ip + 11,
		"UDP checksum hi": udp + 6, "UDP checksum lo": udp + 7, "BTH byte 4 (FECN/BECN)": bth + 4,
	}
	for name, i := range masked {
		f := bytes.Clone(v1)
		f[i] ^= 0x5a
		if err := VerifyFrameICRC(f); err != nil {
			t.Errorf("%s flipped: %v, want ICRC still valid", name, err)
		}
	}
	covered := map[string]int{
		"IPv4 ID": ip + 4, "IPv4 DF": ip + 6, "IPv4 src": ip + 12, "UDP src port": udp + 0,
		"BTH byte 8 (AckReq)": bth + 8, "BTH opcode-adjacent flags": bth + 1, "BTH PKey": bth + 2,
		"BTH DestQP": bth + 7, "BTH PSN": bth + 11, "payload": bth + 12, "pad": bth + 12 + 14,
	}
	for name, i := range covered {
		f := bytes.Clone(v1)
		f[i] ^= 0x80
		err := VerifyFrameICRC(f)
		if err == nil {
			t.Errorf("%s flipped: ICRC still valid", name)
		}
	}
	// Specifically: IP ID and BTH byte 8 give ErrBadICRC (the frame still parses).
	for _, i := range []int{ip + 4, ip + 5, bth + 8} {
		f := bytes.Clone(v1)
		f[i] ^= 0x01
		if err := VerifyFrameICRC(f); !errors.Is(err, ErrBadICRC) {
			t.Errorf("byte %d flipped: got %v, want ErrBadICRC", i, err)
		}
	}
	// SetFrameICRC repairs a frame after a covered change.
	f := bytes.Clone(v1)
	f[ip+4] = 0x99
	if err := SetFrameICRC(f); err != nil {
		t.Fatal(err)
	}
	if err := VerifyFrameICRC(f); err != nil {
		t.Fatal(err)
	}
}

func TestVectorCMREQ(t *testing.T) {
	frame := mustHex(t, vecCM)
	if len(frame) != 322 {
		t.Fatalf("len %d", len(frame))
	}
	var p Packet
	if err := Parse(frame, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	if p.BTH.Opcode() != UDSendOnly || p.BTH.DestQP() != 1 || len(p.Payload) != 256 || len(p.Pad) != 0 {
		t.Fatalf("%v qp %d payload %d", p.BTH.Opcode(), p.BTH.DestQP(), len(p.Payload))
	}
	d := p.DETH.Fields()
	if d.QKey != 0x80010000 || d.SrcQP != 1 {
		t.Fatalf("DETH %+v", d)
	}
	if p.UDP.SrcPort() != 0xd872 || p.UDP.SrcPort() != RXESourcePort(1) {
		t.Fatalf("sport %#x", p.UDP.SrcPort())
	}
	// MAD: base version 1, class 7 (CM), class version 2, method 3 (Send), attribute 0x0010 (REQ).
	if m := p.Payload; m[0] != 1 || m[1] != 7 || m[2] != 2 || m[3] != 3 || m[16] != 0 || m[17] != 0x10 {
		t.Fatalf("MAD header %x", m[:24])
	}
	payload := bytes.Clone(p.Payload)
	buildEqual(t, &FrameSpec{
		SrcMAC: macA, DstMAC: macB,
		Src: netip.MustParseAddr("192.168.1.1"), Dst: netip.MustParseAddr("192.168.1.2"),
		HopLimit: 64, IPID: 3, DontFragment: true, SrcPort: RXESourcePort(1),
		BTH:     BTHFields{Opcode: UDSendOnly, PKey: 0xffff, DestQP: 1},
		DETH:    &d,
		Payload: payload,
	}, frame)
	// Flow label 0x83CA0 from the REQ maps to the mlx5 source port 0xFC80.
	if fl := (uint32(0xc5a1)*31 + 20001) & 0xfffff; fl != 0x83ca0 || FlowLabelToUDPSourcePort(fl) != 0xfc80 {
		t.Fatalf("flow label %#x -> %#x", fl, FlowLabelToUDPSourcePort(fl))
	}
}
