package wire

import (
	"encoding/hex"
	"net/netip"
	"testing"
)

func TestDSHeader(t *testing.T) {
	h := DSHeader{Addr: netip.MustParseAddrPort("10.77.0.3:7174")}
	b := h.AppendTo(nil)
	if hex.EncodeToString(b) != "0408"+"1c06"+"0a4d0003" {
		t.Fatalf("%x", b)
	}
	if g, err := ParseDSHeader(b); err != nil || g != h {
		t.Fatal(g, err)
	}
	h6 := DSHeader{Addr: netip.MustParseAddrPort("[fd00::3]:7174"), FlowInfo: 0x12345}
	b6 := h6.AppendTo(nil)
	if len(b6) != DSIPv6HdrLen || h6.Len() != 24 || h.Len() != 8 {
		t.Fatal(len(b6))
	}
	if g, err := ParseDSHeader(b6); err != nil || g != h6 {
		t.Fatal(g, err)
	}
	for _, tc := range []struct {
		b    []byte
		want error
	}{{b[:7], errShort}, {b6[:20], errShort}, {[]byte{4, 24, 0, 0, 0, 0, 0, 0}, errHeader}, {[]byte{5, 8, 0, 0, 0, 0, 0, 0}, errHeader}} {
		if _, err := ParseDSHeader(tc.b); err != tc.want {
			t.Errorf("%x: %v", tc.b, err)
		}
	}
}

func TestUDPHeader(t *testing.T) {
	h := UDPHeader{Op: OpData, QPN: 0x11, Addr: netip.MustParseAddr("10.77.0.3")}
	b := h.AppendTo(nil)
	if hex.EncodeToString(b) != "55555555"+"04001000"+"00000011"+"0a4d0003" {
		t.Fatalf("%x", b)
	}
	if g, n, err := ParseUDPHeader(b, false); err != nil || g != h || n != 16 {
		t.Fatal(g, n, err)
	}
	if _, _, err := ParseUDPHeader(b, true); err != errHeader {
		t.Fatal(err)
	}
	h6 := UDPHeader{Op: OpCtrl, QPN: 0xabcdef, Addr: netip.MustParseAddr("fd00::2")}
	b6 := h6.AppendTo(nil)
	if g, n, err := ParseUDPHeader(b6, true); err != nil || g != h6 || n != 28 {
		t.Fatal(g, n, err)
	}
	bad := func(i int, v byte) []byte { c := append([]byte(nil), b...); c[i] = v; return c }
	for _, c := range [][]byte{bad(0, 0x54), bad(5, 4), bad(7, 1), bad(8, 1), bad(6, 28)} {
		if _, _, err := ParseUDPHeader(c, false); err != errHeader {
			t.Errorf("%x: %v", c, err)
		}
	}
	if _, _, err := ParseUDPHeader(b6[:20], true); err != errShort {
		t.Fatal(err)
	}
}

func FuzzDatagram(f *testing.F) {
	f.Add(DSHeader{Addr: netip.MustParseAddrPort("10.0.0.1:1")}.AppendTo(nil), false)
	f.Add(UDPHeader{Op: OpCtrl, QPN: 5, Addr: netip.MustParseAddr("fd00::1")}.AppendTo(nil), true)
	f.Fuzz(func(t *testing.T, b []byte, v6 bool) {
		if h, err := ParseDSHeader(b); err == nil {
			if out := h.AppendTo(nil); string(out) != string(b[:len(out)]) {
				t.Fatalf("ds round trip %x", b)
			}
		}
		if h, n, err := ParseUDPHeader(b, v6); err == nil {
			if out := h.AppendTo(nil); len(out) != n || string(out) != string(b[:n]) {
				t.Fatalf("udp round trip %x", b)
			}
		}
	})
}
