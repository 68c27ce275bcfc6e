//go:build linux

package roce

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/memlink"
)

// spoofEnv is a connected pair of devices plus a way to put a forged packet
// on the wire from a third address.
type spoofEnv struct {
	da, db       *Device
	addrA, addrB netip.Addr
	third        netip.Addr
	// inject sends the IB packet described by s from s.Src to s.Dst, on the
	// wire towards B (toB) or towards A.
	inject func(t *testing.T, toB bool, s *ib.FrameSpec)
}

func memSpoofEnv(t *testing.T, a, b, third netip.Addr) *spoofEnv {
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	da, db := openPair(t, la, lb, a, b, nil)
	return &spoofEnv{da: da, db: db, addrA: a, addrB: b, third: third,
		inject: func(t *testing.T, toB bool, s *ib.FrameSpec) {
			t.Helper()
			l, dst := lb, macA
			if toB {
				l, dst = la, macB
			}
			copy(s.DstMAC[:], dst)
			copy(s.SrcMAC[:], []byte{2, 0, 0, 0, 0, 0x66})
			f := make([]byte, s.Len())
			if _, err := ib.Build(f, s); err != nil {
				t.Fatal(err)
			}
			if _, err := l.WriteBatch([][]byte{f}); err != nil {
				t.Fatal(err)
			}
		}}
}

// udpSpoofEnv joins two namespaces with a veth pair, opens UDP-link devices
// in them and gives each namespace a third address to forge from.
func udpSpoofEnv(t *testing.T, a, b, thirdA, thirdB netip.Prefix) *spoofEnv {
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500, Addr: a, PeerAddr: b})
	// One third address per namespace: a namespace drops packets from an
	// address it owns itself.
	for v, third := range map[*netnstest.Veth]netip.Prefix{p.VethA: thirdA, p.VethB: thirdB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		l, err := v.NS.Netlink().LinkByName(v.Name)
		if err != nil {
			t.Fatal(err)
		}
		// No DAD, so the address can send at once.
		if err := v.NS.Netlink().AddrAdd(l, &netlink.Addr{IPNet: prefixNet(third), Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
	}
	// Bind the named addresses: the default choice may be the link-local one.
	da := openBound(t, p.VethA, udpLink, a.Addr(), Options{})
	db := openBound(t, p.VethB, udpLink, b.Addr(), Options{})
	return &spoofEnv{da: da, db: db, addrA: a.Addr(), addrB: b.Addr(), third: thirdA.Addr(),
		inject: func(t *testing.T, toB bool, s *ib.FrameSpec) {
			t.Helper()
			ns := p.VethB.NS
			s.Src = thirdB.Addr()
			if toB {
				ns = p.VethA.NS
				s.Src = thirdA.Addr()
			}
			// The frame's ICRC covers the UDP source port, so the
			// frame is built once the socket has its port: over IPv6
			// the device checks the ICRC of what the UDP link receives.
			err := ns.Do(func() error {
				c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(s.Src, 0)))
				if err != nil {
					return err
				}
				defer c.Close()
				s.SrcPort = uint16(c.LocalAddr().(*net.UDPAddr).Port)
				frame := make([]byte, s.Len())
				if _, err := ib.Build(frame, s); err != nil {
					return err
				}
				pkt := frame[len(frame)-s.IBLen():]
				_, err = c.WriteToUDPAddrPort(pkt, netip.AddrPortFrom(s.Dst, ib.RoCEv2Port))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}}
}

// TestSpoofedSource forges, from a third address, the packets an attacker
// who knows the QPNs, PSNs and R_Key could send: ACKs and NAKs for a SEND in
// flight, and WRITEs into the peer's region. The device drops them
// (bad_addr), nothing completes or changes, and the real connection then
// completes its transfers.
func TestSpoofedSource(t *testing.T) {
	envs := []struct {
		name string
		mk   func(t *testing.T) *spoofEnv
	}{
		{"memlink/IPv4", func(t *testing.T) *spoofEnv {
			return memSpoofEnv(t, addrA, addrB, netip.MustParseAddr("10.0.0.66"))
		}},
		{"memlink/IPv6", func(t *testing.T) *spoofEnv {
			return memSpoofEnv(t, netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::66"))
		}},
		{"udp-netns/IPv4", func(t *testing.T) *spoofEnv {
			netnstest.SkipUnlessNetns(t)
			return udpSpoofEnv(t, netip.MustParsePrefix("10.99.0.1/24"), netip.MustParsePrefix("10.99.0.2/24"),
				netip.MustParsePrefix("10.99.0.66/24"), netip.MustParsePrefix("10.99.0.77/24"))
		}},
		{"udp-netns/IPv6", func(t *testing.T) *spoofEnv {
			netnstest.SkipUnlessNetns(t)
			return udpSpoofEnv(t, netip.MustParsePrefix("fd00:99::1/64"), netip.MustParsePrefix("fd00:99::2/64"),
				netip.MustParsePrefix("fd00:99::66/64"), netip.MustParsePrefix("fd00:99::77/64"))
		}},
	}
	for _, env := range envs {
		t.Run(env.name, func(t *testing.T) {
			spoofScenario(t, env.mk(t))
		})
	}
}

func spoofScenario(t *testing.T, e *spoofEnv) {
	const to = 10 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), to)
	defer cancel()
	a := newEndpoint(t, e.da, RC, 4096)
	b := newEndpoint(t, e.db, RC, 4096)
	fill(b.buf, 9)
	orig := append([]byte(nil), b.buf...)

	// The SGIDs are given: the default IPv6 one may be link-local, which a
	// UDP link bound to the named address cannot send from.
	// A connects; B stays in RESET for now and drops A's SEND, which A
	// retransmits (retry_cnt 7: forever) while the forgeries arrive.
	const psnA, psnB = 100, 200000
	if err := a.qp.Connect(ctx, &ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: e.addrB,
		SGID: ib.GIDFromAddr(e.addrA), LocalPSN: psnA, RemotePSN: psnB}); err != nil {
		t.Fatal(err)
	}
	msg := a.buf[:100]
	fill(msg, 1)
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, len(msg))}}); err != nil {
		t.Fatal(err)
	}
	resp := func(syn ib.Syndrome) *ib.FrameSpec {
		return &ib.FrameSpec{Src: e.third, Dst: e.addrA, HopLimit: 64, SrcPort: 0xC000,
			BTH:  ib.BTHFields{Opcode: ib.RCAck, PKey: 0xFFFF, DestQP: a.qp.QPN(), PSN: psnA},
			AETH: &ib.AETHFields{Syndrome: syn, MSN: 1}}
	}
	forgedResp := []ib.Syndrome{ib.SyndromeACKUnlimited, ib.NAKSyndrome(ib.NAKRemoteAccessError),
		ib.NAKSyndrome(ib.NAKInvalidRequest), ib.NAKSyndrome(ib.NAKRemoteOperationalError)}
	for _, syn := range forgedResp {
		e.inject(t, false, resp(syn))
	}
	waitFor(t, "A to count the forged responses", func() bool {
		c := e.da.Counters()
		return c.BadAddr == uint64(len(forgedResp))
	})
	var wc [4]WorkCompletion
	if n := a.scq.Poll(wc[:]); n != 0 {
		t.Fatalf("forged responses completed the SEND: %+v", wc[:n])
	}
	if s := a.qp.State(); s != StateRTS {
		t.Fatalf("a forged NAK moved A to %v", s)
	}

	// B connects: A's next retransmission gets through (after an RNR NAK if
	// it beats the receive) and B's ACK completes it.
	if err := b.qp.Connect(ctx, &ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: e.addrA,
		SGID: ib.GIDFromAddr(e.addrB), LocalPSN: psnB, RemotePSN: psnA}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.PostRecv(&RecvWR{ID: 2, SGL: []SGE{b.mr.SGE(2048, 1024)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCSend)
	if w := waitWC(t, b.rcq, to); w.Status != WCSuccess || w.WRID != 2 || !bytes.Equal(b.buf[2048:2048+w.ByteLen], msg) {
		t.Fatalf("the real SEND: %+v", w)
	}
	copy(orig[2048:], msg)

	// Forged WRITEs to B at the PSN it expects, with the right R_Key and range.
	if err := b.qp.PostRecv(&RecvWR{ID: 3, SGL: []SGE{b.mr.SGE(3072, 1024)}}); err != nil {
		t.Fatal(err)
	}
	evil := bytes.Repeat([]byte{0xEE}, 64)
	writeImm := &ib.FrameSpec{Src: e.third, Dst: e.addrB, HopLimit: 64, SrcPort: 0xC000,
		BTH:     ib.BTHFields{Opcode: ib.RCWriteOnlyImm, PKey: 0xFFFF, DestQP: b.qp.QPN(), PSN: psnA + 1, AckReq: true},
		RETH:    &ib.RETHFields{VA: b.mr.Addr(), RKey: b.mr.RKey(), DMALen: 64},
		ImmDt:   &ib.ImmDtFields{Imm: 0xBAD},
		Payload: evil}
	write := &ib.FrameSpec{Src: e.third, Dst: e.addrB, HopLimit: 64, SrcPort: 0xC000,
		BTH:     ib.BTHFields{Opcode: ib.RCWriteOnly, PKey: 0xFFFF, DestQP: b.qp.QPN(), PSN: psnA + 1, AckReq: true},
		RETH:    &ib.RETHFields{VA: b.mr.Addr() + 64, RKey: b.mr.RKey(), DMALen: 64},
		Payload: evil}
	e.inject(t, true, writeImm)
	e.inject(t, true, write)
	waitFor(t, "B to count the forged WRITEs", func() bool { return e.db.Counters().BadAddr == 2 })
	if !bytes.Equal(b.buf, orig) {
		t.Fatal("a forged WRITE changed B's memory region")
	}
	// The device's later writes come after this read (the UDP link's kernel
	// socket gives the race detector no such edge).
	b.mr.Sync()
	if n := b.rcq.Poll(wc[:]); n != 0 {
		t.Fatalf("a forged WRITE_WITH_IMM completed: %+v", wc[:n])
	}

	// The real peer's WRITE_WITH_IMM takes that PSN.
	data := a.buf[1024:1088]
	fill(data, 5)
	if err := a.qp.PostSend(&SendWR{ID: 4, Opcode: WRRDMAWriteWithImm, Flags: SendSignaled, Imm: 7,
		SGL: []SGE{a.mr.SGE(1024, 64)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, to), WCRDMAWrite)
	if w := waitWC(t, b.rcq, to); w.Status != WCSuccess || w.WRID != 3 || !bytes.Equal(b.buf[:64], data) {
		t.Fatalf("the real WRITE_WITH_IMM: %+v", w)
	}
	if ca, cb := e.da.Counters(), e.db.Counters(); ca.BadAddr != uint64(len(forgedResp)) || cb.BadAddr != 2 {
		t.Fatalf("bad_addr: A %d B %d", ca.BadAddr, cb.BadAddr)
	}

	// UC: a forged WRITE_ONLY_WITH_IMM needs not even the PSN (UC
	// resynchronises on any FIRST/ONLY), only the address check stops it.
	ua := newEndpoint(t, e.da, UC, 4096)
	ub := newEndpoint(t, e.db, UC, 4096)
	fill(ub.buf, 11)
	uorig := append([]byte(nil), ub.buf...)
	if err := ua.qp.Connect(ctx, &ConnectAttr{RemoteQPN: ub.qp.QPN(), RemoteAddr: e.addrB,
		SGID: ib.GIDFromAddr(e.addrA), LocalPSN: 7, RemotePSN: 9}); err != nil {
		t.Fatal(err)
	}
	if err := ub.qp.Connect(ctx, &ConnectAttr{RemoteQPN: ua.qp.QPN(), RemoteAddr: e.addrA,
		SGID: ib.GIDFromAddr(e.addrB), LocalPSN: 9, RemotePSN: 7}); err != nil {
		t.Fatal(err)
	}
	if err := ub.qp.PostRecv(&RecvWR{ID: 5, SGL: []SGE{ub.mr.SGE(3072, 1024)}}); err != nil {
		t.Fatal(err)
	}
	e.inject(t, true, &ib.FrameSpec{Src: e.third, Dst: e.addrB, HopLimit: 64, SrcPort: 0xC000,
		BTH:     ib.BTHFields{Opcode: ib.UCWriteOnlyImm, PKey: 0xFFFF, DestQP: ub.qp.QPN(), PSN: 0x4242},
		RETH:    &ib.RETHFields{VA: ub.mr.Addr(), RKey: ub.mr.RKey(), DMALen: 64},
		ImmDt:   &ib.ImmDtFields{Imm: 0xBAD},
		Payload: evil})
	waitFor(t, "B to count the forged UC WRITE", func() bool { return e.db.Counters().BadAddr == 3 })
	if !bytes.Equal(ub.buf, uorig) {
		t.Fatal("a forged UC WRITE changed B's memory region")
	}
	ub.mr.Sync()
	if n := ub.rcq.Poll(wc[:]); n != 0 {
		t.Fatalf("a forged UC WRITE_WITH_IMM completed: %+v", wc[:n])
	}
	// UC has no retransmission: resend until one arrives.
	fill(ua.buf[:64], 12)
	for try := 0; ; try++ {
		if err := ua.qp.PostSend(&SendWR{ID: 6, Opcode: WRRDMAWriteWithImm, Flags: SendSignaled, Imm: 8,
			SGL: []SGE{ua.mr.SGE(0, 64)}, RemoteAddr: ub.mr.Addr(), RKey: ub.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
		wantOK(t, waitWC(t, ua.scq, to), WCRDMAWrite)
		got := false
		for deadline := time.Now().Add(time.Second); !got && time.Now().Before(deadline); {
			if got = ub.rcq.Poll(wc[:1]) == 1; !got {
				time.Sleep(5 * time.Millisecond)
			}
		}
		if got {
			break
		}
		if try == 4 {
			t.Fatal("the real UC WRITE_WITH_IMM never arrived")
		}
	}
	if w := wc[0]; w.Status != WCSuccess || w.WRID != 5 || !bytes.Equal(ub.buf[:64], ua.buf[:64]) {
		t.Fatalf("the real UC WRITE_WITH_IMM: %+v", w)
	}
}
