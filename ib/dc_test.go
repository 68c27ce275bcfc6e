package ib

import (
	"errors"
	"testing"
)

func TestDCHeadersRoundTrip(t *testing.T) {
	var b [DCETHSize]byte
	for i := range b {
		b[i] = 0xFF
	}
	DCETH(b[:]).Encode(&DCETHFields{Gen: 7, SrcQP: 0x123456})
	if f := DCETH(b[:]).Fields(); f.Gen != 7 || f.SrcQP != 0x123456 || b[4]|b[5]|b[6]|b[7] != 0 {
		t.Fatalf("DCETH %+v % x", f, b)
	}
	var c [DCCETHSize]byte
	for i := range c {
		c[i] = 0xFF
	}
	DCCETH(c[:]).Encode(&DCCETHFields{Key: 0x00000000ffeeddcc, Flags: DCCDisconnect})
	if f := DCCETH(c[:]).Fields(); f.Key != 0xffeeddcc || f.Flags != DCCDisconnect {
		t.Fatalf("DCCETH %+v", f)
	}
	for _, x := range c[9:] {
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
	if DCETH(nil).Fields() != (DCETHFields{}) || DCCETH(nil).Fields().Key != 0 {
		t.Fatal("short views must read as zero-padded")
	}
}

func TestDCOpcodeTable(t *testing.T) {
	cases := []struct {
		op  Opcode
		hdr HeaderMask
		len int
	}{
		{DCSendOnly, HdrDCETH, 20},
		{DCSendOnlyImm, HdrDCETH | HdrImmDt, 24},
		{DCWriteOnlyImm, HdrDCETH | HdrRETH | HdrImmDt, 40},
		{DCReadRequest, HdrDCETH | HdrRETH, 36},
		{DCReadResponseMiddle, HdrDCETH, 20},
		{DCAck, HdrDCETH | HdrAETH, 24},
		{DCAtomicAck, HdrDCETH | HdrAETH | HdrAtomicAckETH, 32},
		{DCFetchAdd, HdrDCETH | HdrAtomicETH, 48},
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
	DCETH(b[BTHSize:]).Encode(&DCETHFields{Gen: 1, SrcQP: 0x77})
	if info.Headers&HdrDCCETH != 0 {
		DCCETH(b[BTHSize+DCETHSize:]).Encode(&DCCETHFields{Key: 0xffeeddcc})
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
		if p.DCETH.SrcQP() != 0x77 || p.DCETH.Gen() != 1 || len(p.Payload) != n || p.Info.Name != DCInfo(op).Name {
			t.Fatalf("%#x: %+v", uint8(op), p.DCETH.Fields())
		}
		if (p.DCCETH != nil) != (op == DCConnect) || (op == DCConnect && p.DCCETH.Key() != 0xffeeddcc) {
			t.Fatalf("%#x: DCCETH %v", uint8(op), p.DCCETH)
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
	if err := ParseIB(dcPacket(DCSendOnly, 8), &p); err != nil || p.DCETH != nil || p.RDETH == nil {
		t.Fatalf("ParseIB of the RD space: %v", err)
	}
}

func TestParseDCFrame(t *testing.T) {
	// Wrap a DC packet in a frame: an RC SEND_ONLY of 12 bytes has the IB
	// length of a DC ACK (BTH, DCETH, AETH), so replace its IB part.
	spec := fullSpec(RCSendOnly, false, false, 12)
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
		if dc != (p.DCETH != nil) || (p.DCCETH != nil) != (p.BTH.Opcode() == DCConnect) || p.RDETH != nil {
			t.Fatalf("DC views disagree with the opcode %#x", uint8(p.BTH.Opcode()))
		}
		_ = p.DCETH.Fields()
		_ = p.DCCETH.Fields()
	})
}
