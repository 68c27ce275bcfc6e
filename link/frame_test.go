package link

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/linkerr"
)

func synth(t testing.TB, src, dst string, payload []byte) []byte {
	t.Helper()
	h := Header{
		Dst: [6]byte{2, 0, 0, 0, 0, 1}, Src: [6]byte{2, 0, 0, 0, 0, 2},
		SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
		SrcPort: 49152, DstPort: 4791, TOS: 0x02, TTL: 64, FlowLabel: 0x12345, DF: true,
	}
	b := make([]byte, h.HeaderSize()+len(payload))
	n := h.Put(b, len(payload))
	if n != h.HeaderSize() {
		t.Fatalf("%s: Put wrote %d header bytes, HeaderSize says %d", src, n, h.HeaderSize())
	}
	copy(b[n:], payload)
	return b
}

func TestPutParseRoundTrip(t *testing.T) {
	payload := []byte("0123456789abcdefICRC")
	for _, tc := range []struct{ src, dst string }{
		{"192.0.2.1", "192.0.2.2"},
		{"2001:db8::1", "2001:db8::2"},
		{"::ffff:192.0.2.1", "::ffff:192.0.2.2"}, // IPv4-mapped: written as IPv4
	} {
		b := synth(t, tc.src, tc.dst, payload)
		f, err := ParseFrame(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.src, err)
		}
		src, dst := netip.MustParseAddr(tc.src).Unmap(), netip.MustParseAddr(tc.dst).Unmap()
		if f.Src != src || f.Dst != dst || f.SrcPort != 49152 || f.DstPort != 4791 ||
			f.TOS != 2 || f.TTL != 64 || string(b[f.Payload:f.End]) != string(payload) {
			t.Fatalf("%s: parsed %+v", tc.src, f)
		}
		// An independent decoder must agree, including the IPv4 checksum.
		pkt := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Fatalf("%s: gopacket: %v", tc.src, el.Error())
		}
		udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || udp.SrcPort != 49152 || udp.DstPort != 4791 || string(udp.Payload) != string(payload) {
			t.Fatalf("%s: gopacket UDP %+v", tc.src, udp)
		}
		if ip4, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
			if ip4.Flags != layers.IPv4DontFragment || ip4.Id != 0 || ip4.TTL != 64 {
				t.Fatalf("IPv4 %+v", ip4)
			}
			if !ib.IPv4(b[EthernetSize : EthernetSize+IPv4Size]).ChecksumValid() {
				t.Fatal("IPv4 checksum does not verify")
			}
		} else if ip6, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
			if ip6.FlowLabel != 0x12345 || ip6.HopLimit != 64 || ip6.TrafficClass != 2 {
				t.Fatalf("IPv6 %+v", ip6)
			}
		} else {
			t.Fatalf("%s: no IP layer", tc.src)
		}
	}
}

func TestParseVLANAndPadding(t *testing.T) {
	b := synth(t, "10.0.0.1", "10.0.0.2", []byte{1, 2, 3})
	tagged := make([]byte, 0, 64)
	tagged = append(tagged, b[:12]...)
	tagged = append(tagged, 0x81, 0x00, 0x20, 0x05)
	tagged = append(tagged, b[12:]...)
	for len(tagged) < 60 { // Ethernet minimum-size padding
		tagged = append(tagged, 0xEE)
	}
	f, err := ParseFrame(tagged)
	if err != nil {
		t.Fatal(err)
	}
	if !f.VLAN || f.VLANTCI != 0x2005 || f.IPOffset != 18 || string(tagged[f.Payload:f.End]) != "\x01\x02\x03" {
		t.Fatalf("parsed %+v", f)
	}
}

func TestParseErrors(t *testing.T) {
	v4 := synth(t, "10.0.0.1", "10.0.0.2", make([]byte, 16))
	v6 := synth(t, "fd00::1", "fd00::2", make([]byte, 16))
	mod := func(b []byte, fn func(b []byte)) []byte {
		c := append([]byte(nil), b...)
		fn(c)
		return c
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, linkerr.Truncated},
		{"short ethernet", v4[:13], linkerr.Truncated},
		{"short vlan", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0, 0}, linkerr.Truncated},
		{"arp", mod(v4, func(b []byte) { b[12], b[13] = 0x08, 0x06 }), linkerr.NotIP},
		{"short ipv4", v4[:30], linkerr.Truncated},
		{"ipv4 options", mod(v4, func(b []byte) { b[14] = 0x46 }), linkerr.Header},
		{"ipv4 total too small", mod(v4, func(b []byte) { b[16], b[17] = 0, 20 }), linkerr.Header},
		{"ipv4 total too big", mod(v4, func(b []byte) { b[16], b[17] = 0xFF, 0xFF }), linkerr.Truncated},
		{"ipv4 fragment", mod(v4, func(b []byte) { b[20] |= 0x20 }), linkerr.Header},
		{"ipv4 tcp", mod(v4, func(b []byte) { b[23] = 6 }), linkerr.NotUDP},
		{"udp length too big", mod(v4, func(b []byte) { b[38], b[39] = 0, 200 }), linkerr.Header},
		{"udp length too small", mod(v4, func(b []byte) { b[38], b[39] = 0, 7 }), linkerr.Header},
		{"short ipv6", v6[:50], linkerr.Truncated},
		{"ipv6 bad version", mod(v6, func(b []byte) { b[14] = 0x45 }), linkerr.Header},
		{"ipv6 ext header", mod(v6, func(b []byte) { b[20] = 0 }), linkerr.NotUDP},
		{"ipv6 payload too big", mod(v6, func(b []byte) { b[18], b[19] = 0xFF, 0 }), linkerr.Truncated},
		{"ipv6 payload too small", mod(v6, func(b []byte) { b[18], b[19] = 0, 4 }), linkerr.Header},
	} {
		if _, err := ParseFrame(tc.frame); err != tc.want || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestFrameErrorUnwrap(t *testing.T) {
	var err error = &FrameError{Index: 3, Err: linkerr.Family}
	var fe *FrameError
	if !errors.Is(err, ErrRefused) || errors.Is(err, ErrMalformed) || ReasonOf(err) != "family" || !errors.As(err, &fe) || fe.Index != 3 || err.Error() == "" {
		t.Fatal(err)
	}
}

func TestNoAlloc(t *testing.T) {
	b := synth(t, "2001:db8::1", "2001:db8::2", make([]byte, 100))
	h := Header{SrcAddr: netip.MustParseAddr("10.0.0.1"), DstAddr: netip.MustParseAddr("10.0.0.2")}
	out := make([]byte, 64)
	if a := testing.AllocsPerRun(1000, func() {
		if _, err := ParseFrame(b); err != nil {
			t.Fatal(err)
		}
		h.Put(out, 100)
	}); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}

func FuzzParseFrame(f *testing.F) {
	f.Add(synth(f, "10.0.0.1", "10.0.0.2", []byte("payload")))
	f.Add(synth(f, "fd00::1", "fd00::2", []byte("payload")))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0, 0, 1, 0x08, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if fr.Payload < fr.UDPOffset+UDPSize || fr.End < fr.Payload || fr.End > len(b) {
			t.Fatalf("offsets out of range: %+v len %d", fr, len(b))
		}
		if binary.BigEndian.Uint16(b[fr.UDPOffset+4:]) != uint16(fr.End-fr.UDPOffset) {
			t.Fatal("UDP length mismatch")
		}
		// Re-synthesizing the headers must give a frame that parses the same.
		h := Header{SrcAddr: fr.Src, DstAddr: fr.Dst, SrcPort: fr.SrcPort, DstPort: fr.DstPort, TOS: fr.TOS, TTL: fr.TTL, FlowLabel: fr.FlowLabel}
		out := make([]byte, h.HeaderSize()+fr.End-fr.Payload)
		n := h.Put(out, fr.End-fr.Payload)
		copy(out[n:], b[fr.Payload:fr.End])
		g, err := ParseFrame(out)
		if err != nil || g.Src != fr.Src || g.Dst != fr.Dst || g.SrcPort != fr.SrcPort || g.End-g.Payload != fr.End-fr.Payload {
			t.Fatalf("re-synthesized frame: %+v, %v", g, err)
		}
	})
}

// A pair of addresses of mixed families (an IPv4-mapped source, an IPv6
// destination, as an IPv6 frame from the wire may carry) is written as
// IPv6, never a panic, and HeaderSize agrees with Put.
func TestHeaderMixedFamilies(t *testing.T) {
	for _, tc := range []struct{ src, dst string }{
		{"::ffff:192.0.2.1", "fd00::2"},
		{"fd00::1", "192.0.2.2"},
	} {
		h := Header{SrcAddr: netip.MustParseAddr(tc.src), DstAddr: netip.MustParseAddr(tc.dst), SrcPort: 49152, DstPort: 4791}
		b := make([]byte, h.HeaderSize()+8)
		if n := h.Put(b, 8); n != EthernetSize+IPv6Size+UDPSize || n != h.HeaderSize() {
			t.Fatalf("%s → %s: Put wrote %d, HeaderSize %d", tc.src, tc.dst, n, h.HeaderSize())
		}
		f, err := ParseFrame(b)
		if err != nil || f.Src != netip.AddrFrom16(h.SrcAddr.As16()) || f.Dst != netip.AddrFrom16(h.DstAddr.As16()) {
			t.Fatalf("%s → %s: parsed %+v, %v", tc.src, tc.dst, f, err)
		}
	}
	var zero Header // no addresses at all
	b := make([]byte, zero.HeaderSize())
	zero.Put(b, 0)
}

// TestIPv4Checksum checks the link's form of ib's checksum: the field's
// value over a zeroed field, zero over a valid header.
func TestIPv4Checksum(t *testing.T) {
	b := synth(t, "192.0.2.1", "192.0.2.2", make([]byte, 20))
	h := b[EthernetSize : EthernetSize+IPv4Size]
	if c := IPv4Checksum(h); c != 0 {
		t.Fatalf("valid header: %#04x, want 0", c)
	}
	want := ib.IPv4(h).Checksum()
	h[10], h[11] = 0, 0
	if c := IPv4Checksum(h); c != want || c == 0 {
		t.Fatalf("zeroed field: %#04x, want %#04x", c, want)
	}
	h[1] ^= 0xff // a damaged header must not pass
	ib.IPv4(h).SetChecksum(want)
	if IPv4Checksum(h) == 0 {
		t.Fatal("damaged header verifies")
	}
}
