package roce

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
)

// shardPair is memPair with Options.Shards on both devices.
func shardPair(t testing.TB, shards int, ab faultnet.Config) (*Device, *Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: ab, HardwareAddrA: macA, HardwareAddrB: macB})
	da, err := OpenLink(la, Options{Shards: shards, Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Shards: shards, Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

func TestShardsOption(t *testing.T) {
	for _, n := range []int{-1, qp.MaxShards + 1} {
		la, _ := memlink.Pair(faultnet.Config{}, faultnet.Config{})
		if d, err := OpenLink(la, Options{Shards: n}); !errors.Is(err, ErrInvalidArgument) {
			if d != nil {
				d.Close()
			}
			t.Errorf("Shards %d: %v, want ErrInvalidArgument", n, err)
		}
		la.Close()
	}
}

// QPs of several shards, each posted by its own goroutine, send into one
// CQ on one side and one SRQ and one CQ on the other: every message
// arrives and completes, once, and in order per QP, on both sides. A lossy
// link makes the shards' passes resend while others send.
func TestShardsShareCQAndSRQ(t *testing.T) {
	const shards = 3
	da, db := shardPair(t, shards, faultnet.Config{Seed: 7, Loss: 0.01})
	shareCQAndSRQ(t, da, db, addrA, addrB, shards)
}

// On a link whose queues send apart (link.TxQueues), shard k sends
// through queue k mod queues: both queues carry frames, and each QP's
// frames leave by one queue only, also when one goroutine finds several
// shards' packets ready (a pass joins only shards of the same queue).
func TestShardsTxQueues(t *testing.T) {
	for _, shards := range []int{2, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
			qa, qb := newTxQueuesLink(la, 2), newTxQueuesLink(lb, 2)
			da, err := OpenLink(qa, Options{Shards: shards, Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { da.Close() })
			db, err := OpenLink(qb, Options{Shards: shards, Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			for _, d := range []*Device{da, db} {
				for k := range d.shards {
					if v := d.shards[k].link.(*txView); v.q != k%2 {
						t.Fatalf("shard %d sends through queue %d", k, v.q)
					}
				}
			}
			shareCQAndSRQ(t, da, db, addrA, addrB, shards)
			for i, l := range []*txQueuesLink{qa, qb} {
				l.mu.Lock()
				t.Logf("device %d: frames per queue %d, %d; %d QPs", i, l.sent[0], l.sent[1], len(l.byQPN))
				if l.sent[0] == 0 || l.sent[1] == 0 || l.direct != 0 {
					t.Errorf("device %d: frames per queue %d, %d, through the link itself %d", i, l.sent[0], l.sent[1], l.direct)
				}
				for _, m := range l.mixed {
					t.Errorf("device %d: %s", i, m)
				}
				l.mu.Unlock()
			}
		})
	}
}

// txQueuesLink presents a link as a link.TxQueues of several queues, each
// sending through the link, and notes which queue each QP's frames left
// by.
type txQueuesLink struct {
	link.Link
	views  []link.Link
	mu     sync.Mutex
	sent   []int
	direct int            // frames written through the link itself
	byQPN  map[uint32]int // destination QPN → queue
	mixed  []string       // QPs whose frames left by several queues
}

type txView struct {
	link.Link
	l *txQueuesLink
	q int
}

func newTxQueuesLink(l link.Link, n int) *txQueuesLink {
	ql := &txQueuesLink{Link: l, sent: make([]int, n), byQPN: map[uint32]int{}}
	for q := range n {
		ql.views = append(ql.views, &txView{Link: l, l: ql, q: q})
	}
	return ql
}

func (l *txQueuesLink) TxQueues() []link.Link { return l.views }

func (l *txQueuesLink) WriteBatch(frames [][]byte) (int, error) {
	l.mu.Lock()
	l.direct += len(frames)
	l.mu.Unlock()
	return l.Link.WriteBatch(frames)
}

func (v *txView) WriteBatch(frames [][]byte) (int, error) {
	l := v.l
	l.mu.Lock()
	for _, f := range frames {
		l.sent[v.q]++
		bth := 14 + 20 + 8 // Ethernet, IPv4, UDP
		if len(f) < bth+8 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
			l.mixed = append(l.mixed, fmt.Sprintf("a frame of %d bytes not IPv4", len(f)))
			continue
		}
		qpn := binary.BigEndian.Uint32(f[bth+4:]) & 0xFFFFFF
		if q, ok := l.byQPN[qpn]; !ok {
			l.byQPN[qpn] = v.q
		} else if q != v.q {
			l.mixed = append(l.mixed, fmt.Sprintf("frames to QP %#x left by queues %d and %d", qpn, q, v.q))
			l.byQPN[qpn] = v.q
		}
	}
	l.mu.Unlock()
	return v.Link.WriteBatch(frames)
}

// shareCQAndSRQ runs TestShardsShareCQAndSRQ's traffic between da and db.
func shareCQAndSRQ(t *testing.T, da, db *Device, a, b netip.Addr, shards int) {
	const pairs, msgs, window = 8, 300, 32
	apd, _ := da.AllocPD()
	bpd, _ := db.AllocPD()
	acq, err := da.CreateCQ(pairs * window)
	if err != nil {
		t.Fatal(err)
	}
	bcq, _ := db.CreateCQ(4096)
	bscq, _ := db.CreateCQ(16)
	srq, err := bpd.CreateSRQ(SRQAttr{MaxWR: 256, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	const slot = 64
	bbuf := make([]byte, 256*slot)
	bmr, err := bpd.RegisterMR(bbuf, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 256; i++ {
		if err := srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{bmr.SGE(i*slot, slot)}}); err != nil {
			t.Fatal(err)
		}
	}
	aqps := make([]*QP, pairs)
	pairOf := map[uint32]int{} // B's QPN → pair
	seen := map[int]bool{}
	for i := range aqps {
		qa, err := apd.CreateQP(&QPInitAttr{Type: RC, SendCQ: acq, RecvCQ: acq, Cap: QPCap{MaxSendWR: window, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		qb, err := bpd.CreateQP(&QPInitAttr{Type: RC, SendCQ: bscq, RecvCQ: bcq, SRQ: srq})
		if err != nil {
			t.Fatal(err)
		}
		connect(t, &endpoint{qp: qa}, &endpoint{qp: qb}, a, b, ConnectAttr{})
		aqps[i], pairOf[qb.QPN()] = qa, i
		seen[da.eng.ShardOf(qa.QPN())] = true
	}
	if len(seen) != shards {
		t.Fatalf("the QPs span %d shards of %d", len(seen), shards)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	fail := make(chan error, 2*pairs+2)
	// The senders: each its own QP, at most window messages unfinished.
	tokens := make([]chan struct{}, pairs)
	for i := range aqps {
		tokens[i] = make(chan struct{}, window)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var p [8]byte
			for seq := 0; seq < msgs; seq++ {
				select {
				case tokens[i] <- struct{}{}:
				case <-ctx.Done():
					fail <- ctx.Err()
					return
				}
				binary.BigEndian.PutUint32(p[:], uint32(i))
				binary.BigEndian.PutUint32(p[4:], uint32(seq))
				wr := SendWR{ID: uint64(i)<<32 | uint64(seq), Opcode: WRSend, Flags: SendSignaled | SendInline, Inline: p[:]}
				if err := aqps[i].PostSend(&wr); err != nil {
					fail <- err
					return
				}
			}
		}()
	}
	// A's one CQ: each QP's completions in the order it posted.
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := make([]uint64, pairs)
		var wc [16]WorkCompletion
		for done := 0; done < pairs*msgs; {
			n := acq.Poll(wc[:])
			if n == 0 {
				if err := acq.Wait(ctx); err != nil {
					fail <- err
					return
				}
				continue
			}
			for _, c := range wc[:n] {
				i, seq := int(c.WRID>>32), c.WRID&0xFFFFFFFF
				if c.Status != WCSuccess || i >= pairs || seq != next[i] || c.QPN != aqps[i].QPN() {
					fail <- errors.New("sender completion out of order or failed")
					t.Errorf("A: completion %+v, want QP %d message %d", c, i, next[i])
					return
				}
				next[i]++
				done++
				<-tokens[i]
			}
		}
	}()
	// B's one CQ of one SRQ: each QP's messages in the order sent.
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := make([]uint32, pairs)
		var wc [16]WorkCompletion
		for done := 0; done < pairs*msgs; {
			n := bcq.Poll(wc[:])
			if n == 0 {
				if err := bcq.Wait(ctx); err != nil {
					fail <- err
					return
				}
				continue
			}
			for _, c := range wc[:n] {
				i, ok := pairOf[c.QPN]
				b := bbuf[c.WRID*slot:]
				if c.Status != WCSuccess || !ok || c.ByteLen != 8 || binary.BigEndian.Uint32(b) != uint32(i) || binary.BigEndian.Uint32(b[4:]) != next[i] {
					fail <- errors.New("receive out of order or failed")
					t.Errorf("B: completion %+v of pair %d, message % x, want message %d", c, i, b[:8], next[i])
					return
				}
				next[i]++
				done++
				if err := srq.PostRecv(&RecvWR{ID: c.WRID, SGL: []SGE{bmr.SGE(int(c.WRID)*slot, slot)}}); err != nil {
					fail <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(fail)
	for err := range fail {
		t.Fatal(err)
	}
	t.Logf("A: %d packets sent, %d resent; B: %d received", da.Counters().SentPkts, da.Counters().CompleterRetryErr, db.Counters().RcvdPkts)
}

// A QP destroyed while its peer still sends to it: its frames, which
// arrive beside those of a QP of another shard, are dropped and counted
// (unknown_qp), and the other QP's messages all complete in order.
func TestShardsDestroyInFlight(t *testing.T) {
	da, db := shardPair(t, 2, faultnet.Config{})
	x, y := newEndpoint(t, da, RC, 4096), newEndpoint(t, da, RC, 4096)
	bx, by := newEndpoint(t, db, RC, 4096), newEndpoint(t, db, RC, 4096)
	connect(t, x, bx, addrA, addrB, ConnectAttr{})
	connect(t, y, by, addrA, addrB, ConnectAttr{})
	if db.eng.ShardOf(bx.qp.QPN()) == db.eng.ShardOf(by.qp.QPN()) || da.eng.ShardOf(x.qp.QPN()) == da.eng.ShardOf(y.qp.QPN()) {
		t.Fatal("x and y share a shard")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < 64; i++ {
		if err := bx.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{bx.mr.SGE(0, 64)}}); err != nil {
			t.Fatal(err)
		}
	}
	// x sends without pause until the test ends; its QP on B goes once
	// some messages arrived.
	stop := make(chan struct{})
	xdone := make(chan struct{})
	go func() {
		defer close(xdone)
		var wc [8]WorkCompletion
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			err := x.qp.PostSend(&SendWR{ID: uint64(k), Opcode: WRSend, SGL: []SGE{x.mr.SGE(0, 64)}, Flags: SendSignaled})
			if err != nil {
				// The send queue is full of messages nobody will
				// acknowledge: wait for the test to end.
				<-stop
				return
			}
			x.scq.Poll(wc[:])
		}
	}()
	recvd := 0
	for recvd < 8 {
		wc := waitWC(t, bx.rcq, 30*time.Second)
		wantOK(t, wc, WCRecv)
		recvd++
	}
	if err := bx.qp.Close(); err != nil {
		t.Fatal(err)
	}
	// y runs its messages meanwhile, through the other shard.
	const msgs = 200
	go func() {
		for i := 0; i < msgs; i++ {
			if err := by.qp.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{by.mr.SGE(i%8*64, 64)}}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wc [8]WorkCompletion
	for sent, got, acked := 0, 0, 0; got < msgs || acked < msgs; {
		for sent < msgs && sent-acked < 64 {
			if err := y.qp.PostSend(&SendWR{ID: uint64(sent), Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{y.mr.SGE(0, 32)}}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		progress := false
		if n := y.scq.Poll(wc[:]); n > 0 {
			for _, c := range wc[:n] {
				if c.Status != WCSuccess || c.WRID != uint64(acked) {
					t.Fatalf("y's send completion %+v, want %d", c, acked)
				}
				acked++
			}
			progress = true
		}
		if n := by.rcq.Poll(wc[:]); n > 0 {
			for _, c := range wc[:n] {
				if c.Status != WCSuccess || c.WRID != uint64(got) {
					t.Fatalf("y's receive %+v, want %d", c, got)
				}
				got++
			}
			progress = true
		}
		if !progress {
			if err := ctx.Err(); err != nil {
				t.Fatalf("y: %d of %d sent, %d acknowledged, %d received", sent, msgs, acked, got)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	// x's frames keep coming (its retries do not run out): they find no QP.
	for db.Counters().UnknownQP == 0 {
		if ctx.Err() != nil {
			t.Fatal("no frame for the destroyed QP was counted")
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	<-xdone
	t.Logf("B: %d frames for the destroyed QP", db.Counters().UnknownQP)
}

// Receives posted from one goroutine, without the device lock, while the
// device fills them from the wire and another goroutine moves the QP to
// the error state: each posted receive completes exactly once, in the
// order posted, the filled ones first and the rest flushed; none is
// refused or lost.
func TestPostRecvWhileReceiving(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a, b := newEndpoint(t, da, RC, 4096), newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	const msgs, stopAfter = 2000, 500
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	posted := make(chan int, 1)
	var completed atomic.Int64 // receives completed: at most 256 outstanding, within the CQ
	go func() {
		n := 0
		defer func() { posted <- n }()
		for n < msgs {
			if int64(n)-completed.Load() >= 256 {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(10 * time.Microsecond)
				continue
			}
			err := b.qp.PostRecv(&RecvWR{ID: uint64(n), SGL: []SGE{b.mr.SGE(n%64*64, 64)}})
			switch {
			case err == nil:
				n++
			case errors.Is(err, qp.ErrQueueFull):
				if ctx.Err() != nil {
					return
				}
				time.Sleep(10 * time.Microsecond)
			default:
				t.Errorf("post receive %d: %v", n, err)
				return
			}
		}
	}()
	go func() {
		var wc [16]WorkCompletion
		for i := 0; i < msgs && ctx.Err() == nil; i++ {
			for a.scq.Len() > 100 {
				a.scq.Poll(wc[:])
			}
			if a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{a.mr.SGE(0, 16)}}) != nil {
				time.Sleep(10 * time.Microsecond)
				i--
			}
			a.scq.Poll(wc[:])
		}
	}()
	var wc [16]WorkCompletion
	next, ok, flushed, errored := 0, 0, 0, false
	var total = -1
	for total < 0 || next < total {
		if total < 0 {
			select {
			case total = <-posted:
			default:
			}
		}
		n := b.rcq.Poll(wc[:])
		if n == 0 {
			if ctx.Err() != nil {
				t.Fatalf("%d of %d receives completed (%d filled, %d flushed)", next, total, ok, flushed)
			}
			time.Sleep(10 * time.Microsecond)
			continue
		}
		for _, c := range wc[:n] {
			if c.WRID != uint64(next) {
				t.Fatalf("receive %d completed, want %d", c.WRID, next)
			}
			next++
			completed.Add(1)
			switch {
			case c.Status == WCSuccess && !errored:
				ok++
			case c.Status == WCWRFlushErr:
				errored = true
				flushed++
			default:
				t.Fatalf("receive %d: %v after %d filled, %d flushed", c.WRID, c.Status, ok, flushed)
			}
		}
		if ok >= stopAfter && !errored {
			if err := b.qp.Modify(ctx, &QPAttr{State: StateErr}, AttrState); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ok < stopAfter || flushed == 0 {
		t.Fatalf("%d receives filled and %d flushed of %d", ok, flushed, total)
	}
	t.Logf("%d receives filled, %d flushed", ok, flushed)
}
