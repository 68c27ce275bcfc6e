package ib

import (
	"encoding/binary"
	"errors"
	"testing"
)

// frameFor builds a frame for tests that mutate it.
func frameFor(t testing.TB, s *FrameSpec) []byte {
	t.Helper()
	buf := make([]byte, s.Len())
	n, err := Build(buf, s)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// setLens rewrites the UDP length and the IPv4 total length of an untagged
// IPv4 frame, fixing the IPv4 checksum.
func setLens(f []byte, udpLen int, ipLen int) {
	binary.BigEndian.PutUint16(f[14+2:], uint16(ipLen))
	IPv4(f[14:34]).UpdateChecksum()
	binary.BigEndian.PutUint16(f[34+4:], uint16(udpLen))
}

// cutIB returns a copy of an untagged IPv4 frame cut to ibLen bytes of IB
// packet, with consistent IP and UDP lengths.
func cutIB(f []byte, ibLen int) []byte {
	b := append([]byte(nil), f[:42+ibLen]...)
	setLens(b, 8+ibLen, 28+ibLen)
	return b
}

func TestParseErrors(t *testing.T) {
	send := frameFor(t, fullSpec(RCSendOnly, false, false, 5)) // 14+20+8+12+5+3+4 = 66
	send6 := frameFor(t, fullSpec(RCSendOnly, true, false, 5))
	vlan := frameFor(t, fullSpec(RCSendOnly, false, true, 5))
	write := frameFor(t, fullSpec(RCWriteOnly, false, false, 0)) // 14+20+8+28+4 = 74
	ack := frameFor(t, fullSpec(RCAck, false, false, 0))         // 62
	const ip, udp, bth = 14, 34, 42

	type tc struct {
		name   string
		frame  []byte
		layer  string
		offset int
		err    error
	}
	mut := func(f []byte, fn func(b []byte)) []byte {
		b := append([]byte(nil), f...)
		fn(b)
		return b
	}
	cases := []tc{
		{"empty", nil, "ethernet", 0, ErrTruncated},
		{"short ethernet", send[:13], "ethernet", 0, ErrTruncated},
		{"arp", mut(send, func(b []byte) { b[12], b[13] = 0x08, 0x06 }), "ethernet", 12, ErrUnsupported},
		{"roce v1 ethertype", mut(send, func(b []byte) { b[12], b[13] = 0x89, 0x15 }), "ethernet", 12, ErrUnsupported},
		{"short vlan", vlan[:16], "vlan", 14, ErrTruncated},
		{"stacked vlan", mut(vlan, func(b []byte) { b[16], b[17] = 0x81, 0x00 }), "vlan", 16, ErrUnsupported},
		{"vlan inner arp", mut(vlan, func(b []byte) { b[16], b[17] = 0x08, 0x06 }), "vlan", 16, ErrUnsupported},
		{"short ipv4", send[:33], "ipv4", ip, ErrTruncated},
		{"ipv4 version", mut(send, func(b []byte) { b[ip] = 0x65 }), "ipv4", ip, ErrMalformed},
		{"ipv4 IHL 4", mut(send, func(b []byte) { b[ip] = 0x44 }), "ipv4", ip, ErrMalformed},
		{"ipv4 options", mut(send, func(b []byte) { b[ip] = 0x46 }), "ipv4", ip, ErrUnsupported},
		{"ipv4 total length small", mut(send, func(b []byte) { setLens(b, 8, 27) }), "ipv4", ip + 2, ErrMalformed},
		{"ipv4 total length beyond frame", mut(send, func(b []byte) { setLens(b, 33, 53) }), "ipv4", ip + 2, ErrTruncated},
		{"frame cut inside IB", send[:60], "ipv4", ip + 2, ErrTruncated},
		{"ipv4 fragment MF", mut(send, func(b []byte) { b[ip+6] |= 0x20 }), "ipv4", ip + 6, ErrUnsupported},
		{"ipv4 fragment offset", mut(send, func(b []byte) { b[ip+7] = 1 }), "ipv4", ip + 6, ErrUnsupported},
		{"ipv4 tcp", mut(send, func(b []byte) { b[ip+9] = 6 }), "ipv4", ip + 9, ErrUnsupported},
		{"short ipv6", send6[:50], "ipv6", ip, ErrTruncated},
		{"ipv6 version", mut(send6, func(b []byte) { b[ip] = 0x40 }), "ipv6", ip, ErrMalformed},
		{"ipv6 ext header", mut(send6, func(b []byte) { b[ip+6] = 0 }), "ipv6", ip + 6, ErrUnsupported},
		{"ipv6 payload length small", mut(send6, func(b []byte) { binary.BigEndian.PutUint16(b[ip+4:], 7) }), "ipv6", ip + 4, ErrMalformed},
		{"ipv6 payload length beyond frame", mut(send6, func(b []byte) { binary.BigEndian.PutUint16(b[ip+4:], 1000) }), "ipv6", ip + 4, ErrTruncated},
		{"udp wrong dst port", mut(send, func(b []byte) { b[udp+3]++ }), "udp", udp + 2, ErrUnsupported},
		{"udp length below 8", mut(send, func(b []byte) { setLens(b, 7, 52) }), "udp", udp + 4, ErrMalformed},
		{"udp length beyond IP datagram", mut(send, func(b []byte) { setLens(b, 33, 52) }), "udp", udp + 4, ErrMalformed},
		{"udp length short of IP datagram", mut(send, func(b []byte) { setLens(b, 31, 52) }), "udp", udp + 4, ErrMalformed},
		{"udp length beyond frame", mut(send, func(b []byte) { b[udp+4], b[udp+5] = 0xff, 0xff }), "udp", udp + 4, ErrMalformed},
		{"ib shorter than bth", cutIB(send, 11), "bth", bth, ErrTruncated},
		{"bad tver", mut(send, func(b []byte) { b[bth+1] |= 1 }), "bth", bth + 1, ErrUnsupported},
		{"undefined opcode", mut(send, func(b []byte) { b[bth] = 0x15 }), "bth", bth, ErrUnsupported},
		{"opcode without room for RETH", cutIB(write, 16), "reth", bth + 12, ErrTruncated},
		{"opcode without room for AETH", cutIB(mut(send, func(b []byte) { b[bth] = uint8(RCReadResponseFirst) }), 14), "aeth", bth + 12, ErrTruncated},
		{"no room for ICRC", cutIB(ack, 19), "icrc", bth + 16, ErrTruncated},
		{"pad count beyond payload", cutIB(mut(send, func(b []byte) { b[bth+1] |= 0x30 }), 18), "bth", bth + 1, ErrMalformed},
		{"ack with payload", mut(send, func(b []byte) { b[bth] = uint8(RCAck); b[bth+1] &^= 0x30 }), "payload", bth + 16, ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p Packet
			p.BTH = BTH(make([]byte, 12)) // stale state must be cleared
			err := Parse(c.frame, &p)
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("got %v, want *ParseError", err)
			}
			if !errors.Is(err, c.err) || pe.Layer != c.layer || pe.Offset != c.offset {
				t.Fatalf("got %v (layer %q offset %d), want %v at %s/%d", err, pe.Layer, pe.Offset, c.err, c.layer, c.offset)
			}
			if p.BTH != nil || p.Eth != nil {
				t.Fatal("packet not reset on error")
			}
			if pe.Error() == "" {
				t.Fatal("empty message")
			}
		})
	}
	// A returned error stays valid after a later successful Parse.
	{
		var p Packet
		err := Parse(send[:20], &p)
		if err := Parse(send, &p); err != nil {
			t.Fatal(err)
		}
		var pe *ParseError
		if !errors.Is(err, ErrTruncated) || !errors.As(err, &pe) || pe.Layer != "ipv4" {
			t.Fatalf("stale error %v", err)
		}
	}
	// Trailing bytes after the IP datagram (Ethernet padding) are ignored.
	padded := append(append([]byte(nil), ack...), 0, 0, 0, 0)
	var p Packet
	if err := Parse(padded, &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); err != nil {
		t.Fatal(err)
	}
	// ParseIB offsets are relative to the IB packet.
	err := ParseIB(write[bth:74-16], &p)
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Layer != "reth" || pe.Offset != 12 || !errors.Is(err, ErrTruncated) {
		t.Fatalf("ParseIB: %v", err)
	}
	if err := p.VerifyICRC(); err == nil {
		t.Fatal("VerifyICRC without IP header succeeded")
	}
	if err := ParseIB(ack[bth:], &p); err != nil {
		t.Fatal(err)
	}
	if err := p.VerifyICRC(); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("VerifyICRC after ParseIB: %v", err)
	}
}

func TestBuildErrors(t *testing.T) {
	buf := make([]byte, 70000)
	base := fullSpec(RCWriteOnly, false, false, 8)
	cases := []struct {
		name string
		mod  func(s *FrameSpec)
		err  error
	}{
		{"missing RETH", func(s *FrameSpec) { s.RETH = nil }, ErrInvalidSpec},
		{"unwanted AETH", func(s *FrameSpec) { s.AETH = &AETHFields{} }, ErrInvalidSpec},
		{"undefined opcode", func(s *FrameSpec) { s.BTH.Opcode = 0x15 }, ErrInvalidSpec},
		{"payload on read request", func(s *FrameSpec) { s.BTH.Opcode = RCReadRequest }, ErrInvalidSpec},
		{"destqp 25 bits", func(s *FrameSpec) { s.BTH.DestQP = 1 << 24 }, ErrInvalidSpec},
		{"psn 25 bits", func(s *FrameSpec) { s.BTH.PSN = 1 << 24 }, ErrInvalidSpec},
		{"no src", func(s *FrameSpec) { s.Src = s.Dst; s.Src = netipZero }, ErrInvalidSpec},
		{"mixed family", func(s *FrameSpec) { s.Dst = fullSpec(RCSendOnly, true, false, 0).Dst }, ErrInvalidSpec},
		{"vlan id", func(s *FrameSpec) { s.VLAN, s.VLANID = true, 4096 }, ErrInvalidSpec},
		{"vlan pcp", func(s *FrameSpec) { s.VLAN, s.VLANPCP = true, 8 }, ErrInvalidSpec},
		{"too long", func(s *FrameSpec) { s.Payload = make([]byte, 65500) }, ErrInvalidSpec},
		{"short buffer", func(s *FrameSpec) {}, ErrShortBuffer},
	}
	for _, c := range cases {
		s := *base
		c.mod(&s)
		b := buf
		if c.err == ErrShortBuffer {
			b = buf[:s.Len()-1]
		}
		if _, err := Build(b, &s); !errors.Is(err, c.err) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.err)
		}
	}
	if _, err := Build(buf, nil); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("nil spec: %v", err)
	}
	if err := Parse(buf, nil); err == nil {
		t.Error("nil packet accepted")
	}
	s := *base
	if _, err := BuildIB(buf[:s.IBLen()-1], &s); !errors.Is(err, ErrShortBuffer) {
		t.Errorf("BuildIB short: %v", err)
	}
	s.RETH = nil
	if _, err := BuildIB(buf, &s); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("BuildIB missing RETH: %v", err)
	}
	// UDP checksum, when asked for, is valid and does not disturb the ICRC.
	s = *base
	s.UDPChecksum = true
	for _, v6 := range []bool{false, true} {
		if v6 {
			s.Src, s.Dst = fullSpec(RCSendOnly, true, false, 0).Src, fullSpec(RCSendOnly, true, false, 0).Dst
		}
		n, err := Build(buf, &s)
		if err != nil {
			t.Fatal(err)
		}
		var p Packet
		if err := Parse(buf[:n], &p); err != nil {
			t.Fatal(err)
		}
		if p.UDP.Checksum() == 0 || !p.UDPChecksumValid() || p.VerifyICRC() != nil {
			t.Fatalf("v6=%v: UDP checksum %#x valid %v", v6, p.UDP.Checksum(), p.UDPChecksumValid())
		}
		p.Payload[0] ^= 1
		if p.UDPChecksumValid() {
			t.Fatal("corrupted UDP checksum accepted")
		}
	}
}

// TestBuildInPlacePayload builds a frame whose payload already sits at its
// final offset in the buffer (the zero-copy transmit pattern).
func TestBuildInPlacePayload(t *testing.T) {
	for _, n := range []int{0, 1, 5, 1024} {
		want := frameFor(t, fullSpec(RCWriteOnly, true, true, n))
		s := fullSpec(RCWriteOnly, true, true, n)
		buf := make([]byte, s.Len())
		off := s.Len() - ICRCSize - (-n & 3) - n
		copy(buf[off:], s.Payload)
		s.Payload = buf[off : off+n]
		m, err := Build(buf, s)
		if err != nil || string(buf[:m]) != string(want) {
			t.Fatalf("n=%d: in-place build differs (%v)", n, err)
		}
	}
}
