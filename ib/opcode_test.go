package ib

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

// TestOpcodeTable checks the table against ib-wire.md §4.2 (rxe_opcode.c
// lengths) and its internal consistency.
func TestOpcodeTable(t *testing.T) {
	type row struct {
		op      Opcode
		headers HeaderMask
		hlen    int
		payload bool
		pos     Position
	}
	rows := []row{
		{RCSendFirst, 0, 12, true, PositionFirst},
		{RCSendMiddle, 0, 12, true, PositionMiddle},
		{RCSendLast, 0, 12, true, PositionLast},
		{RCSendLastImm, HdrImmDt, 16, true, PositionLast},
		{RCSendOnly, 0, 12, true, PositionOnly},
		{RCSendOnlyImm, HdrImmDt, 16, true, PositionOnly},
		{RCWriteFirst, HdrRETH, 28, true, PositionFirst},
		{RCWriteMiddle, 0, 12, true, PositionMiddle},
		{RCWriteLast, 0, 12, true, PositionLast},
		{RCWriteLastImm, HdrImmDt, 16, true, PositionLast},
		{RCWriteOnly, HdrRETH, 28, true, PositionOnly},
		{RCWriteOnlyImm, HdrRETH | HdrImmDt, 32, true, PositionOnly},
		{RCReadRequest, HdrRETH, 28, false, PositionOnly},
		{RCReadResponseFirst, HdrAETH, 16, true, PositionFirst},
		{RCReadResponseMiddle, 0, 12, true, PositionMiddle},
		{RCReadResponseLast, HdrAETH, 16, true, PositionLast},
		{RCReadResponseOnly, HdrAETH, 16, true, PositionOnly},
		{RCAck, HdrAETH, 16, false, PositionOnly},
		{RCAtomicAck, HdrAETH | HdrAtomicAckETH, 24, false, PositionOnly},
		{RCCompareSwap, HdrAtomicETH, 40, false, PositionOnly},
		{RCFetchAdd, HdrAtomicETH, 40, false, PositionOnly},
		{RCSendLastInv, HdrIETH, 16, true, PositionLast},
		{RCSendOnlyInv, HdrIETH, 16, true, PositionOnly},
		{RCFlush, HdrFETH | HdrRETH, 32, false, PositionOnly},
		{RCAtomicWrite, HdrRETH, 28, true, PositionOnly},
		{UCSendFirst, 0, 12, true, PositionFirst},
		{UCWriteOnlyImm, HdrRETH | HdrImmDt, 32, true, PositionOnly},
		{RDSendFirst, HdrRDETH | HdrDETH, 24, true, PositionFirst},
		{RDSendLastImm, HdrRDETH | HdrDETH | HdrImmDt, 28, true, PositionLast},
		{RDWriteOnlyImm, HdrRDETH | HdrDETH | HdrRETH | HdrImmDt, 44, true, PositionOnly},
		{RDReadRequest, HdrRDETH | HdrDETH | HdrRETH, 40, false, PositionOnly},
		{RDReadResponseMiddle, HdrRDETH, 16, true, PositionMiddle},
		{RDReadResponseFirst, HdrRDETH | HdrAETH, 20, true, PositionFirst},
		{RDAck, HdrRDETH | HdrAETH, 20, false, PositionOnly},
		{RDAtomicAck, HdrRDETH | HdrAETH | HdrAtomicAckETH, 28, false, PositionOnly},
		{RDCompareSwap, HdrRDETH | HdrDETH | HdrAtomicETH, 52, false, PositionOnly},
		{RDFlush, HdrRDETH | HdrDETH | HdrFETH | HdrRETH, 44, false, PositionOnly},
		{UDSendOnly, HdrDETH, 20, true, PositionOnly},
		{UDSendOnlyImm, HdrDETH | HdrImmDt, 24, true, PositionOnly},
		{CNP, HdrCNPReserved, 28, false, PositionOnly},
		{XRCSendFirst, HdrXRCETH, 16, true, PositionFirst},
		{XRCWriteOnlyImm, HdrXRCETH | HdrRETH | HdrImmDt, 36, true, PositionOnly},
		{XRCReadRequest, HdrXRCETH | HdrRETH, 32, false, PositionOnly},
		{XRCReadResponseOnly, HdrAETH, 16, true, PositionOnly},
		{XRCAck, HdrAETH, 16, false, PositionOnly},
		{XRCCompareSwap, HdrXRCETH | HdrAtomicETH, 44, false, PositionOnly},
		{XRCSendOnlyInv, HdrXRCETH | HdrIETH, 20, true, PositionOnly},
	}
	for _, r := range rows {
		i := r.op.Info()
		if !i.Valid || i.Headers != r.headers || i.HeaderLen != r.hlen || i.Payload != r.payload || i.Position != r.pos {
			t.Errorf("%v (%#x): got %+v", r.op, uint8(r.op), i)
		}
	}
	// Offsets follow wire order.
	if o := RCWriteOnlyImm.Info(); o.Offset(HdrRETH) != 12 || o.Offset(HdrImmDt) != 28 || o.Offset(HdrAETH) != -1 {
		t.Errorf("RC WRITE_ONLY_IMM offsets %d %d", o.Offset(HdrRETH), o.Offset(HdrImmDt))
	}
	if o := RCFlush.Info(); o.Offset(HdrFETH) != 12 || o.Offset(HdrRETH) != 16 {
		t.Errorf("FLUSH offsets")
	}
	if o := RCAtomicAck.Info(); o.Offset(HdrAETH) != 12 || o.Offset(HdrAtomicAckETH) != 16 {
		t.Errorf("ATOMIC_ACK offsets")
	}
	if o := RDSendLastImm.Info(); o.Offset(HdrRDETH) != 12 || o.Offset(HdrDETH) != 16 || o.Offset(HdrImmDt) != 24 {
		t.Errorf("RD SEND_LAST_IMM offsets")
	}
	if o := XRCWriteFirst.Info(); o.Offset(HdrXRCETH) != 12 || o.Offset(HdrRETH) != 16 {
		t.Errorf("XRC WRITE_FIRST offsets")
	}

	counts := map[Transport]int{}
	for o := range 256 {
		op := Opcode(o)
		i := op.Info()
		if !i.Valid {
			if op.String() != fmt.Sprintf("Opcode(%#x)", o) {
				t.Errorf("undefined %#x prints %q", o, op.String())
			}
			continue
		}
		counts[op.Transport()]++
		if op.String() != i.Name || op.String() == "" {
			t.Errorf("%#x name %q", o, op.String())
		}
		// HeaderLen is BTH plus the listed headers.
		n := BTHSize
		for _, h := range HeaderOrder() {
			if i.Headers&h != 0 {
				if i.Offset(h) != n {
					t.Errorf("%v: %s at %d, want %d", op, h.Layer(), i.Offset(h), n)
				}
				n += h.Size()
			}
		}
		if n != i.HeaderLen {
			t.Errorf("%v: HeaderLen %d, headers sum %d", op, i.HeaderLen, n)
		}
		if i.IsAck != (i.Headers&HdrAETH != 0 && !i.Payload && !i.IsReadResponse) {
			t.Errorf("%v: IsAck inconsistent", op)
		}
		if i.HasImm != (i.Headers&HdrImmDt != 0) || i.HasInv != (i.Headers&HdrIETH != 0) {
			t.Errorf("%v: HasImm/HasInv inconsistent", op)
		}
	}
	want := map[Transport]int{TransportRC: 25, TransportUC: 12, TransportRD: 22, TransportUD: 2, TransportCNP: 1, TransportXRC: 23}
	for tr, n := range want {
		if counts[tr] != n {
			t.Errorf("%v: %d opcodes, want %d", tr, counts[tr], n)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("transports %v", counts)
	}
	if s := RDWriteOnlyImm.Info().Headers.String(); s != "RDETH|DETH|RETH|ImmDt" {
		t.Errorf("HeaderMask.String %q", s)
	}
	if s := HeaderMask(0).String(); s != "none" {
		t.Errorf("empty HeaderMask %q", s)
	}
	if s := (HdrAETH | 1<<15).String(); s != "AETH|0x8000" {
		t.Errorf("unknown bits %q", s)
	}
	if RCSendOnly.String() != "RC SEND_ONLY" || UDSendOnlyImm.String() != "UD SEND_ONLY_WITH_IMMEDIATE" || CNP.String() != "CNP" {
		t.Error("names")
	}
	// Class flags of a few well-known opcodes.
	if i := RCSendFirst.Info(); !i.IsSend || !i.ConsumesRecvWQE || i.Completes || !i.IsRequest {
		t.Errorf("SEND_FIRST %+v", i)
	}
	if i := RCWriteLastImm.Info(); !i.IsWrite || !i.ConsumesRecvWQE || !i.Completes || !i.HasImm {
		t.Errorf("WRITE_LAST_IMM %+v", i)
	}
	if i := RCReadResponseOnly.Info(); !i.IsReadResponse || i.IsRequest {
		t.Errorf("READ_RESPONSE_ONLY %+v", i)
	}
	if i := RCCompareSwap.Info(); !i.IsAtomic || i.Payload {
		t.Errorf("COMPARE_SWAP %+v", i)
	}
}

// fullSpec returns a spec for op with every header it carries filled with
// distinctive values, and a payload of n bytes if the opcode has one.
func fullSpec(op Opcode, v6, vlan bool, n int) *FrameSpec {
	s := &FrameSpec{
		SrcMAC: [6]byte{2, 0, 0, 0, 0, 0xa}, DstMAC: [6]byte{2, 0, 0, 0, 0, 0xb},
		VLAN: vlan,
		Src:  netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		TrafficClass: 0x68, HopLimit: 64, IPID: 0xbeef, DontFragment: true,
		SrcPort: RXESourcePort(uint32(op) + 17),
		BTH: BTHFields{Opcode: op, Solicited: true, MigReq: true, PKey: 0x8001, FECN: true, BECN: true,
			DestQP: 0xabcdef, AckReq: true, PSN: 0xfedcba},
	}
	if vlan {
		s.VLANID, s.VLANPCP = 0x123, 5
	}
	if v6 {
		s.Src, s.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
		s.FlowLabel = 0xabcde
		s.IPID, s.DontFragment = 0, false
	}
	i := op.Info()
	if i.Headers&HdrRDETH != 0 {
		s.RDETH = &RDETHFields{EEC: 0x123456}
	}
	if i.Headers&HdrDETH != 0 {
		s.DETH = &DETHFields{QKey: 0x80010000, SrcQP: 0x654321}
	}
	if i.Headers&HdrRETH != 0 {
		s.RETH = &RETHFields{VA: 0x0123456789abcdef, RKey: 0xdeadbeef, DMALen: 0x80000000}
	}
	if i.Headers&HdrAtomicETH != 0 {
		s.AtomicETH = &AtomicETHFields{VA: 0x1000, RKey: 0x77, SwapAdd: 0x1111111122222222, Compare: 0x3333333344444444}
	}
	if i.Headers&HdrAETH != 0 {
		s.AETH = &AETHFields{Syndrome: NAKSyndrome(NAKRemoteAccessError), MSN: 0xa5a5a5}
	}
	if i.Headers&HdrAtomicAckETH != 0 {
		s.AtomicAckETH = &AtomicAckETHFields{Orig: 0x5555666677778888}
	}
	if i.Headers&HdrImmDt != 0 {
		s.ImmDt = &ImmDtFields{Imm: 0xcafef00d}
	}
	if i.Headers&HdrIETH != 0 {
		s.IETH = &IETHFields{RKey: 0x0badcafe}
	}
	if i.Headers&HdrFETH != 0 {
		s.FETH = &FETHFields{Placement: 2, Selectivity: 1}
	}
	if i.Headers&HdrXRCETH != 0 {
		s.XRCETH = &XRCETHFields{SRQN: 0x00abcd}
	}
	if i.Payload {
		s.Payload = make([]byte, n)
		for j := range s.Payload {
			s.Payload[j] = byte(j*7 + 1)
		}
	}
	return s
}

// TestBuildParseAllOpcodes builds every defined opcode over IPv4 and IPv6,
// with and without a VLAN tag, and checks Parse recovers every field.
func TestBuildParseAllOpcodes(t *testing.T) {
	buf := make([]byte, 9000)
	defined := 0
	for o := range 256 {
		op := Opcode(o)
		if !op.Valid() {
			continue
		}
		defined++
		for _, v6 := range []bool{false, true} {
			for _, vlan := range []bool{false, true} {
				for _, n := range []int{0, 1, 2, 3, 4, 5, 257} {
					s := fullSpec(op, v6, vlan, n)
					name := fmt.Sprintf("%v/v6=%v/vlan=%v/%d", op, v6, vlan, n)
					fl, err := Build(buf, s)
					if err != nil {
						t.Fatalf("%s: Build: %v", name, err)
					}
					frame := buf[:fl]
					var p Packet
					if err := Parse(frame, &p); err != nil {
						t.Fatalf("%s: Parse: %v", name, err)
					}
					if err := p.VerifyICRC(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					var back FrameSpec
					var st extStore
					specFromPacket(&p, &back, &st)
					back.DstPort = 0 // Build's default
					want := *s
					want.BTH.PadCount = uint8(-len(s.Payload) & 3)
					if got := fmt.Sprintf("%+v", deref(&back)); got != fmt.Sprintf("%+v", deref(&want)) {
						t.Fatalf("%s: round trip\n got %s\nwant %s", name, got, fmt.Sprintf("%+v", deref(&want)))
					}
					if p.Info.Name != op.String() || (p.VLAN != nil) != vlan {
						t.Fatalf("%s: info %q vlan %v", name, p.Info.Name, p.VLAN != nil)
					}
					if !bytes.Equal(p.Payload, s.Payload) || len(p.Pad) != -len(s.Payload)&3 {
						t.Fatalf("%s: payload", name)
					}
					// ParseIB on the UDP payload sees the same IB packet.
					var q Packet
					if err := ParseIB(p.IB, &q); err != nil || q.BTH.Fields() != p.BTH.Fields() || !bytes.Equal(q.Payload, p.Payload) {
						t.Fatalf("%s: ParseIB: %v", name, err)
					}
					// BuildIB writes the same bytes up to the ICRC.
					ib := make([]byte, s.IBLen())
					m, err := BuildIB(ib, s)
					if err != nil || m != len(p.IB) || !bytes.Equal(ib[:m-4], p.IB[:m-4]) || !bytes.Equal(ib[m-4:], []byte{0, 0, 0, 0}) {
						t.Fatalf("%s: BuildIB %d %v", name, m, err)
					}
					if !hasPayload(op) {
						break // payload sizes only matter for payload-bearing opcodes
					}
				}
			}
		}
	}
	if defined != 85 {
		t.Fatalf("%d defined opcodes", defined)
	}
}

func hasPayload(op Opcode) bool { return op.Info().Payload }

// deref renders a FrameSpec with its header pointers followed, for comparison.
func deref(s *FrameSpec) string {
	c := *s
	c.Payload = nil
	c.RDETH, c.DETH, c.RETH, c.AtomicETH, c.AETH, c.AtomicAckETH = nil, nil, nil, nil, nil, nil
	c.ImmDt, c.IETH, c.FETH, c.XRCETH = nil, nil, nil, nil
	out := fmt.Sprintf("%+v payload=%x", struct {
		FrameSpec
		RDETH, DETH, RETH, Atomic, AETH, AtomicAck, ImmDt, IETH, FETH, XRCETH any
	}{
		c, ptrVal(s.RDETH), ptrVal(s.DETH), ptrVal(s.RETH), ptrVal(s.AtomicETH), ptrVal(s.AETH),
		ptrVal(s.AtomicAckETH), ptrVal(s.ImmDt), ptrVal(s.IETH), ptrVal(s.FETH), ptrVal(s.XRCETH),
	}, s.Payload)
	return out
}

func ptrVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestUndefinedOpcodesRejected(t *testing.T) {
	base := fullSpec(RCSendOnly, false, false, 4)
	buf := make([]byte, 256)
	n, err := Build(buf, base)
	if err != nil {
		t.Fatal(err)
	}
	frame := buf[:n]
	undefined := 0
	for o := range 256 {
		op := Opcode(o)
		if op.Valid() {
			continue
		}
		undefined++
		f := bytes.Clone(frame)
		f[42] = uint8(op)
		var p Packet
		err := Parse(f, &p)
		var pe *ParseError
		if !errors.As(err, &pe) || !errors.Is(err, ErrUnsupported) || pe.Layer != "bth" || pe.Offset != 42 {
			t.Errorf("opcode %#x: %v", o, err)
		}
		if err := ParseIB(f[42:], &p); !errors.Is(err, ErrUnsupported) {
			t.Errorf("ParseIB opcode %#x: %v", o, err)
		}
		s := *base
		s.BTH.Opcode = op
		if _, err := Build(buf, &s); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("Build opcode %#x: %v", o, err)
		}
	}
	if undefined != 256-85 {
		t.Fatalf("%d undefined", undefined)
	}
	for _, o := range []Opcode{0x15, 0x18, 0x1e, 0x1f, 0x2c, 0x35, 0x5d, 0x60, 0x63, 0x66, 0x80, 0x82, 0xb5, 0xbc, 0xc0, 0xe0, 0xff} {
		if o.Valid() {
			t.Errorf("%#x should be undefined", uint8(o))
		}
	}
}
