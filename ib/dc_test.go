package ib

import (
	"errors"
	"testing"
)

func TestDCHeadersRoundTrip(t *testing.T) {
	var b [DCETHSize]byte
	DCETH(b[:]).Encode(&DCETHFields{Key: 0x00000000ffeeddcc})
	if f := DCETH(b[:]).Fields(); f.Key != 0xffeeddcc {
		t.Fatalf("DCETH %+v", f)
	}
	for i := range b {
		b[i] = 0xFF
	}
	DCETH(b[:]).Encode(&DCETHFields{DCTN: 0x123456})
	if f := DCETH(b[:]).Fields(); f.DCTN != 0x123456 || f.Key != 0x0012345600000000 {
		t.Fatalf("DCETH %+v % x", f, b)
	}
	var c [DCCETHSize]byte
	for i := range c {
		c[i] = 0xFF
	}
	DCCETH(c[:]).Encode(&DCCETHFields{Flags: DCCDisconnect, DCI: 0xabcdef, Conn: 0x000102})
	if f := DCCETH(c[:]).Fields(); f.Flags != DCCDisconnect || f.DCI != 0xabcdef || f.Conn != 0x102 {
		t.Fatalf("DCCETH %+v", f)
	}
	if c[4] != 0 {
		t.Fatalf("reserved byte not cleared: % x", c)
	}
	for _, x := range c[8:] {
		if x != 0 {
			t.Fatalf("reserved bytes not cleared: % x", c)
		}
	}
	if _, err := ParseDCETH(b[:7]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short DCETH: %v", err)
	}
	if _, err := ParseDCCETH(c[:15]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("short DCCETH: %v", err)
	}
	if DCETH(nil).Fields() != (DCETHFields{}) || DCCETH(nil).Fields() != (DCCETHFields{}) {
		t.Fatal("short views must read as zero-padded")
	}
}

func TestDCOpcodeTable(t *testing.T) {
	cases := []struct {
		op  Opcode
		hdr HeaderMask
		len int
	}{
		{DCSendOnly, HdrDCETH | HdrRDETH | HdrDETH, 32},
		{DCSendOnlyImm, HdrDCETH | HdrRDETH | HdrDETH | HdrImmDt, 36},
		{DCWriteOnlyImm, HdrDCETH | HdrRDETH | HdrDETH | HdrRETH | HdrImmDt, 52},
		{DCReadRequest, HdrDCETH | HdrRDETH | HdrDETH | HdrRETH, 48},
		{DCReadResponseMiddle, HdrDCETH | HdrRDETH, 24},
		{DCAck, HdrDCETH | HdrRDETH | HdrAETH, 28},
		{DCAtomicAck, HdrDCETH | HdrRDETH | HdrAETH | HdrAtomicAckETH, 36},
		{DCFetchAdd, HdrDCETH | HdrRDETH | HdrDETH | HdrAtomicETH, 60},
		{DCConnect, HdrDCETH | HdrDCCETH, 36},
	}
	for _, c := range cases {
		i := DCInfo(c.op)
		if !i.Valid || i.Headers != c.hdr || i.HeaderLen != c.len || i.Offset(HdrDCETH) != BTHSize {
			t.Errorf("%#x: %+v", uint8(c.op), i)
		}
		if i.Name[:3] != "DC " {
			t.Errorf("%#x name %q", uint8(c.op), i.Name)
		}
	}
	// Outside the RD space the profile is the standard table; inside, the
	// IBTA-only operations are undefined.
	if DCInfo(RCSendOnly).Name != RCSendOnly.Info().Name || DCInfo(RDFlush).Valid || DCInfo(0x56).Valid {
		t.Fatal("DC profile table")
	}
	if s := (HdrDCETH | HdrDCCETH | HdrRETH).String(); s != "DCETH|DCCETH|RETH" {
		t.Fatalf("String %q", s)
	}
}

// dcPacket builds a DC IB packet (BTH … ICRC placeholder) of op.
func dcPacket(op Opcode, payload int) []byte {
	info := DCInfo(op)
	b := make([]byte, info.HeaderLen+payload+(-payload&3)+ICRCSize)
	BTH(b).Encode(&BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: 0x42, PSN: 9, PadCount: uint8(-payload & 3)})
	DCETH(b[BTHSize:]).Encode(&DCETHFields{Key: 0xffeeddcc})
	if info.Headers&HdrDCCETH != 0 {
		DCCETH(b[info.Offset(HdrDCCETH):]).Encode(&DCCETHFields{DCI: 0x77, Conn: 1})
	}
	if info.Headers&HdrRDETH != 0 {
		RDETH(b[info.Offset(HdrRDETH):]).Encode(&RDETHFields{EEC: 1})
	}
	if info.Headers&HdrDETH != 0 {
		DETH(b[info.Offset(HdrDETH):]).Encode(&DETHFields{SrcQP: 0x77})
	}
	return b
}

func TestParseDCIB(t *testing.T) {
	var p Packet
	for _, op := range []Opcode{DCSendOnly, DCWriteOnlyImm, DCReadRequest, DCAck, DCAtomicAck, DCCompareSwap, DCConnect} {
		n := 0
		if DCInfo(op).Payload {
			n = 5
		}
		b := dcPacket(op, n)
		if err := ParseDCIB(b, &p); err != nil {
			t.Fatalf("%#x: %v", uint8(op), err)
		}
		if p.DCETH.Key() != 0xffeeddcc || len(p.Payload) != n || p.Info.Name != DCInfo(op).Name {
			t.Fatalf("%#x: %+v", uint8(op), p.DCETH.Fields())
		}
		if (p.DCCETH != nil) != (op == DCConnect) || (op == DCConnect && p.DCCETH.DCI() != 0x77) {
			t.Fatalf("%#x: DCCETH %v", uint8(op), p.DCCETH)
		}
		if (p.RDETH != nil) != (op != DCConnect) || (p.DETH != nil) != (DCInfo(op).IsRequest && op != DCConnect) {
			t.Fatalf("%#x: RDETH %v DETH %v", uint8(op), p.RDETH, p.DETH)
		}
		if (p.RETH != nil) != (DCInfo(op).Headers&HdrRETH != 0) {
			t.Fatalf("%#x: RETH", uint8(op))
		}
		// Cut into the headers: truncated, never a panic.
		if err := ParseDCIB(b[:DCInfo(op).HeaderLen-1], &p); !errors.Is(err, ErrTruncated) {
			t.Fatalf("%#x cut: %v", uint8(op), err)
		}
	}
	// A CONNECT with payload is malformed.
	b := append(dcPacket(DCConnect, 0), 0, 0, 0, 0)
	if err := ParseDCIB(b, &p); !errors.Is(err, ErrMalformed) {
		t.Fatalf("connect with payload: %v", err)
	}
	// The standard parser keeps reading the RD space as RD.
	if err := ParseIB(dcPacket(DCSendOnly, 8), &p); err != nil || p.DCETH != nil || p.RDETH == nil || p.Info.Name != "RD SEND_ONLY" {
		t.Fatalf("ParseIB of the RD space: %v", err)
	}
}

func TestParseDCFrame(t *testing.T) {
	// Wrap a DC packet in a frame: an RC SEND_ONLY of 16 bytes has the IB
	// length of a DC ACK (BTH, DCETH, RDETH, AETH), so replace its IB part.
	spec := fullSpec(RCSendOnly, false, false, 16)
	frame := frameFor(t, spec)
	ibOff := len(frame) - spec.IBLen()
	dc := dcPacket(DCAck, 0)
	copy(frame[ibOff:], dc)
	if err := SetFrameICRC(frame); err != nil {
		t.Fatal(err)
	}
	var p Packet
	if err := ParseDC(frame, &p); err != nil {
		t.Fatal(err)
	}
	if p.Info.Name != "DC ACKNOWLEDGE" || p.VerifyICRC() != nil || VerifyFrameICRC(frame) != nil {
		t.Fatalf("%s %v", p.Info.Name, p.VerifyICRC())
	}
	if a := testing.AllocsPerRun(100, func() { _ = ParseDC(frame, &p) }); a != 0 {
		t.Fatalf("ParseDC allocates %v", a)
	}
}

func FuzzParseDC(f *testing.F) {
	for _, op := range []Opcode{DCSendFirst, DCSendLastImm, DCWriteOnlyImm, DCReadRequest, DCReadResponseFirst, DCAck, DCAtomicAck, DCFetchAdd, DCConnect} {
		f.Add(dcPacket(op, 3))
		f.Add(dcPacket(op, 0))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := ParseDCIB(b, &p); err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Offset < 0 || pe.Offset > len(b) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		info := p.Info
		if !info.Valid || len(p.IB) != info.HeaderLen+len(p.Payload)+len(p.Pad)+ICRCSize {
			t.Fatalf("lengths")
		}
		dc := p.BTH.Opcode().Transport() == TransportDC
		if dc != (p.DCETH != nil) || (p.DCCETH != nil) != (p.BTH.Opcode() == DCConnect) || (dc && (p.RDETH != nil) == (p.DCCETH != nil)) {
			t.Fatalf("DC views disagree with the opcode %#x", uint8(p.BTH.Opcode()))
		}
		_ = p.DCETH.Fields()
		_ = p.DCCETH.Fields()
	})
}
