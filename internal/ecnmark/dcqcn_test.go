//go:build linux

package ecnmark_test

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/ecnmark"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

// openDev opens a device on a kernel UDP link bound to v's address, in
// v's namespace.
func openDev(t *testing.T, v *netnstest.Veth, cc roce.CCConfig) (*roce.Device, *udplink.Link) {
	t.Helper()
	var d *roce.Device
	var l *udplink.Link
	if err := v.NS.Do(func() (err error) {
		l, err = udplink.Listen(netip.AddrPortFrom(v.Addr.Addr(), ib.RoCEv2Port))
		if err != nil {
			return err
		}
		if d, err = roce.OpenLink(l, roce.Options{Addrs: []netip.Addr{v.Addr.Addr()}, CC: cc}); err != nil {
			l.Close()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, l
}

type end struct {
	qp  *roce.QP
	scq *roce.CQ
	mr  *roce.MR
}

func newEnd(t *testing.T, d *roce.Device, size int) *end {
	t.Helper()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := d.CreateCQ(1024)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := d.CreateCQ(1024)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: scq, RecvCQ: rcq, Cap: roce.QPCap{MaxSendWR: 256, MaxRecvWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegisterMR(make([]byte, size), roce.AccessLocalWrite|roce.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	return &end{qp: q, scq: scq, mr: mr}
}

// stream sends msgs RDMA WRITEs of size bytes from a to b, depth at a
// time, calling each after every completion it takes, and returns how
// long they took.
func stream(t *testing.T, a, b *end, msgs, size, depth int, each func()) time.Duration {
	t.Helper()
	start := time.Now()
	posted, done := 0, 0
	for done < msgs {
		for posted < msgs && posted-done < depth {
			if err := a.qp.PostSend(&roce.SendWR{ID: uint64(posted), Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
				SGL: []roce.SGE{a.mr.SGE(0, size)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		var wc [16]roce.WorkCompletion
		n := a.scq.Poll(wc[:])
		for _, c := range wc[:n] {
			if c.Status != roce.WCSuccess {
				t.Fatalf("WRITE %d: %v", c.WRID, c.Status)
			}
		}
		done += n
		if n > 0 {
			each()
		}
		if n == 0 {
			if err := a.scq.WaitDeadline(time.Now().Add(30 * time.Second)); err != nil {
				t.Fatalf("after %d of %d WRITEs: %v", done, msgs, err)
			}
		}
	}
	return time.Since(start)
}

// TestDCQCNOverVeth runs a stream of RDMA WRITEs between two goroce
// devices on kernel UDP links in two namespaces, through a veth whose
// sending end marks every 8th ECN-capable RoCE packet CE. With congestion
// control on, the sender's packets leave ECT(0) and some are marked, the
// receiver counts the marks and sends CNPs, and the sender handles them
// and runs below its line rate (DCQCN's MaxRate); with it off, the
// packets are Not-ECT, nothing is marked and no CNP moves.
//
// With GRO on at the receiving veth end (and its NAPI threaded, so that
// it meets more than one datagram at a time), the kernel coalesces most
// datagrams into runs, which reach the link as one buffer with one TOS:
// B still counts exactly the marks made, because GRO never puts
// datagrams of different TOS in one run (a CE-marked datagram ends the
// run it would have joined).
func TestDCQCNOverVeth(t *testing.T) {
	const every, msgs, size, depth = 8, 200, 64 << 10, 16
	for _, c := range []struct {
		name    string
		on, gro bool
	}{{"off", false, false}, {"on", true, false}, {"on,GRO", true, true}} {
		on := c.on
		t.Run(c.name, func(t *testing.T) {
			p := readyPair(t)
			if c.gro {
				// veth coalesces (NAPI GRO) when GRO is on at the
				// receiving end; a sending end with TSO hands it a
				// socket's datagrams only with UDP GRO forwarding on too.
				var out bytes.Buffer
				cmd := exec.Command("ethtool", "-K", p.VethB.Name, "gro", "on", "rx-udp-gro-forwarding", "on")
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := p.B.Run(cmd); err != nil {
					t.Skipf("ethtool -K %s gro on rx-udp-gro-forwarding on: %v %s", p.VethB.Name, err, out.String())
				}
				threaded(t, p.VethB)
			}
			m := attach(t, p.VethA, ecnmark.Options{Every: every})
			cc := roce.CCConfig{DCQCN: on}
			da, _ := openDev(t, p.VethA, cc)
			db, lb := openDev(t, p.VethB, cc)
			a, b := newEnd(t, da, size), newEnd(t, db, size)
			ctx := t.Context()
			ca := roce.ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: p.VethB.Addr.Addr(), LocalPSN: 100, RemotePSN: 200, PathMTU: ib.MTU1024}
			cb := roce.ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: p.VethA.Addr.Addr(), LocalPSN: 200, RemotePSN: 100, PathMTU: ib.MTU1024}
			if err := a.qp.Connect(ctx, &ca); err != nil {
				t.Fatal(err)
			}
			if err := b.qp.Connect(ctx, &cb); err != nil {
				t.Fatal(err)
			}
			// The lowest DCQCN rate while the stream runs, looked at as
			// completions come in.
			minRate := int64(0)
			took := stream(t, a, b, msgs, size, depth, func() {
				if r := da.CCMinRate(); r > 0 && (minRate == 0 || r < minRate) {
					minRate = r
				}
			})
			endRate, _ := a.qp.CCRate()
			s, err := m.Stats()
			if err != nil {
				t.Fatal(err)
			}
			ctA, ctB := da.Counters(), db.Counters()
			gbps := float64(msgs*size*8) / took.Seconds() / 1e9
			t.Logf("%d×%d B WRITEs in %v (%.2f Gb/s); marker: %d ECT, %d marked CE, %d Not-ECT; "+
				"B: np_ecn_marked_roce_packets %d, np_cnp_sent %d, GRO %d datagrams in %d buffers; A: rp_cnp_handled %d, rp_cnp_ignored %d, DCQCN rate lowest %.3f Gb/s, at the end %.3f Gb/s",
				msgs, size, took, gbps, s.ECT, s.Marked, s.NotECT, ctB.NPECNMarked, ctB.NPCNPSent, lb.Stats().GRODatagrams, lb.Stats().GROBuffers,
				ctA.RPCNPHandled, ctA.RPCNPIgnored, float64(minRate)/1e9, float64(endRate)/1e9)
			if !on {
				if s.ECT != 0 || s.Marked != 0 || s.NotECT == 0 {
					t.Errorf("marker %+v: want only Not-ECT packets", s)
				}
				if ctB.NPECNMarked+ctB.NPCNPSent+ctA.RPCNPHandled+ctA.RPCNPIgnored != 0 || minRate != 0 {
					t.Errorf("congestion control moved while off: A %v, B %v, rate %d", ctA.Map(), ctB.Map(), minRate)
				}
				return
			}
			if s.NotECT != 0 || s.ECT == 0 || s.Marked == 0 || s.Marked > s.ECT/every+1 {
				t.Errorf("marker %+v: want only ECT packets, one in %d marked", s, every)
			}
			// Marked packets may be lost on the way (a full socket buffer):
			// B counts no more marks than were made, and some.
			if ctB.NPECNMarked == 0 || ctB.NPECNMarked > s.Marked || ctB.NPCNPSent == 0 || ctB.NPCNPSent > ctB.NPECNMarked {
				t.Errorf("B: np_ecn_marked_roce_packets %d (of %d marked), np_cnp_sent %d", ctB.NPECNMarked, s.Marked, ctB.NPCNPSent)
			}
			if c.gro {
				if lb.Stats().GROBuffers == 0 {
					t.Skipf("B's link got no coalesced datagrams: this kernel's veth does not coalesce")
				}
				// Loss aside, every mark made is counted: none was
				// coalesced behind an unmarked datagram's TOS.
				if ctB.NPECNMarked != s.Marked && ctB.RcvdPkts >= s.ECT {
					t.Errorf("with GRO B counted %d CE-marked packets of %d marked", ctB.NPECNMarked, s.Marked)
				}
			}
			if ctA.RPCNPHandled == 0 || ctA.RPCNPHandled+ctA.RPCNPIgnored > ctB.NPCNPSent {
				t.Errorf("A: rp_cnp_handled %d, rp_cnp_ignored %d; B sent %d", ctA.RPCNPHandled, ctA.RPCNPIgnored, ctB.NPCNPSent)
			}
			if minRate == 0 || minRate >= (roce.DCQCNParams{}).MaxRate && minRate >= 10e9 {
				t.Errorf("lowest DCQCN rate %d b/s: the sender was never held below its line rate", minRate)
			}
		})
	}
}

// threaded runs v's NAPI in a kernel thread (sysfs "threaded"), so that
// it polls the datagrams a sender queued meanwhile in one go, and GRO
// has runs to coalesce; run in the softirq of each send, it meets one
// datagram at a time. sysfs shows the network namespace of whoever
// mounts it: it is mounted from v's namespace for the write.
func threaded(t *testing.T, v *netnstest.Veth) {
	t.Helper()
	dir := t.TempDir()
	err := v.NS.Do(func() error {
		if err := unix.Mount("sysfs", dir, "sysfs", 0, ""); err != nil {
			return err
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		return os.WriteFile(filepath.Join(dir, "class/net", v.Name, "threaded"), []byte("1"), 0)
	})
	if err != nil {
		t.Skipf("threaded NAPI on %s: %v", v.Name, err)
	}
}
