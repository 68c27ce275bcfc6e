package roce

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
)

// lendLink is a memory link that lends transmit buffers from a pool, as
// the AF_XDP link lends UMEM chunks, and checks that every loan comes back
// and that every sent frame lies in a buffer it lent.
type lendLink struct {
	*memlink.Link
	mu      sync.Mutex
	free    [][]byte
	out     map[*byte]bool // lent, by first byte
	sentOut int            // frames sent from lent buffers
	bad     int            // frames outside their buffer, buffers not lent
}

var _ link.TxLender = (*lendLink)(nil)

func newLendLink(l *memlink.Link, n, size int) *lendLink {
	ll := &lendLink{Link: l, out: make(map[*byte]bool, n)}
	slab := make([]byte, n*size)
	for i := 0; i < n; i++ {
		ll.free = append(ll.free, slab[i*size:(i+1)*size:(i+1)*size])
	}
	return ll
}

func (l *lendLink) LendTx(bufs [][]byte, size int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for n < len(bufs) && len(l.free) > 0 && len(l.free[0]) >= size {
		b := l.free[len(l.free)-1]
		l.free = l.free[:len(l.free)-1]
		l.out[&b[0]] = true
		bufs[n] = b
		n++
	}
	return n
}

func (l *lendLink) back(b []byte) {
	if len(b) == 0 || !l.out[&b[0]] {
		l.bad++
		return
	}
	delete(l.out, &b[0])
	l.free = append(l.free, b)
}

func (l *lendLink) ReturnTx(bufs [][]byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range bufs {
		l.back(b)
	}
}

func (l *lendLink) WriteLent(bufs, frames [][]byte) (int, error) {
	l.mu.Lock()
	for i, f := range frames {
		b := bufs[i]
		if len(f) == 0 || len(b) == 0 || &f[0] != &b[len(b)-cap(f)] {
			l.bad++
		}
	}
	l.sentOut += len(frames)
	l.mu.Unlock()
	n, err := l.Link.WriteBatch(frames)
	l.ReturnTx(bufs)
	return n, err
}

func (l *lendLink) loans() (out, sent, bad int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out), l.sentOut, l.bad
}

// A device over a lending link builds its frames in the lent buffers,
// gives every buffer back, and allocates nothing per packet; frames to its
// own address (loopback) come back too.
func TestTxLend(t *testing.T) {
	ma, mb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	la, lb := newLendLink(ma, 64, 8192), newLendLink(mb, 64, 8192)
	da, db := openPair(t, la, lb, addrA, addrB, nil)
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx := context.Background()
	fill(a.buf[:4000], 3)
	rwr := RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4000)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 4000)}}
	var wc [1]WorkCompletion
	round := func() {
		if err := b.qp.PostRecv(&rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:1]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if wc[0].Status != WCSuccess {
				t.Fatal(wc[0].Status)
			}
		}
	}
	for i := 0; i < 50; i++ {
		round()
	}
	if string(b.buf[:4000]) != string(a.buf[:4000]) {
		t.Fatal("received bytes differ from those sent")
	}
	allocs := testing.AllocsPerRun(200, round)
	if allocs > 0.5 {
		t.Fatalf("%.2f allocations per round trip over a lending link, want 0", allocs)
	}
	for _, c := range []struct {
		name string
		l    *lendLink
	}{{"A", la}, {"B", lb}} {
		_, sent, bad := c.l.loans()
		if sent == 0 || bad != 0 {
			t.Errorf("link %s: %d frames sent from lent buffers, %d misplaced", c.name, sent, bad)
		}
	}

	// Loopback: two QPs of device A; their frames are built in lent
	// buffers and delivered without the link.
	x := newEndpoint(t, da, RC, 8192)
	y := newEndpoint(t, da, RC, 8192)
	connect(t, x, y, addrA, addrA, ConnectAttr{})
	fill(x.buf[:3000], 9)
	if err := y.qp.PostRecv(&RecvWR{ID: 3, SGL: []SGE{y.mr.SGE(0, 3000)}}); err != nil {
		t.Fatal(err)
	}
	if err := x.qp.PostSend(&SendWR{ID: 4, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, 3000)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, x.scq, 10e9), WCSend)
	wantOK(t, waitWC(t, y.rcq, 10e9), WCRecv)
	if string(y.buf[:3000]) != string(x.buf[:3000]) {
		t.Fatal("loopback bytes differ")
	}
	da.Close()
	db.Close()
	for _, l := range []*lendLink{la, lb} {
		if out, _, bad := l.loans(); out != 0 || bad != 0 {
			t.Errorf("after Close: %d buffers still lent, %d misplaced", out, bad)
		}
	}
}

// A link whose buffers are too small for a packet lends none; the device
// sends through WriteBatch.
func TestTxLendTooSmall(t *testing.T) {
	ma, mb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	la := newLendLink(ma, 8, 256)
	oa := Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: mb.HardwareAddr()}}
	da, err := OpenLink(la, oa)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(mb, Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: ma.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	wr := SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 5000)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	fill(a.buf[:5000], 5)
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, a.scq, 10e9), WCRDMAWrite)
	if string(b.buf[:5000]) != string(a.buf[:5000]) {
		t.Fatal("written bytes differ")
	}
	if _, sent, _ := la.loans(); sent != 0 {
		t.Fatalf("%d frames sent from 256-byte buffers", sent)
	}
}

// A poller that reads the SEND completing its caller's wait leaves the
// ACK to the caller's next post, so the ACK and the reply leave in one
// link write; a caller that posts nothing still has its ACK sent (the
// timer), long before the peer would probe. Options.AckWithReply asks
// for it for the whole device, CQ.SetAckWithReply for the waiters of one
// CQ.
func TestDeferredAck(t *testing.T) {
	t.Run("device", func(t *testing.T) { testDeferredAck(t, false) })
	t.Run("cq", func(t *testing.T) { testDeferredAck(t, true) })
}

func testDeferredAck(t *testing.T, perCQ bool) {
	ma, mb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	da, db := openPair(t, ma, mb, addrA, addrB, nil)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	if perCQ {
		for _, cq := range []*CQ{a.rcq, a.scq, b.rcq, b.scq} {
			cq.SetAckWithReply(true)
		}
	} else {
		// Options.AckWithReply, which openPair does not take.
		da.ackWithReply.Store(true)
		db.ackWithReply.Store(true)
	}
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx, cancel := context.WithTimeout(context.Background(), 30e9)
	defer cancel()
	// Each side's goroutine waits with its own completion slot.
	waitOne := func(cq *CQ) {
		var wc [1]WorkCompletion
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if wc[0].Status != WCSuccess {
			t.Fatal(wc[0].Status)
		}
	}
	// Ping-pong: A sends, B receives and answers, A receives. Each side
	// waits on its receive CQ and reaps its send completions after.
	const rounds = 200 // within the 256 receives a QP holds
	for i := 0; i < rounds; i++ {
		if err := b.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostRecv(&RecvWR{ID: 3, SGL: []SGE{a.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	w0, f0 := mb.Writes()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < rounds; i++ {
			waitOne(b.rcq)
			if err := b.qp.PostSend(&SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{b.mr.SGE(0, 8)}}); err != nil {
				t.Error(err)
				return
			}
			waitOne(b.scq)
		}
	}()
	for i := 0; i < rounds; i++ {
		if err := a.qp.PostSend(&SendWR{ID: 4, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		waitOne(a.rcq)
		waitOne(a.scq)
	}
	<-done
	w1, f1 := mb.Writes()
	t.Logf("B: %d frames in %d link writes over %d round trips", f1-f0, w1-w0, rounds)
	if w1-w0 >= f1-f0 {
		t.Errorf("B never sent its ACK and its reply in one write (%d frames, %d writes)", f1-f0, w1-w0)
	}

	// B takes a SEND and then does nothing: its ACK still goes out.
	if err := b.qp.PostRecv(&RecvWR{ID: 5, SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(&SendWR{ID: 6, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	waitOne(b.rcq)
	wantOK(t, waitWC(t, a.scq, 10e9), WCSend)
}

// A pass of an answer and the ACK that leaves with it, or of a credit
// message beside them, is not taken for a stream's (which asks for a
// whole batch next); a pass that fills what it was lent is.
func TestTxLendWant(t *testing.T) {
	ma, _ := memlink.PairWithOptions(memlink.Options{})
	var tl txLend
	tl.init(newLendLink(ma, 64, 256), 64)
	for _, c := range []struct{ lent, produced, want int }{
		{tl.want, 1, lendMin},
		{lendMin, 2, lendMin},
		{lendMin, 3, 6},
		{6, 2, lendMin},
		{lendMin, lendMin, 64},
		{64, 0, lendMin},
	} {
		tl.n = c.lent
		tl.produced(c.produced)
		if tl.want != c.want {
			t.Errorf("lent %d, produced %d: want %d next, got %d", c.lent, c.produced, c.want, tl.want)
		}
	}
}
