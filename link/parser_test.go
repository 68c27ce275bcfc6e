package link

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// checkParser parses frames in turn with one Parser and with ParseFrame,
// which must agree on every frame, errors included. What "same" promises
// is ib.EncapParser's, tested in ib (FuzzParseEncap).
func checkParser(t *testing.T, frames ...[]byte) {
	t.Helper()
	var p Parser
	for i, b := range frames {
		want, werr := ParseFrame(b)
		got, _, err := p.Parse(b)
		if err != werr || (err == nil && *got != want) || (err != nil && got != nil) {
			t.Fatalf("frame %d: Parse %v, %v; ParseFrame %+v, %v", i, got, err, want, werr)
		}
	}
}

func TestParserMatchesParseFrame(t *testing.T) {
	h4 := Header{Dst: [6]byte{2, 0, 0, 0, 0, 1}, SrcAddr: netip.MustParseAddr("192.0.2.1"),
		DstAddr: netip.MustParseAddr("192.0.2.2"), SrcPort: 4791, DstPort: 4791, TTL: 64, DF: true}
	h6 := Header{SrcAddr: netip.MustParseAddr("2001:db8::1"), DstAddr: netip.MustParseAddr("2001:db8::2"),
		SrcPort: 4791, DstPort: 4791, TTL: 64, FlowLabel: 7}
	frame := func(h Header, n int) []byte {
		b := make([]byte, h.HeaderSize()+n)
		h.Put(b, n)
		return b
	}
	other := h4
	other.TOS = 2
	port := h4
	port.SrcPort = 1
	id := h4
	id.IPID = 99
	flow := h6
	flow.FlowLabel = 8

	a, b := frame(h4, 100), frame(h4, 60)
	short := frame(h4, 100)
	binary.BigEndian.PutUint16(short[EthernetSize+2:], 10) // total length below the headers
	long := frame(h4, 100)
	binary.BigEndian.PutUint16(long[EthernetSize+IPv4Size+4:], 200) // UDP length past the datagram
	checkParser(t, a, b, a, frame(other, 100), a, frame(port, 100), a, frame(id, 100), a,
		short, a, long, b, a[:60], a, frame(h4, 0), frame(h4, 1),
		frame(h6, 100), frame(h6, 40), frame(flow, 40), a, frame(h6, 40))

	// The wrapper passes a repeat through as one.
	var p Parser
	if p.Parse(a); !repeats(&p, frame(id, 60)) || repeats(&p, frame(other, 60)) {
		t.Fatal("Parser does not report ib.EncapParser's repeats")
	}
}

func repeats(p *Parser, b []byte) bool {
	_, same, err := p.Parse(b)
	return same && err == nil
}

func TestParserAllocs(t *testing.T) {
	h := Header{SrcAddr: netip.MustParseAddr("192.0.2.1"), DstAddr: netip.MustParseAddr("192.0.2.2"), TTL: 64}
	b := make([]byte, 100)
	h.Put(b, 100-h.HeaderSize())
	var p Parser
	if n := testing.AllocsPerRun(100, func() { p.Parse(b) }); n != 0 {
		t.Fatalf("%v allocations per Parse", n)
	}
}

// FuzzParser parses two frames, then the first again, with one Parser,
// each against ParseFrame.
func FuzzParser(f *testing.F) {
	h := Header{SrcAddr: netip.MustParseAddr("192.0.2.1"), DstAddr: netip.MustParseAddr("192.0.2.2"), TTL: 64}
	a := make([]byte, h.HeaderSize()+40)
	h.Put(a, 40)
	f.Add(a, a[:60])
	h6 := Header{SrcAddr: netip.MustParseAddr("2001:db8::1"), DstAddr: netip.MustParseAddr("2001:db8::2"), TTL: 64}
	b := make([]byte, h6.HeaderSize()+40)
	h6.Put(b, 40)
	f.Add(b, b[:80])
	f.Add(a, b)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		checkParser(t, a, b, a, b)
	})
}

func BenchmarkParseFrame(b *testing.B) {
	h := Header{SrcAddr: netip.MustParseAddr("192.0.2.1"), DstAddr: netip.MustParseAddr("192.0.2.2"), TTL: 64}
	fr := make([]byte, h.HeaderSize()+4096)
	h.Put(fr, 4096)
	b.Run("ParseFrame", func(b *testing.B) {
		for b.Loop() {
			if _, err := ParseFrame(fr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Parser", func(b *testing.B) {
		var p Parser
		for b.Loop() {
			if _, _, err := p.Parse(fr); err != nil {
				b.Fatal(err)
			}
		}
	})
}
