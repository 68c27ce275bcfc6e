package ib

import (
	"net/netip"
	"testing"
	"time"
)

func TestPSN(t *testing.T) {
	if got := PSN(0xffffff).Add(1); got != 0 {
		t.Errorf("0xFFFFFF+1 = %#x", got)
	}
	if got := PSN(0xffffff).Next(); got != 0 {
		t.Errorf("Next(0xFFFFFF) = %#x", got)
	}
	if got := PSN(0xfffffe).Add(5); got != 3 {
		t.Errorf("0xFFFFFE+5 = %#x", got)
	}
	if got := PSN(5).Add(0xffffffff); got != 4 {
		t.Errorf("5 + (2^32-1) = %#x", got)
	}
	cases := []struct {
		a, b PSN
		want int32
	}{
		{0, 0, 0},
		{1, 0, 1},
		{0, 1, -1},
		{0, 0xffffff, 1},  // across the wrap
		{0xffffff, 0, -1}, // across the wrap
		{2, 0xfffffe, 4},
		{0x7fffff, 0, 0x7fffff},  // half space − 1 ahead: later
		{0x800000, 0, -0x800000}, // exactly half: earlier
		{0, 0x800000, -0x800000}, // symmetric case is also "earlier"
		{0x800001, 0, -0x7fffff}, // more than half ahead means behind
		{0x123456, 0x123456 + 0x100, -0x100},
	}
	for _, c := range cases {
		if got := PSNDiff(c.a, c.b); got != c.want {
			t.Errorf("PSNDiff(%#x, %#x) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	if !PSN(0xffffff).Before(0) || !PSN(0).After(0xffffff) || PSN(5).Before(5) || PSN(5).After(5) {
		t.Error("Before/After across wrap")
	}
	if !PSN(0).Before(0x7fffff) || PSN(0).Before(0x800001) || !PSN(0).After(0x800001) {
		t.Error("half-space ordering")
	}
	// Exhaustive-ish: a.Add(n) is After a for 1 <= n < 2^23 and PSNDiff recovers n.
	for _, a := range []PSN{0, 1, 0x7fffff, 0x800000, 0xfffff0, 0xffffff} {
		for _, n := range []uint32{1, 2, 0x10, 0x7ffffe, 0x7fffff} {
			b := a.Add(n)
			if PSNDiff(b, a) != int32(n) || !b.After(a) || !a.Before(b) {
				t.Errorf("a=%#x n=%#x", a, n)
			}
		}
	}
}

func TestSyndrome(t *testing.T) {
	if s := ACKSyndrome(0x1f); s != SyndromeACKUnlimited || s.Type() != SyndromeACK {
		t.Error("ACK unlimited")
	}
	if n, lim := Credits(0x1f); lim || n != 0 {
		t.Error("code 0x1F must be unlimited")
	}
	want := map[uint8]int{0: 0, 1: 1, 5: 6, 7: 12, 0x0f: 192, 0x10: 256, 0x13: 768, 0x1e: 32768}
	for c, n := range want {
		if got, lim := Credits(c); got != n || !lim {
			t.Errorf("Credits(%#x) = %d %v, want %d", c, got, lim, n)
		}
	}
	s := RNRNAKSyndrome(14)
	if s != 0x2e || s.Type() != SyndromeRNRNAK || s.RNRTimer() != 14 {
		t.Errorf("RNR NAK %#x", uint8(s))
	}
	durs := map[RNRTimer]time.Duration{
		0: 655360 * time.Microsecond, 1: 10 * time.Microsecond, 12: 640 * time.Microsecond,
		14: 1280 * time.Microsecond, 25: 61440 * time.Microsecond, 31: 491520 * time.Microsecond,
	}
	for c, d := range durs {
		if c.Duration() != d {
			t.Errorf("RNR %d = %v, want %v", c, c.Duration(), d)
		}
	}
	for c := RNRTimer(2); c < 32; c++ {
		if c.Duration() <= (c - 1).Duration() {
			t.Errorf("RNR table not increasing at %d", c)
		}
	}
	naks := map[NAKCode]Syndrome{NAKPSNSequenceError: 0x60, NAKInvalidRequest: 0x61, NAKRemoteAccessError: 0x62,
		NAKRemoteOperationalError: 0x63, NAKInvalidRDRequest: 0x64}
	for c, want := range naks {
		s := NAKSyndrome(c)
		if s != want || s.Type() != SyndromeNAK || s.NAKCode() != c || s.String() == "" {
			t.Errorf("NAK %v = %#x", c, uint8(s))
		}
	}
	if Syndrome(0x40).Type() != SyndromeReserved {
		t.Error("reserved type")
	}
	if ACKSyndrome(3).CreditCode() != 3 {
		t.Error("credit code")
	}
}

func TestMTU(t *testing.T) {
	for m, n := range map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096, 0: 0, 6: 0} {
		if m.Bytes() != n {
			t.Errorf("%d.Bytes() = %d", m, m.Bytes())
		}
		if got, ok := MTUFromBytes(n); ok != (n != 0) || (ok && got != m) {
			t.Errorf("MTUFromBytes(%d) = %v %v", n, got, ok)
		}
	}
	if _, ok := MTUFromBytes(1500); ok {
		t.Error("1500 is not an IB MTU")
	}
	for netdev, want := range map[int]MTU{1500: MTU1024, 9000: MTU4096, 4176: MTU4096, 4175: MTU2048,
		1104: MTU1024, 1103: MTU512, 0: MTU256, 300: MTU256, 65535: MTU4096} {
		if got := ActiveMTU(netdev); got != want {
			t.Errorf("ActiveMTU(%d) = %v, want %v", netdev, got, want)
		}
	}
}

func TestGID(t *testing.T) {
	v4 := netip.MustParseAddr("192.168.1.1")
	g := GIDFromAddr(v4)
	if g.String() != "::ffff:192.168.1.1" || g.Addr() != v4 || !g.IsIPv4() {
		t.Errorf("v4 GID %s %v", g, g.Addr())
	}
	want := GID{10: 0xff, 11: 0xff, 12: 192, 13: 168, 14: 1, 15: 1}
	if g != want {
		t.Errorf("bytes %x", g)
	}
	v6 := netip.MustParseAddr("fe80::5054:ff:fe4d:2")
	g = GIDFromAddr(v6)
	if g.Addr() != v6 || g.IsIPv4() || g.String() != "fe80::5054:ff:fe4d:2" {
		t.Errorf("v6 GID %s", g)
	}
	if GIDFromAddr(netip.Addr{}) != (GID{}) {
		t.Error("invalid addr")
	}
}

func TestSourcePorts(t *testing.T) {
	for qpn, want := range map[uint32]uint16{1: 0xd872, 0x11: 0xdf94, 0x12: 0xf806} {
		if got := RXESourcePort(qpn); got != want {
			t.Errorf("RXESourcePort(%#x) = %#x, want %#x", qpn, got, want)
		}
	}
	for q := uint32(0); q < 5000; q += 7 {
		if p := RXESourcePort(q); p < 0xc000 {
			t.Fatalf("port %#x below 0xC000", p)
		}
	}
	if CalcFlowLabel(0x11, 0x12) != CalcFlowLabel(0x12, 0x11) {
		t.Error("CalcFlowLabel not symmetric")
	}
	// 0x11*0x12 = 0x132: no high bits to fold.
	if got := CalcFlowLabel(0x11, 0x12); got != 0x132 {
		t.Errorf("CalcFlowLabel = %#x", got)
	}
	// v = 0xFFFFFF*0xFFFFFF = 0xFFFFFE000001; v ^= v>>20; v ^= v>>40.
	v := uint64(0xffffff) * 0xffffff
	v ^= v >> 20
	v ^= v >> 40
	if got := CalcFlowLabel(0xffffff, 0xffffff); got != uint32(v&0xfffff) {
		t.Errorf("CalcFlowLabel max = %#x", got)
	}
	if got := FlowLabelToUDPSourcePort(0x83ca0); got != 0xfc80 {
		t.Errorf("FlowLabelToUDPSourcePort = %#x", got)
	}
	if got := FlowLabelToUDPSourcePort(0); got != 0xc000 {
		t.Errorf("FlowLabelToUDPSourcePort(0) = %#x", got)
	}
}

// TestHeaderAccessors exercises setters against getters and Fields/Encode
// against each other on every view, and checks the wire bits of the BTH.
func TestHeaderAccessors(t *testing.T) {
	b := BTH(make([]byte, BTHSize))
	b.SetOpcode(RCSendLastImm)
	b.SetSolicited(true)
	b.SetMigReq(true)
	b.SetPadCount(3)
	b.SetTVer(0xf)
	b.SetPKey(0x7fff)
	b.SetFECN(true)
	b.SetBECN(true)
	b.SetDestQP(0x1abcdef) // 25 bits: truncated
	b.SetAckReq(true)
	b.SetPSN(0x1123456)
	want := []byte{0x03, 0xff, 0x7f, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56}
	if string(b) != string(want) {
		t.Fatalf("BTH %x, want %x", []byte(b), want)
	}
	f := b.Fields()
	c := BTH(make([]byte, BTHSize))
	c.Encode(&f)
	if string(c) != string(b) {
		t.Fatalf("Encode(Fields) %x", []byte(c))
	}
	b.SetSolicited(false)
	b.SetPadCount(1)
	b.SetTVer(0)
	b.SetFECN(false)
	b.SetAckReq(false)
	if b[1] != 0x50 || b[4] != 0x40 || b[8] != 0x00 || b.DestQP() != 0xabcdef || b.PSN() != 0x123456 {
		t.Fatalf("BTH after clears %x", []byte(b))
	}
	// Fields of a short view reads zero-padded instead of panicking.
	if got := BTH([]byte{0x04, 0x20}).Fields(); got.Opcode != RCSendOnly || got.PadCount != 2 || got.PSN != 0 {
		t.Fatalf("short Fields %+v", got)
	}
	if _, err := ParseBTH(make([]byte, 11)); err == nil {
		t.Fatal("ParseBTH accepted 11 bytes")
	}

	fe := FETH(make([]byte, 4))
	fe.SetPlacement(2)
	fe.SetSelectivity(1)
	if fe[3] != 0x12 || fe.Fields() != (FETHFields{Placement: 2, Selectivity: 1}) {
		t.Fatalf("FETH %x", []byte(fe))
	}
	x := XRCETH([]byte{0xff, 0, 0, 0})
	x.Encode(&XRCETHFields{SRQN: 0x123456})
	if string(x) != "\x00\x12\x34\x56" {
		t.Fatalf("XRCETH %x", []byte(x))
	}
	d := DETH(make([]byte, 8))
	d.Encode(&DETHFields{QKey: 0x80010000, SrcQP: 1})
	if string(d) != "\x80\x01\x00\x00\x00\x00\x00\x01" {
		t.Fatalf("DETH %x", []byte(d))
	}
	a := AtomicETH(make([]byte, AtomicETHSize))
	a.Encode(&AtomicETHFields{VA: 1, RKey: 2, SwapAdd: 3, Compare: 4})
	if a[7] != 1 || a[11] != 2 || a[19] != 3 || a[27] != 4 {
		t.Fatalf("AtomicETH %x", []byte(a))
	}

	v := VLANTag(make([]byte, 4))
	v.Encode(&VLANTagFields{PCP: 7, DEI: true, VID: 0xfff, EtherType: EtherTypeIPv6})
	if string(v) != "\xff\xff\x86\xdd" {
		t.Fatalf("VLAN %x", []byte(v))
	}
	v.SetPCP(1)
	v.SetDEI(false)
	v.SetVID(2)
	if v.Fields() != (VLANTagFields{PCP: 1, VID: 2, EtherType: EtherTypeIPv6}) {
		t.Fatalf("VLAN %+v", v.Fields())
	}

	ip := IPv6(make([]byte, IPv6Size))
	ip.Encode(&IPv6Fields{TrafficClass: 0xab, FlowLabel: 0xfffff, PayloadLength: 9, NextHeader: 17, HopLimit: 3,
		Src: netip.MustParseAddr("::1"), Dst: netip.MustParseAddr("10.1.2.3")})
	if ip[0] != 0x6a || ip[1] != 0xbf || ip.TrafficClass() != 0xab || ip.FlowLabel() != 0xfffff {
		t.Fatalf("IPv6 %x", []byte(ip[:4]))
	}
	ip.SetTrafficClass(0)
	ip.SetFlowLabel(1)
	if ip[0] != 0x60 || ip[1] != 0 || ip[3] != 1 || ip.Dst() != netip.MustParseAddr("::ffff:10.1.2.3") {
		t.Fatalf("IPv6 %x", []byte(ip))
	}

	v4 := IPv4(make([]byte, IPv4Size))
	v4.Encode(&IPv4Fields{TOS: 1, TotalLength: 100, ID: 7, DontFragment: true, TTL: 9, Protocol: 17,
		Src: netip.MustParseAddr("::ffff:1.2.3.4"), Dst: netip.MustParseAddr("5.6.7.8")})
	v4.UpdateChecksum()
	if !v4.ChecksumValid() || v4.Src() != netip.MustParseAddr("1.2.3.4") || v4[6] != 0x40 {
		t.Fatalf("IPv4 %x", []byte(v4))
	}
	v4.SetDontFragment(false)
	v4.SetMoreFragments(true)
	v4.SetFragmentOffset(0x1fff)
	if v4[6] != 0x3f || v4[7] != 0xff || v4.ChecksumValid() {
		t.Fatalf("IPv4 flags %x", []byte(v4[6:8]))
	}
}
