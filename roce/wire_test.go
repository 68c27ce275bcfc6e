//go:build linux

package roce

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
)

// The address vector's traffic class and hop limit become the IP TOS/traffic
// class and TTL/hop limit, each QP sends from rxe's source port, and the
// frames carry the GIDs as addresses. Checked on IPv4 and IPv6.
func TestWireFields(t *testing.T) {
	for _, fam := range []struct {
		name string
		a, b netip.Addr
	}{
		{"IPv4", addrA, addrB},
		{"IPv6", netip.MustParseAddr("2001:db8::a"), netip.MustParseAddr("2001:db8::b")},
	} {
		t.Run(fam.name, func(t *testing.T) {
			var capture bytes.Buffer
			la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
			da, db := openPair(t, la, lb, fam.a, fam.b, &capture)
			a := newEndpoint(t, da, RC, 3*3000+64)
			b := newEndpoint(t, db, RC, 3*3000+64)
			const tc, hop = 0x68 | 2, 5 // DSCP 26, ECT(0)
			connect(t, a, b, fam.a, fam.b, ConnectAttr{TrafficClass: tc, HopLimit: hop})
			exerciseRC(t, a, b, 3000)
			da.Close()

			r, err := pcapgo.NewReader(&capture)
			if err != nil {
				t.Fatal(err)
			}
			var p ib.Packet
			sent := 0
			for {
				data, _, err := r.ReadPacketData()
				if err != nil {
					break
				}
				if err := ib.Parse(data, &p); err != nil {
					t.Fatal(err)
				}
				if err := p.VerifyICRC(); err != nil {
					t.Fatal(err)
				}
				var src, dst netip.Addr
				var gotTC, gotHop uint8
				if p.IPv4 != nil {
					src, dst, gotTC, gotHop = p.IPv4.Src(), p.IPv4.Dst(), p.IPv4.TOS(), p.IPv4.TTL()
					if !p.IPv4.DontFragment() {
						t.Fatal("IPv4 frame without DF")
					}
				} else {
					src, dst, gotTC, gotHop = p.IPv6.Src(), p.IPv6.Dst(), p.IPv6.TrafficClass(), p.IPv6.HopLimit()
				}
				if src != fam.a { // received frames: sent by b, which used the defaults
					continue
				}
				sent++
				if dst != fam.b || gotTC != tc || gotHop != hop {
					t.Fatalf("frame %v→%v TC %#x hop %d, want %v TC %#x hop %d", src, dst, gotTC, gotHop, fam.b, tc, hop)
				}
				if sp := p.UDP.SrcPort(); sp != ib.RXESourcePort(a.qp.QPN()) {
					t.Fatalf("source port %#x, want rxe's %#x for QPN %d", sp, ib.RXESourcePort(a.qp.QPN()), a.qp.QPN())
				}
				if p.Eth.Src() != [6]byte(macA) || p.Eth.Dst() != [6]byte(macB) {
					t.Fatalf("MACs %x → %x", p.Eth.Src(), p.Eth.Dst())
				}
			}
			if sent == 0 {
				t.Fatal("no frames from A captured")
			}
		})
	}
}

// Frames whose destination address is not in the GID table are dropped (as
// rxe_chk_dgid), counted, and do not disturb the QP.
func TestForeignDGID(t *testing.T) {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	// B believes A is 10.0.0.1 but A's table has only 10.0.0.3.
	da, err := OpenLink(la, Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	b := newEndpoint(t, db, UD, 4096)
	if err := b.qp.Connect(t.Context(), &ConnectAttr{QKey: 1}); err != nil {
		t.Fatal(err)
	}
	ah, err := b.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrA)})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostSend(&SendWR{Opcode: WRSend, Flags: SendSignaled, AH: ah, RemoteQPN: 17, SGL: []SGE{b.mr.SGE(0, 10)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, b.scq, 5*time.Second), WCSend)
	waitFor(t, "bad_dgid to count the frame", func() bool { return da.Counters().BadDGID == 1 })
}
