package roce

import (
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/link/memlink"
)

// corkPair is memPair with A's link returned, so that a test counts its
// writes, and A's Options.TxCork set.
func corkPair(t *testing.T, cork time.Duration) (*Device, *Device, *memlink.Link) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	da, db := openPairWith(t, la, lb, addrA, addrB, Options{TxCork: cork})
	return da, db, la
}

// A stream of posts goes in fewer link writes than posts, and every
// message lands, in order. Whether posts come within the default cork of
// the last pass depends on the host: a goroutine descheduled between two
// posts lets the window pass. So the stream runs up to five times; every
// run must deliver, and one must cork.
func TestTxCorkStream(t *testing.T) {
	da, db, la := corkPair(t, 0)
	a := newEndpoint(t, da, RC, 64*64)
	b := newEndpoint(t, db, RC, 64*64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const n, runs = 64, 5
	var tried []string
	for run := 0; run < runs; run++ {
		for i := 0; i < n; i++ {
			if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
				t.Fatal(err)
			}
			a.buf[i*64] = byte(run*n + i + 1)
		}
		c0 := da.ctr.corked.Load()
		w0, _ := la.Writes()
		for i := 0; i < n; i++ {
			wr := SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(i*64, 64)}}
			if i == n-1 {
				wr.Flags = SendSignaled
			}
			if err := a.qp.PostSend(&wr); err != nil {
				t.Fatal(err)
			}
		}
		w1, _ := la.Writes()
		wantOK(t, waitWC(t, a.scq, 30*time.Second), WCSend)
		for i := 0; i < n; i++ {
			wc := waitWC(t, b.rcq, 30*time.Second)
			wantOK(t, wc, WCRecv)
			if wc.WRID != uint64(i) || b.buf[i*64] != byte(run*n+i+1) {
				t.Fatalf("run %d, receive %d: wr %d, first byte %d", run, i, wc.WRID, b.buf[i*64])
			}
		}
		corked := da.ctr.corked.Load() - c0
		tried = append(tried, fmt.Sprintf("%d corked, %d link writes", corked, w1-w0))
		if corked > 0 && w1-w0 < n {
			t.Logf("%d posts, run %d: %s", n, run, tried[run])
			return
		}
	}
	t.Fatalf("%d posts, %d runs, none corked: %v", n, runs, tried)
}

// A post after a pause transmits before PostSend returns: corking never
// delays the first message, which a latency test measures.
func TestTxCorkPauseSendsAtOnce(t *testing.T) {
	da, db, la := corkPair(t, 0)
	a := newEndpoint(t, da, UC, 64)
	b := newEndpoint(t, db, UC, 64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	for round := 0; round < 3; round++ {
		if err := b.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		// Well past any cork window, whatever the machine's load.
		time.Sleep(10 * time.Millisecond)
		w0, _ := la.Writes()
		if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		if w1, _ := la.Writes(); w1 == w0 {
			t.Fatalf("round %d: the post did not write to the link before it returned (%d corked)", round, da.ctr.corked.Load())
		}
		wantOK(t, waitWC(t, b.rcq, 30*time.Second), WCRecv)
	}
}

// Posts that corked leave without the caller: a UC stream whose sender
// never polls or waits (nothing comes back to it either, no ACK, no
// timer of the QP) still reaches its peer whole, through the device's
// deferred-pass timer. The cork is an hour, so that every post corks:
// with the default a post corks only within 2 µs of the last pass, which
// a loaded CI host missed for all 320 posts of a run.
func TestTxCorkWithoutCaller(t *testing.T) {
	da, db, _ := corkPair(t, time.Hour)
	a := newEndpoint(t, da, UC, 64)
	b := newEndpoint(t, db, UC, 16*64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const n = 16
	for round := 0; round < 4; round++ {
		for i := 0; i < n; i++ {
			if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < n; i++ {
			if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < n; i++ {
			wc := waitWC(t, b.rcq, 30*time.Second)
			wantOK(t, wc, WCRecv)
			if wc.WRID != uint64(i) {
				t.Fatalf("round %d: receive %d completed wr %d", round, i, wc.WRID)
			}
		}
	}
	if c := da.ctr.corked.Load(); c != 4*n {
		t.Fatalf("%d of %d posts corked", c, 4*n)
	}
}

// TxCork < 0 transmits every post at once.
func TestTxCorkOff(t *testing.T) {
	da, db, la := corkPair(t, -1)
	a := newEndpoint(t, da, UC, 64)
	b := newEndpoint(t, db, UC, 16*64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const n = 16
	for i := 0; i < n; i++ {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(i*64, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		w0, _ := la.Writes()
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		if w1, _ := la.Writes(); w1 == w0 {
			t.Fatalf("post %d: no link write before it returned", i)
		}
	}
	for i := 0; i < n; i++ {
		wantOK(t, waitWC(t, b.rcq, 30*time.Second), WCRecv)
	}
	if c := da.ctr.corked.Load(); c != 0 {
		t.Fatalf("%d posts corked with TxCork -1", c)
	}
}

// A careless TxCork (an hour) corks every post, and still every post
// leaves: through the sender's wait, or the 20 µs bound when it does not.
func TestTxCorkHuge(t *testing.T) {
	da, db, _ := corkPair(t, time.Hour)
	a := newEndpoint(t, da, RC, 64)
	b := newEndpoint(t, db, RC, 64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	for i := 0; i < 8; i++ {
		if err := b.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 8)}}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			wantOK(t, waitWC(t, a.scq, 30*time.Second), WCSend) // the sender's wait sends it
		}
		wantOK(t, waitWC(t, b.rcq, 30*time.Second), WCRecv)
	}
	if c := da.ctr.corked.Load(); c < 7 {
		t.Fatalf("%d of 8 posts corked with TxCork an hour", c)
	}
}
