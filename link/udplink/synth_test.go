package udplink

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/link"
)

// TestRxHeaderMatchesPut: the copied and patched header is, byte for byte,
// what link.Header.Put writes, across changes of header and length.
func TestRxHeaderMatchesPut(t *testing.T) {
	hs := []link.Header{
		{Dst: [6]byte{2, 0, 0, 0, 0, 1}, TTL: synthTTL, DF: true, SrcAddr: netip.MustParseAddr("192.0.2.1"),
			DstAddr: netip.MustParseAddr("192.0.2.2"), SrcPort: 4791, DstPort: 4791},
		{TTL: synthTTL, DF: true, SrcAddr: netip.MustParseAddr("192.0.2.3"),
			DstAddr: netip.MustParseAddr("192.0.2.2"), SrcPort: 4791, DstPort: 4791, TOS: 0x02},
		{TTL: synthTTL, SrcAddr: netip.MustParseAddr("192.0.2.3"),
			DstAddr: netip.MustParseAddr("192.0.2.2"), SrcPort: 1000, DstPort: 4791, IPID: 7},
		{TTL: synthTTL, DF: true, SrcAddr: netip.MustParseAddr("2001:db8::1"),
			DstAddr: netip.MustParseAddr("2001:db8::2"), SrcPort: 4791, DstPort: 4791, TOS: 0x8a},
		{TTL: synthTTL, SrcAddr: netip.MustParseAddr("fe80::1"),
			DstAddr: netip.MustParseAddr("fe80::2"), SrcPort: 4791, DstPort: 4792, FlowLabel: 0xfffff},
	}
	r := rand.New(rand.NewPCG(1, 2))
	var x rxHeader
	var want, got [link.MaxHeaderSize]byte
	for i := 0; i < 5000; i++ {
		h := hs[r.IntN(len(hs))]
		if r.IntN(4) != 0 && i > 0 {
			h = x.h // mostly the same header again
		}
		plen := []int{0, 1, 64, 4096 + 28, 4096 + 12, 9000, 65507}[r.IntN(7)]
		n := h.Put(want[:], plen)
		x.set(&h)
		if x.size() != n {
			t.Fatalf("size %d, Put wrote %d", x.size(), n)
		}
		clear(got[:])
		x.put(got[:], plen)
		if !bytes.Equal(got[:n], want[:n]) {
			t.Fatalf("header %+v, payload %d:\n got %x\nwant %x", h, plen, got[:n], want[:n])
		}
	}
}

// BenchmarkRxHeader puts the headers of a coalesced run of 16 segments,
// the last one shorter.
func BenchmarkRxHeader(b *testing.B) {
	h := link.Header{TTL: synthTTL, DF: true, SrcAddr: netip.MustParseAddr("127.0.0.1"),
		DstAddr: netip.MustParseAddr("127.0.0.2"), SrcPort: 4791, DstPort: 4791}
	var buf [16][link.MaxHeaderSize]byte
	size := func(i int) int {
		if i == 15 {
			return 1000
		}
		return 4112
	}
	b.Run("Put", func(b *testing.B) {
		for b.Loop() {
			for i := range buf {
				h.Put(buf[i][:], size(i))
			}
		}
	})
	b.Run("rxHeader", func(b *testing.B) {
		var x rxHeader
		for b.Loop() {
			x.set(&h)
			for i := range buf {
				x.put(buf[i][:], size(i))
			}
		}
	})
}
