package ib

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func encapFrame(h EncapHeader, n int) []byte {
	b := make([]byte, h.HeaderSize()+n)
	h.Put(b, n)
	return b
}

var (
	encap4 = EncapHeader{Dst: [6]byte{2, 0, 0, 0, 0, 1}, Src: [6]byte{2, 0, 0, 0, 0, 2},
		SrcAddr: netip.MustParseAddr("192.0.2.1"), DstAddr: netip.MustParseAddr("192.0.2.2"),
		SrcPort: 49152, DstPort: RoCEv2Port, TOS: 2, TTL: 64, IPID: 7, DF: true}
	encap6 = EncapHeader{SrcAddr: netip.MustParseAddr("2001:db8::1"), DstAddr: netip.MustParseAddr("2001:db8::2"),
		SrcPort: 4791, DstPort: RoCEv2Port, TOS: 3, TTL: 9, FlowLabel: 0x12345}
)

// TestEncapPutParse checks that ParseEncap reads back every field Put wrote,
// with and without a VLAN tag, and that Put writes what the header views
// (and so Parse) decode.
func TestEncapPutParse(t *testing.T) {
	tagged := encap6
	tagged.VLAN, tagged.VLANID, tagged.VLANPCP = true, 0x123, 5
	mapped := encap4
	mapped.SrcAddr, mapped.DstAddr = netip.MustParseAddr("::ffff:192.0.2.1"), netip.MustParseAddr("::ffff:192.0.2.2")
	for _, h := range []EncapHeader{encap4, encap6, tagged, mapped} {
		b := encapFrame(h, 20)
		var e Encap
		if err := ParseEncap(b, &e); err != nil {
			t.Fatalf("%v: %v", h.SrcAddr, err)
		}
		v := 6
		if h.v4() {
			v = 4
		}
		tci := h.VLANID | uint16(h.VLANPCP)<<13
		if e.Version != v || e.Src != h.SrcAddr.Unmap() || e.Dst != h.DstAddr.Unmap() || e.SrcPort != h.SrcPort ||
			e.DstPort != h.DstPort || e.TOS != h.TOS || e.TTL != h.TTL || e.VLAN != h.VLAN || (h.VLAN && e.VLANTCI != tci) ||
			e.Payload != h.HeaderSize() || e.End != len(b) || (v == 6 && e.FlowLabel != h.FlowLabel) {
			t.Fatalf("%v: put %+v, parsed %+v", h.SrcAddr, h, e)
		}
		if v == 4 {
			ip := IPv4(b[e.IPOffset:e.UDPOffset])
			if !ip.ChecksumValid() || ip.ID() != h.IPID || !ip.DontFragment() || int(ip.TotalLength()) != len(b)-e.IPOffset {
				t.Fatalf("IPv4 header %+v", ip.Fields())
			}
		}
		// SetEncapLength makes the prefix another length's, as Put would.
		c := make([]byte, len(b)+13)
		copy(c, b[:h.HeaderSize()])
		SetEncapLength(c[:h.HeaderSize()], 33)
		if w := encapFrame(h, 33); string(w[:h.HeaderSize()]) != string(c[:h.HeaderSize()]) {
			t.Fatalf("%v: SetEncapLength % x, Put % x", h.SrcAddr, c[:h.HeaderSize()], w[:h.HeaderSize()])
		}
	}
}

// TestParseEncapErrors covers each rejection with its error.
func TestParseEncapErrors(t *testing.T) {
	mod := func(h EncapHeader, f func(b []byte)) []byte {
		b := encapFrame(h, 20)
		f(b)
		return b
	}
	v4 := func(f func(ip []byte)) []byte { return mod(encap4, func(b []byte) { f(b[EthernetSize:]) }) }
	v6 := func(f func(ip []byte)) []byte { return mod(encap6, func(b []byte) { f(b[EthernetSize:]) }) }
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", make([]byte, 10), ErrTruncated},
		{"arp", mod(encap4, func(b []byte) { b[12], b[13] = 0x08, 0x06 }), ErrNotIP},
		{"short vlan", []byte{12: 0x81, 13: 0, 14: 0}, ErrTruncated},
		{"stacked vlan", []byte{12: 0x81, 13: 0, 16: 0x81, 17: 0, 20: 0}, ErrNotIP},
		{"ipv4 version", v4(func(ip []byte) { ip[0] = 0x65 }), ErrMalformed},
		{"ipv4 options", v4(func(ip []byte) { ip[0] = 0x46 }), ErrMalformed},
		{"ipv4 tcp", v4(func(ip []byte) { ip[ipv4Proto] = 6 }), ErrNotUDP},
		{"ipv4 fragment", v4(func(ip []byte) { ip[ipv4FlagsOff] |= 0x20 }), ErrMalformed},
		{"ipv4 total small", v4(func(ip []byte) { binary.BigEndian.PutUint16(ip[ipv4TotalLen:], 27) }), ErrMalformed},
		{"ipv4 total beyond", v4(func(ip []byte) { binary.BigEndian.PutUint16(ip[ipv4TotalLen:], 999) }), ErrTruncated},
		{"udp length small", v4(func(ip []byte) { binary.BigEndian.PutUint16(ip[IPv4Size+udpLen:], 7) }), ErrMalformed},
		{"udp length beyond", v4(func(ip []byte) { binary.BigEndian.PutUint16(ip[IPv4Size+udpLen:], 29) }), ErrMalformed},
		{"ipv6 version", v6(func(ip []byte) { ip[0] = 0x40 }), ErrMalformed},
		{"ipv6 ext header", v6(func(ip []byte) { ip[ipv6Next] = 0 }), ErrNotUDP},
		{"ipv6 payload small", v6(func(ip []byte) { binary.BigEndian.PutUint16(ip[ipv6PayLen:], 7) }), ErrMalformed},
		{"ipv6 payload beyond", v6(func(ip []byte) { binary.BigEndian.PutUint16(ip[ipv6PayLen:], 29) }), ErrTruncated},
	} {
		if err := ParseEncap(c.b, new(Encap)); err != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// A shorter UDP length than the datagram is the link's to accept (the
	// rest is padding), and Parse's to refuse.
	b := v4(func(ip []byte) { binary.BigEndian.PutUint16(ip[IPv4Size+udpLen:], 20) })
	if e := new(Encap); ParseEncap(b, e) != nil || e.End != EthernetSize+IPv4Size+20 {
		t.Fatalf("short UDP length: %+v", e)
	}
	if !errors.Is(ErrNotIP, ErrUnsupported) || !errors.Is(ErrNotUDP, ErrUnsupported) {
		t.Fatal("ErrNotIP and ErrNotUDP must wrap ErrUnsupported")
	}
}

// checkEncapParser parses frames in turn with one EncapParser and with
// ParseEncap, which must agree on every frame; a frame Parse calls the same
// must repeat the fields of the last frame that parsed whole.
func checkEncapParser(t *testing.T, frames ...[]byte) {
	t.Helper()
	var p EncapParser
	var last Encap
	haveLast := false
	for i, b := range frames {
		var want Encap
		werr := ParseEncap(b, &want)
		got, same, err := p.Parse(b)
		if err != werr {
			t.Fatalf("frame %d: Parse error %v, ParseEncap %v", i, err, werr)
		}
		if err != nil {
			if got != nil || same {
				t.Fatalf("frame %d: failed Parse returned %v, same %v", i, got, same)
			}
			continue
		}
		if *got != want {
			t.Fatalf("frame %d: Parse %+v, ParseEncap %+v", i, *got, want)
		}
		if same {
			if !haveLast {
				t.Fatalf("frame %d: same with nothing before", i)
			}
			w := want
			w.End = last.End
			if w != last {
				t.Fatalf("frame %d: same, but %+v after %+v", i, want, last)
			}
		}
		last, haveLast = want, true
	}
}

func TestEncapParserMatchesParseEncap(t *testing.T) {
	other, port, id, flow := encap4, encap4, encap4, encap6
	other.TOS, port.SrcPort, id.IPID, flow.FlowLabel = 9, 1, 99, 8
	a, b := encapFrame(encap4, 100), encapFrame(encap4, 60)
	short := encapFrame(encap4, 100)
	binary.BigEndian.PutUint16(short[EthernetSize+ipv4TotalLen:], 10)
	long := encapFrame(encap4, 100)
	binary.BigEndian.PutUint16(long[EthernetSize+IPv4Size+udpLen:], 200)
	checkEncapParser(t, a, b, a, encapFrame(other, 100), a, encapFrame(port, 100), a, encapFrame(id, 100), a,
		short, a, long, b, a[:60], a, encapFrame(encap4, 0), encapFrame(encap4, 1),
		encapFrame(encap6, 100), encapFrame(encap6, 40), encapFrame(flow, 40), a, encapFrame(encap6, 40))

	// A repeat must be taken as one: the fast path is what Parse is for.
	var p EncapParser
	p.Parse(a)
	if _, same, err := p.Parse(encapFrame(id, 60)); !same || err != nil {
		t.Fatalf("another length and IPv4 ID: same %v, err %v", same, err)
	}
	if _, same, _ := p.Parse(encapFrame(other, 60)); same {
		t.Fatal("another TOS taken as the same")
	}
}

func TestEncapAllocs(t *testing.T) {
	b := encapFrame(encap4, 100)
	hb := make([]byte, MaxEncapSize)
	var p EncapParser
	var e Encap
	for name, fn := range map[string]func(){
		"ParseEncap":        func() { _ = ParseEncap(b, &e) },
		"EncapParser.Parse": func() { _, _, _ = p.Parse(b) },
		"ParseEncap error":  func() { _ = ParseEncap(b[:30], &e) },
		"EncapHeader.Put":   func() { encap6.Put(hb, 100) },
		"SetEncapLength":    func() { SetEncapLength(hb, 50) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("%s: %v allocations", name, n)
		}
	}
}

// FuzzParseEncap checks that ParseEncap never panics, returns only its
// documented errors, agrees with Parse on every frame Parse accepts, and
// that an EncapParser agrees with it over a sequence of frames.
func FuzzParseEncap(f *testing.F) {
	for _, s := range seedFrames(f) {
		f.Add(s, s[:len(s)/2])
	}
	f.Add(encapFrame(encap4, 40), encapFrame(encap6, 40))
	tagged := encap4
	tagged.VLAN = true
	f.Add(encapFrame(tagged, 40), []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var e Encap
		err := ParseEncap(a, &e)
		switch err {
		case nil:
			if e.IPOffset < EthernetSize || e.UDPOffset <= e.IPOffset || e.Payload != e.UDPOffset+UDPSize ||
				e.End < e.Payload || e.End > len(a) {
				t.Fatalf("offsets %+v for %d bytes", e, len(a))
			}
		case ErrTruncated, ErrMalformed, ErrNotIP, ErrNotUDP:
		default:
			t.Fatalf("undocumented error %v", err)
		}
		var p Packet
		if Parse(a, &p) == nil {
			if err != nil {
				t.Fatalf("Parse accepts, ParseEncap: %v", err)
			}
			if e.End-e.Payload != len(p.IB) || &a[e.Payload] != &p.IB[0] {
				t.Fatalf("ParseEncap payload [%d:%d], Parse IB of %d bytes", e.Payload, e.End, len(p.IB))
			}
		}
		checkEncapParser(t, a, b, a, b)
	})
}

func BenchmarkParseEncap(b *testing.B) {
	fr := encapFrame(encap4, 4096)
	b.Run("ParseEncap", func(b *testing.B) {
		var e Encap
		for b.Loop() {
			if err := ParseEncap(fr, &e); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("EncapParser", func(b *testing.B) {
		var p EncapParser
		for b.Loop() {
			if _, _, err := p.Parse(fr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Put", func(b *testing.B) {
		h := encap4
		for b.Loop() {
			h.Put(fr, 4096)
		}
	})
}

// TestIPv4ChecksumUnrolled checks the unrolled 20-byte checksum against the
// general sum over any header bytes, and against a header whose checksum is
// known (a frame captured from rxe, vecV1).
func TestIPv4ChecksumUnrolled(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := make(IPv4, IPv4Size)
	for range 1000 {
		for i := range h {
			h[i] = byte(r.Uint32())
		}
		h[ipv4VerIHL] = 0x45
		want := ^foldSum(onesSum(0, h[:ipv4Csum]) + onesSum(0, h[ipv4Csum+2:]))
		if got := h.ComputeChecksum(); got != want {
			t.Fatalf("% x: %#04x, want %#04x", []byte(h), got, want)
		}
	}
	var p Packet
	if err := Parse(mustHex(t, vecV1), &p); err != nil || p.IPv4 == nil || !p.IPv4.ChecksumValid() {
		t.Fatalf("captured IPv4 header does not verify: %v", err)
	}
}
