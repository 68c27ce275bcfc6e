package ib

import (
	"fmt"
	"testing"
)

var benchSizes = []int{64, 1024, 4096}

// benchSpec is an RC RDMA WRITE ONLY over IPv4 carrying n payload bytes.
func benchSpec(n int) *FrameSpec {
	s := fullSpec(RCWriteOnly, false, false, n)
	return s
}

func BenchmarkParse(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("%dB", n), func(b *testing.B) {
			frame := frameFor(b, benchSpec(n))
			var p Packet
			b.ReportAllocs()
			b.SetBytes(int64(len(frame)))
			for b.Loop() {
				if err := Parse(frame, &p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("%dB", n), func(b *testing.B) {
			s := benchSpec(n)
			buf := make([]byte, s.Len())
			b.ReportAllocs()
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := Build(buf, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkICRC measures verifying the ICRC of a parsed packet.
func BenchmarkICRC(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("%dB", n), func(b *testing.B) {
			frame := frameFor(b, benchSpec(n))
			var p Packet
			if err := Parse(frame, &p); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(p.datagram)))
			for b.Loop() {
				if err := p.VerifyICRC(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestZeroAllocs guards the data path: parsing, building, ICRC checks and
// rejecting a bad frame allocate nothing.
func TestZeroAllocs(t *testing.T) {
	s := benchSpec(1024)
	frame := frameFor(t, s)
	buf := make([]byte, s.Len())
	bad := cutIB(frameFor(t, fullSpec(RCWriteOnly, false, false, 0)), 16)
	var p Packet
	checks := []struct {
		name string
		fn   func()
	}{
		{"Parse", func() {
			if Parse(frame, &p) != nil {
				t.Fatal("parse")
			}
		}},
		{"Parse error path", func() {
			if Parse(bad, &p) == nil {
				t.Fatal("accepted")
			}
		}},
		{"ParseIB", func() {
			if ParseIB(frame[42:], &p) != nil {
				t.Fatal("parseIB")
			}
		}},
		{"Build", func() {
			if _, err := Build(buf, s); err != nil {
				t.Fatal(err)
			}
		}},
		{"Build error path", func() {
			if _, err := Build(buf[:10], s); err == nil {
				t.Fatal("accepted")
			}
		}},
		{"BuildIB", func() {
			if _, err := BuildIB(buf, s); err != nil {
				t.Fatal(err)
			}
		}},
		{"VerifyICRC", func() {
			if Parse(frame, &p) != nil || p.VerifyICRC() != nil {
				t.Fatal("icrc")
			}
		}},
		{"VerifyFrameICRC", func() {
			if VerifyFrameICRC(frame) != nil {
				t.Fatal("icrc")
			}
		}},
		{"SetFrameICRC", func() {
			if SetFrameICRC(frame) != nil {
				t.Fatal("icrc")
			}
		}},
		{"ICRC", func() { _ = ICRC(frame[14:34], frame[34:len(frame)-4]) }},
		{"ICRCSplit", func() { _ = ICRCSplit(frame[14:34], frame[34:42], frame[42:len(frame)-4]) }},
		{"Fields", func() { _ = p.BTH.Fields(); _ = p.RETH.Fields(); _ = p.IPv4.Fields() }},
	}
	for _, c := range checks {
		if n := testing.AllocsPerRun(100, c.fn); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", c.name, n)
		}
	}
}

// BenchmarkParseDCIB decodes the IB packets a device receives most: the
// middle and first packets of an RDMA WRITE and the ACKs.
func BenchmarkParseDCIB(b *testing.B) {
	for _, op := range []Opcode{RCWriteMiddle, RCWriteFirst, RCAck} {
		b.Run(op.String(), func(b *testing.B) {
			n := 0
			if DCInfo(op).Payload {
				n = 1024
			}
			frame := frameFor(b, fullSpec(op, false, false, n))
			var p Packet
			b.ReportAllocs()
			for b.Loop() {
				if err := ParseDCIB(frame[42:], &p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkICRCHeaders is the ICRC of packets as a sender seals them: the
// masked IPv4 or IPv6, UDP and BTH headers, then a payload.
func BenchmarkICRCHeaders(b *testing.B) {
	for _, v6 := range []bool{false, true} {
		for _, n := range []int{0, 4096} {
			b.Run(fmt.Sprintf("v6=%v/%dB", v6, n), func(b *testing.B) {
				frame := frameFor(b, fullSpec(RCWriteMiddle, v6, false, n))
				ip := IPv4Size
				if v6 {
					ip = IPv6Size
				}
				h, rest := frame[EthernetSize:EthernetSize+ip], frame[EthernetSize+ip:len(frame)-ICRCSize]
				b.ReportAllocs()
				for b.Loop() {
					_ = ICRC(h, rest)
				}
			})
		}
	}
}
