package emulator_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	hostAddr = netip.MustParseAddr("10.0.0.1")
	fpgaAddr = netip.MustParseAddr("10.0.0.2")
)

// receiver is a plain verbs RC QP in Rogue's setup: receives posted, RQ
// PSN = the PSN the FPGA was told to start at.
type receiver struct {
	qp   *roce.QP
	cq   *roce.CQ
	mr   *roce.MR
	psn  uint32
	sges []roce.SGE // one per slot of 4096 bytes, for reposts that allocate nothing
}

// sgl returns slot i's scatter list (4096-byte slots).
func (r *receiver) sgl(i int) []roce.SGE {
	if r.sges == nil {
		r.sges = make([]roce.SGE, r.mr.Len()/4096)
		for k := range r.sges {
			r.sges[k] = r.mr.SGE(k*4096, 4096)
		}
	}
	return r.sges[i : i+1 : i+1]
}

func setup(t *testing.T, cfg emulator.Config, slot, depth int) (*receiver, *emulator.Emulator) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}, MTU: 9000})
	host, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{hostAddr}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{fpgaAddr: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	fdev, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{fpgaAddr}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{hostAddr: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fdev.Close() })
	pd, _ := host.AllocPD()
	r := &receiver{psn: 0xFFFFF0} // near the wrap
	r.cq, _ = host.CreateCQ(2 * depth)
	if r.qp, err = pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: r.cq, RecvCQ: r.cq, Cap: roce.QPCap{MaxRecvWR: depth}}); err != nil {
		t.Fatal(err)
	}
	if r.mr, err = pd.RegisterMR(make([]byte, slot*depth), roce.AccessLocalWrite|roce.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	e, err := emulator.New(fdev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Send(ctx, 1, []byte{1}); !errors.Is(err, emulator.ErrNotConnected) {
		t.Fatalf("send before Connect: %v", err)
	}
	p, err := e.Connect(ctx, emulator.HostParams{QPN: r.qp.QPN(), GID: ib.GIDFromAddr(hostAddr), RqPSN: 77, SqPSN: r.psn,
		MRAddr: r.mr.Addr(), MRRKey: r.mr.RKey(), MaxPayload: slot, Depth: depth})
	if err != nil {
		t.Fatal(err)
	}
	if p.RqPSN != r.psn || p.SqPSN != r.psn || p.GID != ib.GIDFromAddr(fpgaAddr) {
		t.Fatalf("FPGA params %+v: want PSN %#x (the host's SqPSN)", p, r.psn)
	}
	if err := r.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: p.QPN, RemoteAddr: fpgaAddr, RemotePSN: p.RqPSN, LocalPSN: 5,
		PathMTU: ib.MTU4096, MinRNRTimer: 1}); err != nil {
		t.Fatal(err)
	}
	// Posted before the first frame is sent (Rogue posts before RTR).
	for i := 0; i < depth; i++ {
		if err := r.qp.PostRecv(&roce.RecvWR{ID: uint64(i), SGL: []roce.SGE{r.mr.SGE(i*slot, slot)}}); err != nil {
			t.Fatal(err)
		}
	}
	return r, e
}

func (r *receiver) next(t *testing.T) roce.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]roce.WorkCompletion
	for r.cq.Poll(wc[:]) == 0 {
		if err := r.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if wc[0].Status != roce.WCSuccess {
		t.Fatalf("completion %+v", wc[0])
	}
	return wc[0]
}

// Gen 2: one SEND WITH IMMEDIATE per frame, immediate (counter << 8) |
// channel, the first at the host's SqPSN (across the PSN wrap).
func TestSendFormat(t *testing.T) {
	r, e := setup(t, emulator.Config{}, 4096, 32)
	ctx := context.Background()
	for i := 0; i < 32; i++ {
		if err := e.Send(ctx, uint8(i), make([]byte, 1+i*100)); err != nil {
			t.Fatal(err)
		}
		wc := r.next(t)
		if wc.Opcode != roce.WCRecv || wc.Flags&roce.WCWithImm == 0 || wc.Imm != uint32(i)<<8|uint32(i) || wc.ByteLen != uint32(1+i*100) {
			t.Fatalf("frame %d: %+v", i, wc)
		}
	}
	if err := e.Flush(ctx); err != nil || e.Outstanding() != 0 {
		t.Fatal(err)
	}
	if err := e.Send(ctx, 1, make([]byte, 4097)); !errors.Is(err, emulator.ErrTooLarge) {
		t.Fatalf("oversize: %v", err)
	}
	if err := e.Send(ctx, 1, nil); !errors.Is(err, emulator.ErrEmpty) {
		t.Fatalf("empty: %v", err)
	}
	if st := e.Stats(); st.Frames != 32 || st.Errors != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// Gen 1: RDMA WRITE WITH IMMEDIATE at MRAddr + (counter mod depth)·slot,
// the counter wrapping at the depth (the firmware's AddrWrapCount).
func TestWriteFormat(t *testing.T) {
	const slot, depth = 1000, 4
	r, e := setup(t, emulator.Config{Write: true}, slot, depth)
	ctx := context.Background()
	if err := e.Send(ctx, 1, make([]byte, slot+1)); !errors.Is(err, emulator.ErrTooLarge) {
		t.Fatalf("frame larger than the host's slot: %v", err)
	}
	for i := 0; i < 3*depth; i++ {
		b := make([]byte, 10+i)
		for j := range b {
			b[j] = byte(i + 1)
		}
		if err := e.Send(ctx, 2, b); err != nil {
			t.Fatal(err)
		}
		wc := r.next(t)
		k := i % depth
		if wc.Opcode != roce.WCRecvRDMAWithImm || wc.Imm != uint32(k)<<8|2 || wc.ByteLen != uint32(10+i) {
			t.Fatalf("frame %d: %+v", i, wc)
		}
		got := r.mr.Bytes()[k*slot : k*slot+10+i]
		for _, c := range got {
			if c != byte(i+1) {
				t.Fatalf("frame %d not at slot %d", i, k)
			}
		}
		if err := r.qp.PostRecv(&roce.RecvWR{ID: uint64(k), SGL: []roce.SGE{r.mr.SGE(k*slot, slot)}}); err != nil {
			t.Fatal(err)
		}
	}
}

// SendBatch posts what the ring holds at once and waits for room like
// Send: more frames than ring slots arrive in order with their counters and
// bytes; an invalid frame stops the batch there with its error; a batch
// allocates nothing.
func TestSendBatch(t *testing.T) {
	const depth = 64
	r, e := setup(t, emulator.Config{RingSlots: 8}, 4096, depth)
	ctx := context.Background()
	frames := make([][]byte, 20)
	for i := range frames {
		frames[i] = make([]byte, 1+i*200)
		for j := range frames[i] {
			frames[i][j] = byte(i)
		}
	}
	check := func(i int, wc roce.WorkCompletion, first uint32) {
		t.Helper()
		if wc.Opcode != roce.WCRecv || wc.Imm != (first+uint32(i))<<8|3 || wc.ByteLen != uint32(len(frames[i])) {
			t.Fatalf("frame %d: %+v", i, wc)
		}
		slot := int(wc.WRID)
		for _, c := range r.mr.Bytes()[slot*4096 : slot*4096+len(frames[i])] {
			if c != byte(i) {
				t.Fatalf("frame %d: wrong bytes", i)
			}
		}
		if err := r.qp.PostRecv(&roce.RecvWR{ID: wc.WRID, SGL: []roce.SGE{r.mr.SGE(slot*4096, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := e.SendBatch(ctx, 3, frames); n != len(frames) || err != nil {
		t.Fatalf("SendBatch: %d, %v", n, err)
	}
	for i := range frames {
		check(i, r.next(t), 0)
	}
	bad := [][]byte{frames[0], frames[1], nil, frames[3]}
	if n, err := e.SendBatch(ctx, 3, bad); n != 2 || !errors.Is(err, emulator.ErrEmpty) {
		t.Fatalf("batch with an empty frame: %d, %v", n, err)
	}
	for i := range 2 {
		check(i, r.next(t), uint32(len(frames)))
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Frames != uint64(len(frames)+2) || st.Errors != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The frames already sent set the counter; what follows only needs
	// them in order.
	var wcs [8]roce.WorkCompletion
	a := testing.AllocsPerRun(200, func() {
		if _, err := e.SendBatch(ctx, 3, frames[:8]); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 8; {
			n := r.cq.Poll(wcs[:])
			for _, wc := range wcs[:n] {
				if wc.Status != roce.WCSuccess {
					t.Fatalf("completion %+v", wc)
				}
				if wc.Opcode != roce.WCRecv {
					continue // the receiver's own sends: none
				}
				slot := int(wc.WRID)
				r.qp.PostRecv(&roce.RecvWR{ID: wc.WRID, SGL: r.sgl(slot)})
				got++
			}
			if n == 0 {
				r.cq.Wait(ctx)
			}
		}
	})
	t.Logf("%.3f allocations per batch of 8", a)
	if a >= 0.5 {
		t.Fatalf("%.2f allocations per batch of 8", a)
	}
}
