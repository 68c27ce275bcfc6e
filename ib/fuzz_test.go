package ib

import (
	"bytes"
	"errors"
	"testing"
)

// seedFrames returns valid frames of many shapes plus the documented vectors.
func seedFrames(t testing.TB) [][]byte {
	var seeds [][]byte
	for _, h := range []string{vecV1, vecV2, vecV3, vecV4, vecV5, vecCM} {
		seeds = append(seeds, mustHex(t, h))
	}
	for _, op := range []Opcode{RCSendOnly, RCWriteOnlyImm, RCAtomicAck, RCCompareSwap, RCFlush, RDWriteOnlyImm, UDSendOnlyImm, CNP, XRCSendOnlyInv} {
		for _, v6 := range []bool{false, true} {
			seeds = append(seeds, frameFor(t, fullSpec(op, v6, !v6, 7)))
		}
	}
	return seeds
}

// checkParsed asserts the invariants of a successful Parse/ParseIB.
func checkParsed(t *testing.T, p *Packet, in []byte) {
	t.Helper()
	info := p.BTH.Opcode().Info()
	if !info.Valid || p.BTH.TVer() != 0 {
		t.Fatalf("accepted opcode %#x tver %d", uint8(p.BTH.Opcode()), p.BTH.TVer())
	}
	if len(p.IB) != info.HeaderLen+len(p.Payload)+len(p.Pad)+ICRCSize || len(p.ICRC) != ICRCSize {
		t.Fatalf("lengths: ib %d hdr %d payload %d pad %d", len(p.IB), info.HeaderLen, len(p.Payload), len(p.Pad))
	}
	if len(p.Pad) != int(p.BTH.PadCount()) || (!info.Payload && len(p.Payload)+len(p.Pad) != 0) {
		t.Fatalf("pad %d padcount %d", len(p.Pad), p.BTH.PadCount())
	}
	if (p.AETH != nil) != (info.Headers&HdrAETH != 0) || (p.RETH != nil) != (info.Headers&HdrRETH != 0) ||
		(p.DETH != nil) != (info.Headers&HdrDETH != 0) || (p.XRCETH != nil) != (info.Headers&HdrXRCETH != 0) {
		t.Fatal("header views disagree with the opcode table")
	}
	if p.UDP != nil && int(p.UDP.Length()) != UDPSize+len(p.IB) {
		t.Fatalf("UDP length %d, IB %d", p.UDP.Length(), len(p.IB))
	}
	_ = p.VerifyICRC() // must not panic
	_ = p.UDPChecksumValid()
	_ = in
}

func FuzzParse(f *testing.F) {
	for _, s := range seedFrames(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		err := Parse(b, &p)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Offset < 0 || pe.Offset > len(b) {
				t.Fatalf("bad error %v", err)
			}
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error wraps no sentinel: %v", err)
			}
			// The frame-level helpers read DC frames too (their opcodes
			// reuse RD's with another layout): they refuse exactly what
			// neither Parse nor ParseDC accepts.
			var dc Packet
			if ParseDC(b, &dc) != nil && (VerifyFrameICRC(b) == nil || SetFrameICRC(bytes.Clone(b)) == nil) {
				t.Fatal("frame-level ICRC helpers accepted an unparsable frame")
			}
			return
		}
		checkParsed(t, &p, b)
		checkInconsistent(t, b)
		if p.IPv6 != nil && (p.IPv6.Src().Is4In6() || p.IPv6.Dst().Is4In6()) {
			return // Build sends v4-mapped addresses as IPv4, by design
		}
		// Rebuilding from the decoded fields reproduces the datagram up to
		// the ICRC whenever the reserved bits and pad are zero.
		var s FrameSpec
		var st extStore
		specFromPacket(&p, &s, &st)
		buf := make([]byte, s.Len())
		n, err := Build(buf, &s)
		if err != nil {
			t.Fatalf("Build of parsed frame: %v", err)
		}
		var q Packet
		if err := Parse(buf[:n], &q); err != nil {
			t.Fatalf("reparse: %v", err)
		}
		if q.BTH.Fields() != p.BTH.Fields() || !bytes.Equal(q.Payload, p.Payload) {
			t.Fatal("rebuild changed the packet")
		}
		if err := q.VerifyICRC(); err != nil {
			t.Fatal(err)
		}
	})
}

// reparse parses a copy of frame after mutate has edited it through the
// views of a successful Parse, and returns the error.
func reparse(t *testing.T, frame []byte, mutate func(p *Packet, c []byte) []byte) error {
	t.Helper()
	c := bytes.Clone(frame)
	var p Packet
	if err := Parse(c, &p); err != nil {
		t.Fatalf("reparse: %v", err)
	}
	var q Packet
	return Parse(mutate(&p, c), &q)
}

// checkInconsistent derives inconsistent variants of a frame that parsed and
// asserts each is rejected with the specific error.
func checkInconsistent(t *testing.T, frame []byte) {
	t.Helper()
	var p Packet
	if err := Parse(frame, &p); err != nil {
		return
	}
	expect := func(name string, err error, sentinel error, layer string) {
		t.Helper()
		var pe *ParseError
		if !errors.As(err, &pe) || !errors.Is(err, sentinel) || pe.Layer != layer {
			t.Fatalf("%s: got %v, want %v in %s", name, err, sentinel, layer)
		}
	}
	// UDP length one beyond the IP datagram (and beyond the frame's IB bytes).
	err := reparse(t, frame, func(q *Packet, c []byte) []byte {
		q.UDP.SetLength(q.UDP.Length() + 1)
		return c
	})
	expect("UDP length +1", err, ErrMalformed, "udp")
	// UDP length shorter than the IP datagram.
	err = reparse(t, frame, func(q *Packet, c []byte) []byte {
		q.UDP.SetLength(q.UDP.Length() - 1)
		return c
	})
	expect("UDP length -1", err, ErrMalformed, "udp")
	// Pad count beyond payload+pad.
	if rest := len(p.Payload) + len(p.Pad); rest < 3 && p.Info.Payload {
		err = reparse(t, frame, func(q *Packet, c []byte) []byte {
			q.BTH.SetPadCount(uint8(rest + 1))
			return c
		})
		expect("pad beyond payload", err, ErrMalformed, "bth")
	}
	// The opcode's last extended header cut short (lengths kept consistent).
	if hl := p.Info.HeaderLen; hl > BTHSize {
		last := HeaderMask(0)
		for _, h := range HeaderOrder() {
			if p.Info.Headers&h != 0 {
				last = h
			}
		}
		err = reparse(t, frame, func(q *Packet, c []byte) []byte {
			return cutFrameIB(q, c, hl-1)
		})
		expect("header cut short", err, ErrTruncated, last.Layer())
	}
}

// cutFrameIB returns frame (which q views) cut so that its IB packet is n
// bytes, with the IP and UDP lengths rewritten to match.
func cutFrameIB(q *Packet, frame []byte, n int) []byte {
	delta := n - len(q.IB)
	q.UDP.SetLength(uint16(int(q.UDP.Length()) + delta))
	if q.IPv4 != nil {
		q.IPv4.SetTotalLength(uint16(int(q.IPv4.TotalLength()) + delta))
		q.IPv4.UpdateChecksum()
	} else {
		q.IPv6.SetPayloadLength(uint16(int(q.IPv6.PayloadLength()) + delta))
	}
	ibStart := EthernetSize + len(q.VLAN) + len(q.IPv4) + len(q.IPv6) + UDPSize
	return frame[:ibStart+n]
}

func FuzzParseIB(f *testing.F) {
	for _, s := range seedFrames(f) {
		var p Packet
		if Parse(s, &p) == nil {
			f.Add(bytes.Clone(p.IB))
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 15))
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := ParseIB(b, &p); err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Offset < 0 || pe.Offset > len(b) {
				t.Fatalf("bad error %v", err)
			}
			return
		}
		checkParsed(t, &p, b)
		if p.IPv4 != nil || p.IPv6 != nil || p.UDP != nil {
			t.Fatal("ParseIB set encapsulation views")
		}
		var q Packet
		var pe *ParseError
		if hl := p.Info.HeaderLen; hl > BTHSize {
			err := ParseIB(b[:hl-1], &q)
			if !errors.As(err, &pe) || !errors.Is(err, ErrTruncated) || pe.Layer == "bth" || pe.Offset >= hl {
				t.Fatalf("header cut short: %v", err)
			}
		}
		if rest := len(p.Payload) + len(p.Pad); rest < 3 && p.Info.Payload {
			c := bytes.Clone(b)
			BTH(c).SetPadCount(uint8(rest + 1))
			if err := ParseIB(c, &q); !errors.As(err, &pe) || !errors.Is(err, ErrMalformed) || pe.Layer != "bth" {
				t.Fatalf("pad beyond payload: %v", err)
			}
		}
	})
}

// FuzzHeaderViews decodes arbitrary bytes with every checked header
// constructor and Fields, and checks Encode(Fields) reproduces the
// non-reserved bits.
func FuzzHeaderViews(f *testing.F) {
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 40))
	f.Add(mustHex(f, vecV2)[14:])
	f.Fuzz(func(t *testing.T, b []byte) {
		type dec struct {
			name string
			size int
			run  func([]byte) ([]byte, error)
		}
		decs := []dec{
			{"bth", BTHSize, func(b []byte) ([]byte, error) {
				v, err := ParseBTH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, BTHSize)
				BTH(out).Encode(&f)
				return out, nil
			}},
			{"rdeth", RDETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseRDETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, RDETHSize)
				RDETH(out).Encode(&f)
				return out, nil
			}},
			{"deth", DETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseDETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, DETHSize)
				DETH(out).Encode(&f)
				return out, nil
			}},
			{"reth", RETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseRETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, RETHSize)
				RETH(out).Encode(&f)
				return out, nil
			}},
			{"atomiceth", AtomicETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseAtomicETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, AtomicETHSize)
				AtomicETH(out).Encode(&f)
				return out, nil
			}},
			{"aeth", AETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseAETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, AETHSize)
				AETH(out).Encode(&f)
				return out, nil
			}},
			{"atomicacketh", AtomicAckETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseAtomicAckETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, AtomicAckETHSize)
				AtomicAckETH(out).Encode(&f)
				return out, nil
			}},
			{"immdt", ImmDtSize, func(b []byte) ([]byte, error) {
				v, err := ParseImmDt(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, ImmDtSize)
				ImmDt(out).Encode(&f)
				return out, nil
			}},
			{"ieth", IETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseIETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, IETHSize)
				IETH(out).Encode(&f)
				return out, nil
			}},
			{"feth", FETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseFETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, FETHSize)
				FETH(out).Encode(&f)
				return out, nil
			}},
			{"xrceth", XRCETHSize, func(b []byte) ([]byte, error) {
				v, err := ParseXRCETH(b)
				if err != nil {
					return nil, err
				}
				f := v.Fields()
				out := make([]byte, XRCETHSize)
				XRCETH(out).Encode(&f)
				return out, nil
			}},
		}
		// reserved returns the bits Encode zeroes for each header.
		reserved := map[string][]byte{
			"bth":    {0, 0, 0, 0, 0x3f, 0, 0, 0, 0x7f, 0, 0, 0},
			"rdeth":  {0xff, 0, 0, 0},
			"deth":   {0, 0, 0, 0, 0xff, 0, 0, 0},
			"feth":   {0xff, 0xff, 0xff, 0xc0},
			"xrceth": {0xff, 0, 0, 0},
		}
		for _, d := range decs {
			out, err := d.run(b)
			if len(b) < d.size {
				var pe *ParseError
				if !errors.As(err, &pe) || !errors.Is(err, ErrTruncated) || pe.Layer != d.name {
					t.Fatalf("%s: short input gave %v", d.name, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", d.name, err)
			}
			for i := 0; i < d.size; i++ {
				var m byte
				if r := reserved[d.name]; r != nil {
					m = r[i]
				}
				if out[i] != b[i]&^m {
					t.Fatalf("%s: byte %d: %#x -> %#x", d.name, i, b[i], out[i])
				}
			}
		}
		// Fields of short encapsulation views must not panic.
		_ = Ethernet(b).Fields()
		_ = VLANTag(b).Fields()
		_ = IPv4(b).Fields()
		_ = IPv6(b).Fields()
		_ = UDP(b).Fields()
		_ = BTH(b).Fields()
		_ = AtomicETH(b).Fields()
	})
}

// FuzzBuildParse builds a frame from fuzzed fields and checks Parse gives
// them back and the ICRC verifies.
func FuzzBuildParse(f *testing.F) {
	f.Add(uint8(RCSendOnly), false, false, uint32(0x12), uint32(1), uint64(0), uint32(0), []byte("Hello, RoCEv2!"))
	f.Add(uint8(RCWriteOnlyImm), true, true, uint32(0xffffff), uint32(0xffffff), uint64(1<<63), uint32(7), []byte{1, 2, 3})
	f.Add(uint8(RCAtomicAck), false, true, uint32(1), uint32(0), uint64(42), uint32(0x1f), []byte(nil))
	f.Add(uint8(0x15), false, false, uint32(1), uint32(1), uint64(0), uint32(0), []byte(nil))
	f.Fuzz(func(t *testing.T, op uint8, v6, vlan bool, qp, psn uint32, x uint64, y uint32, payload []byte) {
		s := fullSpec(Opcode(op), v6, vlan, 0)
		s.BTH.DestQP, s.BTH.PSN = qp, PSN(psn)
		s.Payload = payload
		if s.RETH != nil {
			s.RETH.VA, s.RETH.DMALen = x, y
		}
		if s.AETH != nil {
			s.AETH.Syndrome, s.AETH.MSN = Syndrome(y), uint32(x)&mask24
		}
		if s.AtomicETH != nil {
			s.AtomicETH.SwapAdd, s.AtomicETH.Compare = x, ^x
		}
		if s.ImmDt != nil {
			s.ImmDt.Imm = y
		}
		s.IPID = uint16(y)
		buf := make([]byte, 2048+len(payload))
		n, err := Build(buf, s)
		info := Opcode(op).Info()
		shouldFail := !info.Valid || qp > mask24 || psn > mask24 || (!info.Payload && len(payload) > 0)
		if shouldFail {
			if err == nil {
				t.Fatal("Build accepted an invalid spec")
			}
			return
		}
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		var p Packet
		if err := Parse(buf[:n], &p); err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if err := p.VerifyICRC(); err != nil {
			t.Fatal(err)
		}
		if p.BTH.DestQP() != qp || p.BTH.PSN() != PSN(psn) || p.BTH.Opcode() != Opcode(op) || !bytes.Equal(p.Payload, payload) {
			t.Fatalf("round trip: %+v", p.BTH.Fields())
		}
		if s.RETH != nil && p.RETH.Fields() != *s.RETH {
			t.Fatal("RETH")
		}
		if s.AETH != nil && p.AETH.Fields() != *s.AETH {
			t.Fatal("AETH")
		}
		if v6 != (p.IPv6 != nil) || vlan != (p.VLAN != nil) {
			t.Fatal("encapsulation")
		}
		if !v6 && (p.IPv4.ID() != uint16(y) || !p.IPv4.ChecksumValid()) {
			t.Fatal("IPv4")
		}
		// Corrupting any covered byte of the IB packet breaks the ICRC.
		if len(p.IB) > 0 {
			i := int(y) % len(p.IB)
			if i != 4 { // BTH byte 4 is masked
				p.IB[i] ^= 0x01
				if err := p.VerifyICRC(); !errors.Is(err, ErrBadICRC) {
					t.Fatalf("flip IB byte %d: %v", i, err)
				}
			}
		}
	})
}

// FuzzICRC checks ICRC never panics on arbitrary header/payload lengths and
// agrees with a straightforward masked CRC-32 over a copy.
func FuzzICRC(f *testing.F) {
	v1 := mustHex(f, vecV1)
	f.Add(v1[14:34], v1[34:70])
	v2 := mustHex(f, vecV2)
	f.Add(v2[14:54], v2[54:98])
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ip, rest []byte) {
		got := ICRC(ip, rest)
		if want := plainICRC(ip, rest); got != want {
			t.Fatalf("ICRC %#x, reference %#x", got, want)
		}
		for _, k := range []int{0, len(rest) / 3, min(len(rest), UDPSize), len(rest)} {
			if s := ICRCSplit(ip, rest[:k], rest[k:]); s != got {
				t.Fatalf("ICRCSplit at %d: %#x, ICRC %#x", k, s, got)
			}
		}
	})
}
