package roce

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
	macA  = net.HardwareAddr{2, 0, 0, 0, 0, 0x0a}
	macB  = net.HardwareAddr{2, 0, 0, 0, 0, 0x0b}
)

// memPair opens two devices joined by a memlink pair.
func memPair(t testing.TB, ab, ba faultnet.Config, capA *bytes.Buffer) (*Device, *Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: ab, BtoA: ba, HardwareAddrA: macA, HardwareAddrB: macB})
	return openPair(t, la, lb, addrA, addrB, capA)
}

func openPair(t testing.TB, la, lb link.Link, a, b netip.Addr, capA *bytes.Buffer) (*Device, *Device) {
	t.Helper()
	var oa Options
	if capA != nil {
		oa.Capture = capA
	}
	return openPairWith(t, la, lb, a, b, oa)
}

// openPairWith opens A on la with oa (its addresses and neighbours filled
// in) and B on lb with the defaults; both close with the test.
func openPairWith(t testing.TB, la, lb link.Link, a, b netip.Addr, oa Options) (*Device, *Device) {
	t.Helper()
	oa.Addrs = []netip.Addr{a}
	oa.Neighbours = map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}
	da, err := OpenLink(la, oa)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// endpoint is one side of a test connection.
type endpoint struct {
	d        *Device
	pd       *PD
	scq, rcq *CQ
	qp       *QP
	mr       *MR
	buf      []byte
}

func newEndpoint(t testing.TB, d *Device, typ QPType, bufSize int) *endpoint {
	t.Helper()
	e := &endpoint{d: d}
	var err error
	if e.pd, err = d.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = d.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(&QPInitAttr{Type: typ, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: QPCap{MaxSendWR: 256, MaxRecvWR: 256}}); err != nil {
		t.Fatal(err)
	}
	e.buf = make([]byte, bufSize)
	if e.mr, err = e.pd.RegisterMR(e.buf, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	return e
}

// connect brings two RC/UC/UD endpoints to RTS against each other.
func connect(t testing.TB, a, b *endpoint, addrA, addrB netip.Addr, c ConnectAttr) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ca := c
	ca.RemoteQPN, ca.RemoteAddr, ca.LocalPSN, ca.RemotePSN = b.qp.QPN(), addrB, 100, 200000
	if c.QKey == 0 {
		ca.QKey = 0x1234
	}
	if err := a.qp.Connect(ctx, &ca); err != nil {
		t.Fatal(err)
	}
	cb := c
	cb.RemoteQPN, cb.RemoteAddr, cb.LocalPSN, cb.RemotePSN = a.qp.QPN(), addrA, 200000, 100
	if c.QKey == 0 {
		cb.QKey = 0x1234
	}
	if err := b.qp.Connect(ctx, &cb); err != nil {
		t.Fatal(err)
	}
}

// waitWC waits for one completion on cq and returns it.
func waitWC(t testing.TB, cq *CQ, timeout time.Duration) WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wc [1]WorkCompletion
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func wantOK(t testing.TB, wc WorkCompletion, op WCOpcode) {
	t.Helper()
	if wc.Status != WCSuccess || wc.Opcode != op {
		t.Fatalf("completion %+v: status %v opcode %v, want success %v", wc, wc.Status, wc.Opcode, op)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}
