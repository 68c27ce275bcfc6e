package roce

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
)

// ceLink marks every ECN-capable frame it sends CE, as a congested switch
// port would, and counts the ECN fields it saw.
type ceLink struct {
	*memlink.Link
	ect, notECT atomic.Int64
}

func (l *ceLink) WriteBatch(frames [][]byte) (int, error) {
	for _, f := range frames {
		fr, err := link.ParseFrame(f)
		if err != nil {
			continue
		}
		if fr.TOS&3 == 0 {
			l.notECT.Add(1)
			continue
		}
		l.ect.Add(1)
		ip := f[fr.IPOffset:]
		if fr.Version == 4 {
			ip[1] |= 3
			ip[10], ip[11] = 0, 0
			c := link.IPv4Checksum(ip[:link.IPv4Size])
			ip[10], ip[11] = byte(c>>8), byte(c)
		}
	}
	return l.Link.WriteBatch(frames)
}

func ccPair(t *testing.T, cc CCConfig) (*ceLink, *Device, *Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	ml := &ceLink{Link: la}
	da, err := OpenLink(ml, Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: macB}, CC: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: macA}, CC: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return ml, da, db
}

// TestCCDevice runs RC WRITEs from A to B through a link that marks A's
// ECN-capable frames CE: with congestion control on, A sends ECT(0), B
// answers marks with CNPs, and A's QP is rate-limited; with it off, A
// sends Not-ECT and nothing of it happens.
func TestCCDevice(t *testing.T) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		t.Run(name, func(t *testing.T) {
			ml, da, db := ccPair(t, CCConfig{DCQCN: on})
			a, b := newEndpoint(t, da, RC, 1<<16), newEndpoint(t, db, RC, 1<<16)
			connect(t, a, b, addrA, addrB, ConnectAttr{})
			const msgs, size = 8, 8192
			for i := range msgs {
				if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled,
					SGL: []SGE{a.mr.SGE(0, size)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
					t.Fatal(err)
				}
			}
			for range msgs {
				wantOK(t, waitWC(t, a.scq, 10*time.Second), WCRDMAWrite)
			}
			// A CNP B sent for the last frames may still be on its way to
			// A when A's last completion arrives: wait until A has seen
			// every CNP B sent.
			ca, cb := da.Counters(), db.Counters()
			for deadline := time.Now().Add(10 * time.Second); ca.RPCNPHandled+ca.RPCNPIgnored != cb.NPCNPSent && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
				ca, cb = da.Counters(), db.Counters()
			}
			rate, limited := a.qp.CCRate()
			if !on {
				if ml.ect.Load() != 0 || ml.notECT.Load() == 0 {
					t.Fatalf("ECT %d, Not-ECT %d frames", ml.ect.Load(), ml.notECT.Load())
				}
				if cb.NPECNMarked+cb.NPCNPSent+ca.RPCNPHandled+ca.RPCNPIgnored != 0 || limited || rate != 0 {
					t.Fatalf("counters %+v / %+v, rate %d %v", ca, cb, rate, limited)
				}
				return
			}
			if ml.notECT.Load() != 0 || ml.ect.Load() == 0 {
				t.Fatalf("ECT %d, Not-ECT %d frames", ml.ect.Load(), ml.notECT.Load())
			}
			if cb.NPECNMarked == 0 || cb.NPCNPSent == 0 || cb.NPCNPSent > cb.NPECNMarked {
				t.Fatalf("B: np_ecn_marked_roce_packets %d, np_cnp_sent %d", cb.NPECNMarked, cb.NPCNPSent)
			}
			if ca.RPCNPHandled == 0 || ca.RPCNPHandled+ca.RPCNPIgnored != cb.NPCNPSent {
				t.Fatalf("A: rp_cnp_handled %d, rp_cnp_ignored %d; B sent %d", ca.RPCNPHandled, ca.RPCNPIgnored, cb.NPCNPSent)
			}
			if ca.BadFrame+ca.RcvdDropped+ca.UnknownQP != 0 {
				t.Fatalf("A dropped CNPs: %+v", ca)
			}
			// The rate may have recovered by now on a slow machine; the
			// lowest rate seen is not kept, so only its bounds are checked.
			if rate <= 0 || rate > 10e9 {
				t.Fatalf("rate %d", rate)
			}
		})
	}
}

// tosLink records the default TOS a device gives its link.
type tosLink struct {
	*memlink.Link
	tos   atomic.Int32
	calls atomic.Int32
}

func (l *tosLink) SetDefaultTOS(tos uint8) error {
	l.tos.Store(int32(tos))
	l.calls.Add(1)
	return nil
}

// TestCCDefaultTOS: a device gives a link that takes one (the kernel UDP
// link) the TOS most of its packets carry, Options.DSCP with ECT(0) under
// congestion control, so that they need no per-packet TOS; with neither
// the link is left alone.
func TestCCDefaultTOS(t *testing.T) {
	for _, c := range []struct {
		on   bool
		dscp uint8
		want int32 // -1: not called
	}{{false, 0, -1}, {true, 0, 2}, {false, 26, 26 << 2}, {true, 26, 26<<2 | 2}} {
		la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
		defer lb.Close()
		l := &tosLink{Link: la}
		l.tos.Store(-1)
		d, err := OpenLink(l, Options{Addrs: []netip.Addr{addrA}, CC: CCConfig{DCQCN: c.on}, DSCP: c.dscp})
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		if c.want < 0 && l.calls.Load() != 0 || c.want >= 0 && (l.calls.Load() != 1 || l.tos.Load() != c.want) {
			t.Errorf("CC %v, DSCP %d: SetDefaultTOS called %d times, last with %#x", c.on, c.dscp, l.calls.Load(), l.tos.Load())
		}
	}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	defer la.Close()
	defer lb.Close()
	if d, err := OpenLink(la, Options{Addrs: []netip.Addr{addrA}, DSCP: 64}); err == nil {
		d.Close()
		t.Error("DSCP 64 accepted")
	}
}

// tosTap records the traffic classes of the frames a link sends, CNPs
// apart.
type tosTap struct {
	*memlink.Link
	mu         sync.Mutex
	data, cnps map[uint8]int
}

func (l *tosTap) WriteBatch(frames [][]byte) (int, error) {
	l.mu.Lock()
	for _, f := range frames {
		fr, err := link.ParseFrame(f)
		if err != nil {
			continue
		}
		if ib.BTH(f[fr.Payload:]).Opcode() == ib.CNP {
			l.cnps[fr.TOS]++
		} else {
			l.data[fr.TOS]++
		}
	}
	l.mu.Unlock()
	return l.Link.WriteBatch(frames)
}

// TestDSCP: with Options.DSCP, a QP of traffic class 0 sends its requests
// and B its ACKs with that DSCP (and ECT(0) under congestion control),
// and B's CNPs leave with the CNP DSCP, 48 by default.
func TestDSCP(t *testing.T) {
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	ml := &ceLink{Link: la}
	tapB := &tosTap{Link: lb, data: map[uint8]int{}, cnps: map[uint8]int{}}
	cc := CCConfig{DCQCN: true}
	da, err := OpenLink(ml, Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: macB}, CC: cc, DSCP: 26})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(tapB, Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: macA}, CC: cc, DSCP: 26})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a, b := newEndpoint(t, da, RC, 1<<16), newEndpoint(t, db, RC, 1<<16)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	for i := range 4 {
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{a.mr.SGE(0, 8192)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		wantOK(t, waitWC(t, a.scq, 10*time.Second), WCRDMAWrite)
	}
	tapB.mu.Lock()
	defer tapB.mu.Unlock()
	// A's frames are ECT(0) before ceLink marks them CE.
	if ml.ect.Load() == 0 || ml.notECT.Load() != 0 {
		t.Errorf("A sent %d ECT, %d Not-ECT frames", ml.ect.Load(), ml.notECT.Load())
	}
	if len(tapB.data) != 1 || tapB.data[26<<2|2] == 0 {
		t.Errorf("B's ACKs by traffic class: %v, want all %#x", tapB.data, 26<<2|2)
	}
	if len(tapB.cnps) != 1 || tapB.cnps[48<<2] == 0 {
		t.Errorf("B's CNPs by traffic class: %v, want all %#x", tapB.cnps, 48<<2)
	}
}
