//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

// filterAddrs are the addresses setFilter serves: the default test frames'
// destinations (10.77.0.2 and fd00::2) and one more of each family.
var filterAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("10.77.0.2"): true,
	netip.MustParseAddr("fd00::2"):   true,
	netip.MustParseAddr("127.0.0.1"): true,
	netip.MustParseAddr("::1"):       true,
}

func setFilter(t testing.TB, p *Program) {
	t.Helper()
	var list []netip.Addr
	for a := range filterAddrs {
		list = append(list, a)
	}
	if err := p.SetLocalAddrs(list); err != nil {
		t.Fatalf("SetLocalAddrs: %v", err)
	}
}

// TestAddrFilter: with the filter on, RoCEv2 frames to a served address are
// steered and those to any other address pass to the kernel, counted as
// OtherAddr; frames that are not RoCEv2 pass as before.
func TestAddrFilter(t *testing.T) {
	p := requireBPF(t, Options{})
	other4, other6 := netip.MustParseAddr("127.0.0.6"), netip.MustParseAddr("fd00::6")
	// Before SetLocalAddrs every frame to the port is steered.
	checkVerdict(t, p, frame{dst: other4}.bytes(), steer)
	setFilter(t, p)
	for _, tc := range []struct {
		name string
		f    frame
		want verdict
	}{
		{"ipv4-served", frame{}, steer},
		{"ipv4-loopback-served", frame{dst: netip.MustParseAddr("127.0.0.1")}, steer},
		{"ipv4-other", frame{dst: other4}, otherAddr},
		{"ipv4-other-vlan", frame{dst: other4, tags: []uint16{0x8100}}, otherAddr},
		{"ipv4-other-options", frame{dst: other4, ihl: 7}, otherAddr},
		{"ipv4-served-options", frame{ihl: 15}, steer},
		{"ipv6-served", frame{ipv6: true}, steer},
		{"ipv6-loopback-served", frame{ipv6: true, dst: netip.MustParseAddr("::1")}, steer},
		{"ipv6-other", frame{ipv6: true, dst: other6}, otherAddr},
		// The IPv4-mapped form of a served IPv4 address in an IPv6 header
		// matches the same key; a RoCE peer never sends one.
		{"ipv6-mapped-served", frame{ipv6: true, dst: netip.MustParseAddr("::ffff:10.77.0.2")}, steer},
		{"ipv4-other-tcp", frame{dst: other4, proto: 6}, pass},
		{"ipv4-other-port", frame{dst: other4, dport: 53}, pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			if !f.dst.IsValid() && f.ipv6 {
				f.dst = netip.MustParseAddr("fd00::2")
			}
			if m := model(f.bytes(), DefaultPort, filterAddrs); m != tc.want {
				t.Fatalf("model says %v, want %v", m, tc.want)
			}
			checkVerdict(t, p, f.bytes(), tc.want)
		})
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.OtherAddr != 4 {
		t.Fatalf("OtherAddr %d, want 4 (%+v)", st.OtherAddr, st)
	}

	// Replacing the set removes what is no longer listed.
	if err := p.SetLocalAddrs([]netip.Addr{other4}); err != nil {
		t.Fatal(err)
	}
	checkVerdict(t, p, frame{dst: other4}.bytes(), steer)
	checkVerdict(t, p, frame{}.bytes(), otherAddr)
	got, on, err := p.LocalAddrs()
	if err != nil || !on || !slices.Equal(got, []netip.Addr{other4}) {
		t.Fatalf("LocalAddrs %v on=%v err=%v, want [%v] on", got, on, err, other4)
	}
	// An empty set serves no address at all.
	if err := p.SetLocalAddrs(nil); err != nil {
		t.Fatal(err)
	}
	checkVerdict(t, p, frame{dst: other4}.bytes(), otherAddr)
}

func TestAddrFilterBadInput(t *testing.T) {
	p := requireBPF(t, Options{})
	if err := p.SetLocalAddrs([]netip.Addr{{}}); !errors.Is(err, ErrAddr) {
		t.Errorf("invalid address: %v, want ErrAddr", err)
	}
	many := make([]netip.Addr, MaxAddrs+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
	}
	if err := p.SetLocalAddrs(many); !errors.Is(err, ErrAddr) {
		t.Errorf("%d addresses: %v, want ErrAddr", len(many), err)
	}
	// A refused update leaves the filter as it was (off).
	if _, on, err := p.LocalAddrs(); err != nil || on {
		t.Errorf("after refused updates: on=%v err=%v", on, err)
	}
	// Duplicates and the IPv4-mapped spelling count once.
	dup := append(many[:MaxAddrs:MaxAddrs], netip.AddrFrom16(many[0].As16()))
	if err := p.SetLocalAddrs(dup); err != nil {
		t.Errorf("%d distinct addresses with a duplicate: %v", MaxAddrs, err)
	}
	p.Close()
	if err := p.SetLocalAddrs(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if _, _, err := p.LocalAddrs(); !errors.Is(err, ErrClosed) {
		t.Errorf("LocalAddrs after Close: %v", err)
	}
}

// TestAddrFilterMutations is TestMutations with the filter on, destinations
// drawn from served and unserved addresses.
func TestAddrFilterMutations(t *testing.T) {
	p := requireBPF(t, Options{})
	setFilter(t, p)
	seed := uint32(11)
	rnd := func() uint32 { seed = seed*1664525 + 1013904223; return seed >> 8 }
	cases := frameCases()
	dsts := []string{"", "127.0.0.1", "127.0.0.6", "10.77.0.3"}
	for i := range 2000 {
		f := cases[int(rnd())%len(cases)].f
		if d := dsts[rnd()%uint32(len(dsts))]; d != "" && !f.ipv6 {
			f.dst = netip.MustParseAddr(d)
		}
		data := f.bytes()
		if rnd()%2 == 0 {
			data[int(rnd())%len(data)] ^= byte(1 << (rnd() % 8))
		}
		want := model(data, DefaultPort, filterAddrs)
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			checkVerdict(t, p, data, want)
		})
	}
}
