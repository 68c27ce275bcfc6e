//go:build linux

package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/faultnet"
)

const testDCKey = 0xffeeddcc

// dcTarget is a DCT with its SRQ, CQ and a registered buffer.
type dcTarget struct {
	pd  *PD
	cq  *CQ
	srq *SRQ
	qp  *QP
	mr  *MR
	buf []byte
}

func newDCT(t testing.TB, d *Device, size int) *dcTarget {
	t.Helper()
	x := &dcTarget{}
	var err error
	if x.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if x.cq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if x.srq, err = x.pd.CreateSRQ(SRQAttr{MaxWR: 256, MaxSGE: 1}); err != nil {
		t.Fatal(err)
	}
	if x.qp, err = x.pd.CreateQP(&QPInitAttr{Type: DCT, SendCQ: x.cq, RecvCQ: x.cq, SRQ: x.srq,
		DC: DCInitAttr{Key: testDCKey}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.qp.ActivateDC(ctx, &DCAttr{}); err != nil {
		t.Fatal(err)
	}
	x.buf = make([]byte, size)
	if x.mr, err = x.pd.RegisterMR(x.buf, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	return x
}

// exerciseDC runs every DC operation from one DCI on da to three DCTs on db,
// switching target on every work request, and checks data and completions.
func exerciseDC(t *testing.T, da, db *Device, ipA, ipB netip.Addr, n int) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A %v %+v", da.Counters().Map(), da.DCCounters())
			t.Logf("B %v %+v", db.Counters().Map(), db.DCCounters())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pd, err := da.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := da.CreateCQ(1024)
	if err != nil {
		t.Fatal(err)
	}
	dci, err := pd.CreateQP(&QPInitAttr{Type: DCI, SendCQ: scq, RecvCQ: scq, Cap: QPCap{MaxSendWR: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := dci.ActivateDC(ctx, &DCAttr{LocalPSN: ib.PSNMask - 5}); err != nil {
		t.Fatal(err)
	}
	if dci.Type() != DCI {
		t.Fatalf("type %v", dci.Type())
	}
	ah, err := pd.CreateAH(ctx, AddressVector{DGID: ib.GIDFromAddr(ipB)})
	if err != nil {
		t.Fatal(err)
	}
	const slot = 5 * 4096
	local := make([]byte, 4*slot*3)
	fill(local, 3)
	lmr, err := pd.RegisterMR(local, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	var dcts []*dcTarget
	for i := 0; i < 3; i++ {
		x := newDCT(t, db, 4*slot)
		fill(x.buf, byte(40+i))
		dcts = append(dcts, x)
	}
	// Per target j, op k: WRITE to slot 0, SEND into slot 1 (via the SRQ),
	// READ from slot 2 into local, FETCH_ADD at slot 3.
	ops := []WROpcode{WRRDMAWrite, WRSend, WRRDMARead, WRAtomicFetchAndAdd, WRRDMAWriteWithImm}
	for round := 0; round < n; round++ {
		for k, op := range ops {
			j := (round + k) % len(dcts)
			x := dcts[j]
			lo := (j*4 + k%4) * slot
			size := slot
			if op == WRSend {
				size = 3000
			}
			wr := SendWR{ID: uint64(round*100 + k), Opcode: op, Flags: SendSignaled, AH: ah, RemoteQPN: x.qp.QPN(), DCKey: testDCKey,
				SGL: []SGE{lmr.SGE(lo, size)}, RKey: x.mr.RKey(), Imm: uint32(round)}
			switch op {
			case WRRDMAWrite, WRRDMAWriteWithImm:
				wr.RemoteAddr = x.mr.Addr()
			case WRSend:
				if err := x.srq.PostRecv(&RecvWR{ID: uint64(round), SGL: []SGE{x.mr.SGE(slot, slot)}}); err != nil {
					t.Fatal(err)
				}
			case WRRDMARead:
				wr.RemoteAddr = x.mr.Addr() + 2*slot
			case WRAtomicFetchAndAdd:
				wr.SGL = []SGE{lmr.SGE(lo, 8)}
				wr.RemoteAddr, wr.CompareAdd = x.mr.Addr()+3*slot, 1
			}
			if op == WRRDMAWriteWithImm {
				if err := x.srq.PostRecv(&RecvWR{ID: uint64(round)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := dci.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, scq, 20*time.Second)
			if wc.Status != WCSuccess || wc.WRID != wr.ID {
				t.Fatalf("round %d %v to DCT %d: %+v (%v)", round, op, j, wc, wc.Status)
			}
			switch op {
			case WRRDMAWrite, WRRDMAWriteWithImm:
				x.mr.Sync()
				if !bytes.Equal(x.buf[:slot], local[lo:lo+slot]) {
					t.Fatalf("round %d: WRITE to DCT %d differs", round, j)
				}
			case WRSend:
				r := waitWC(t, x.cq, 20*time.Second)
				if r.Status != WCSuccess || r.ByteLen != 3000 || !bytes.Equal(x.buf[slot:slot+3000], local[lo:lo+3000]) {
					t.Fatalf("round %d: SEND to DCT %d: %+v", round, j, r)
				}
			case WRRDMARead:
				if !bytes.Equal(local[lo:lo+slot], x.buf[2*slot:3*slot]) {
					t.Fatalf("round %d: READ from DCT %d differs", round, j)
				}
			case WRAtomicFetchAndAdd:
				x.mr.Sync()
				if binary.NativeEndian.Uint64(local[lo:]) != binary.NativeEndian.Uint64(x.buf[3*slot:])-1 {
					t.Fatalf("round %d: FETCH_ADD original", round)
				}
			}
			if op == WRRDMAWriteWithImm {
				if r := waitWC(t, x.cq, 20*time.Second); r.Status != WCSuccess || r.Imm != uint32(round) {
					t.Fatalf("round %d: WRITE_WITH_IMM receive %+v", round, r)
				}
			}
		}
	}
	// A wrong key is refused and counted, at both ends.
	wr := SendWR{ID: 9999, Opcode: WRRDMAWrite, Flags: SendSignaled, AH: ah, RemoteQPN: dcts[0].qp.QPN(), DCKey: testDCKey + 1,
		SGL: []SGE{lmr.SGE(0, 8)}, RemoteAddr: dcts[0].mr.Addr(), RKey: dcts[0].mr.RKey()}
	if err := dci.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, scq, 20*time.Second); wc.Status != WCRemAccessErr {
		t.Fatalf("wrong key: %v", wc.Status)
	}
	a, b := da.DCCounters(), db.DCCounters()
	if a.ConnectsSent == 0 || a.TargetSwitches < uint64(len(ops)*n/2) || b.ConnectsRcvd == 0 || b.BadKey == 0 {
		t.Fatalf("DC counters: A %+v, B %+v", a, b)
	}
	if c := db.Counters(); c.ICRCErr != 0 || c.BadFrame != 0 {
		t.Fatalf("B counters: %v", c.Map())
	}
}

func TestDCMemlink(t *testing.T) {
	var capA bytes.Buffer
	d := 3 * time.Microsecond
	da, db := memPair(t, faultnet.Config{Seed: 1, Loss: 0.1, Reorder: 0.05, ReorderDepth: 3, Duplicate: 0.02, Delay: d},
		faultnet.Config{Seed: 2, Loss: 0.1, Duplicate: 0.02, Delay: d}, &capA)
	exerciseDC(t, da, db, addrA, addrB, 6)
	da.Close()
	// Every captured frame is well-formed RoCEv2 with a good ICRC and
	// decodes as DC.
	r, err := pcapgo.NewReader(bytes.NewReader(capA.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var p ib.Packet
	ops := map[ib.Opcode]int{}
	for {
		data, _, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if err := ib.ParseDC(data, &p); err != nil {
			t.Fatalf("frame: %v", err)
		}
		if err := p.VerifyICRC(); err != nil || binary.BigEndian.Uint16(p.UDP[2:]) != ib.RoCEv2Port {
			t.Fatalf("%v: %v", p.Info.Name, err)
		}
		ops[p.BTH.Opcode()]++
	}
	checkTsharkDC(t, capA.Bytes())
	for _, op := range []ib.Opcode{ib.DCConnect, ib.DCWriteFirst, ib.DCWriteLast, ib.DCSendFirst, ib.DCReadRequest,
		ib.DCReadResponseFirst, ib.DCFetchAdd, ib.DCAtomicAck, ib.DCAck, ib.DCWriteLastImm} {
		if ops[op] == 0 {
			t.Errorf("no %v in the capture (%v)", ib.DCInfo(op).Name, ops)
		}
	}
}

// DC between two network namespaces over AF_XDP.
func TestNetnsDCXDP(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 1500)
	da := openIn(t, p.VethA, xdpLink, Options{})
	db := openIn(t, p.VethB, xdpLink, Options{})
	exerciseDC(t, da, db, p.VethA.Addr.Addr(), p.VethB.Addr.Addr(), 4)
}

// checkTsharkDC has Wireshark, the one public DC decoder, read a capture of
// goroce DC traffic: every DC packet but CONNECT (which Wireshark leaves
// undecoded) gets a DC name and no frame is malformed.
func checkTsharkDC(t *testing.T, pcap []byte) {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Log("tshark not installed: Wireshark's reading of the DC frames not checked")
		return
	}
	f := filepath.Join(t.TempDir(), "dc.pcap")
	if err := os.WriteFile(f, pcap, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("tshark", "-r", f, "-T", "fields", "-e", "frame.number", "-e", "_ws.col.Info", "-e", "_ws.malformed").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		c := strings.Split(l, "\t")
		if len(c) < 2 || !strings.HasPrefix(c[1], "DC ") || (len(c) > 2 && c[2] != "") {
			t.Fatalf("tshark: %q", l)
		}
		n++
	}
	if n == 0 {
		t.Fatal("tshark decoded nothing")
	}
}
