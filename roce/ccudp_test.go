//go:build linux

package roce

import (
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/sys"
	"github.com/goroce/goroce/link/udplink"
)

// ceRelay stands between two devices on kernel UDP links as a congested
// switch port would: it takes A's datagrams on one plain UDP socket,
// counts their ECN fields, and passes them to B from a socket on A's
// address (B sees A's address, so they are A's packets), ECN-capable ones
// marked CE, Not-ECT ones as they came.
type ceRelay struct {
	in, out    *net.UDPConn
	to         *net.UDPAddr
	ect, other atomic.Int64
}

func newCERelay(t *testing.T, inAddr, outAddr netip.Addr, to netip.AddrPort) *ceRelay {
	t.Helper()
	in, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(inAddr, 0)))
	if err != nil {
		t.Skipf("no UDP socket on %v: %v", inAddr, err)
	}
	t.Cleanup(func() { in.Close() })
	out, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(outAddr, 0)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { out.Close() })
	rc, _ := in.SyscallConn()
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1) })
	if serr != nil {
		t.Fatal(serr)
	}
	r := &ceRelay{in: in, out: out, to: net.UDPAddrFromAddrPort(to)}
	go r.run()
	return r
}

func (r *ceRelay) port() uint16 { return netip.MustParseAddrPort(r.in.LocalAddr().String()).Port() }

func (r *ceRelay) run() {
	buf, oob, cm := make([]byte, 9216), make([]byte, 128), make([]byte, 64)
	for {
		n, oobn, _, _, err := r.in.ReadMsgUDP(buf, oob)
		if err != nil {
			return
		}
		var tos uint8
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) > 0 {
					tos = m.Data[0]
				}
			}
		}
		if tos&3 == 0 {
			r.other.Add(1)
		} else {
			r.ect.Add(1)
			tos |= 3
		}
		d, sp := sys.PutCmsg(cm, unix.IPPROTO_IP, unix.IP_TOS, 4)
		*(*int32)(unsafe.Pointer(&d[0])) = int32(tos)
		if _, _, err := r.out.WriteMsgUDP(buf[:n], cm[:sp], r.to); err != nil {
			return
		}
	}
}

// TestCCUDPLink runs RC WRITEs from A to B over kernel UDP links through
// a relay that marks A's ECN-capable datagrams CE: with congestion control
// on, A's datagrams leave ECT(0) (the link's socket TOS), B sees the CE
// marks through IP_RECVTOS and answers with CNPs, and A's QP is cut; with
// it off, A sends Not-ECT and nothing of it happens.
func TestCCUDPLink(t *testing.T) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		t.Run(name, func(t *testing.T) {
			cc := CCConfig{DCQCN: on}
			la, err := udplink.ListenOptions(netip.AddrPortFrom(loA, 0), udplink.Options{EphemeralPort: true})
			if err != nil {
				t.Skipf("no UDP socket on %v: %v", loA, err)
			}
			lb, err := udplink.ListenOptions(netip.AddrPortFrom(loB, 0), udplink.Options{EphemeralPort: true})
			if err != nil {
				la.Close()
				t.Skipf("no UDP socket on %v: %v", loB, err)
			}
			relay := newCERelay(t, loB, loA, lb.LocalAddr())
			da, err := OpenLink(la, Options{Addrs: []netip.Addr{loA}, Port: relay.port(), CC: cc})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { da.Close() })
			db, err := OpenLink(lb, Options{Addrs: []netip.Addr{loB}, Port: la.LocalAddr().Port(), CC: cc})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			a, b := newEndpoint(t, da, RC, 1<<16), newEndpoint(t, db, RC, 1<<16)
			connect(t, a, b, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
			const msgs, size = 8, 8192
			for i := range msgs {
				if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled,
					SGL: []SGE{a.mr.SGE(0, size)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
			}
			for range msgs {
				wantOK(t, waitWC(t, a.scq, 20*time.Second), WCRDMAWrite)
			}
			ca, cb := da.Counters(), db.Counters()
			// A CNP may still be on its way to A after A's last completion.
			for deadline := time.Now().Add(10 * time.Second); on && ca.RPCNPHandled == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
				ca, cb = da.Counters(), db.Counters()
			}
			ect, other := relay.ect.Load(), relay.other.Load()
			t.Logf("A's datagrams: %d ECT, %d Not-ECT; B: np_ecn_marked_roce_packets %d, np_cnp_sent %d; A: rp_cnp_handled %d, rp_cnp_ignored %d",
				ect, other, cb.NPECNMarked, cb.NPCNPSent, ca.RPCNPHandled, ca.RPCNPIgnored)
			if !on {
				if ect != 0 || other == 0 {
					t.Fatalf("ECT %d, Not-ECT %d datagrams", ect, other)
				}
				if cb.NPECNMarked+cb.NPCNPSent+ca.RPCNPHandled+ca.RPCNPIgnored != 0 {
					t.Fatalf("counters %v / %v", ca.Map(), cb.Map())
				}
				return
			}
			if other != 0 || ect == 0 {
				t.Fatalf("ECT %d, Not-ECT %d datagrams", ect, other)
			}
			if cb.NPECNMarked == 0 || uint64(ect) < cb.NPECNMarked || cb.NPCNPSent == 0 || cb.NPCNPSent > cb.NPECNMarked {
				t.Fatalf("B: np_ecn_marked_roce_packets %d of %d marked, np_cnp_sent %d", cb.NPECNMarked, ect, cb.NPCNPSent)
			}
			// CNPs go straight to A, and the loopback may drop some of
			// them under load: at least one arrives and cut the rate.
			if ca.RPCNPHandled == 0 || ca.RPCNPHandled+ca.RPCNPIgnored > cb.NPCNPSent {
				t.Fatalf("A: rp_cnp_handled %d, rp_cnp_ignored %d; B sent %d", ca.RPCNPHandled, ca.RPCNPIgnored, cb.NPCNPSent)
			}
		})
	}
}
