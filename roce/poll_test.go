package roce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
)

// memPairPoll opens a memlink pair whose waiters busy-poll for window.
func memPairPoll(t testing.TB, window time.Duration) (*Device, *Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	da, err := OpenLink(la, Options{BusyPoll: window, Addrs: []netip.Addr{addrA},
		Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{BusyPoll: window, Addrs: []netip.Addr{addrB},
		Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// A waiter reads the link itself: with a window longer than any round trip,
// the ACKs that complete its sends are received by the waiting goroutine,
// not by the receive goroutine (which may take a packet that arrives
// before the waiter takes the poller role, hence the rounds).
func TestWaiterReadsLink(t *testing.T) {
	da, db := memPairPoll(t, time.Hour)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wr := SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	var wc [1]WorkCompletion
	for i := 0; i < 10000 && da.ctr.polledPkts.Load() == 0; i++ {
		if err := a.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		for a.scq.Poll(wc[:]) == 0 {
			if err := a.scq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		wantOK(t, wc[0], WCRDMAWrite)
	}
	if da.ctr.polledPkts.Load() == 0 {
		t.Fatal("no frame was read by a waiting goroutine")
	}
	if da.polling.Load() {
		t.Fatal("the poller role is still taken after the wait")
	}
}

// While one goroutine holds the poller role (an endless window), a waiter
// parked on another CQ is woken by the poller's engine runs: the receive
// goroutine stands by all along, so nothing else could wake it.
func TestPollerServesParkedWaiters(t *testing.T) {
	da, db := memPairPoll(t, time.Hour)
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The poller waits on a's receive CQ for a message that b sends last.
	if err := a.qp.PostRecv(&RecvWR{ID: 9, SGL: []SGE{a.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	polled := make(chan error, 1)
	go func() { polled <- a.rcq.Wait(ctx) }()
	for !da.polling.Load() {
		time.Sleep(time.Millisecond) // a state to reach, not a timing margin
	}
	// Now wait on a's send CQ: the role is taken, so this goroutine parks.
	wr := SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	for i := 0; i < 20; i++ {
		if err := a.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		var wc [1]WorkCompletion
		for a.scq.Poll(wc[:]) == 0 {
			if err := a.scq.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		wantOK(t, wc[0], WCRDMAWrite)
	}
	if err := b.qp.PostSend(&SendWR{ID: 2, Opcode: WRSend, SGL: []SGE{b.mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	if err := <-polled; err != nil {
		t.Fatal(err)
	}
}

// A busy-polling waiter still ends with its context and with the device.
func TestBusyPollEnds(t *testing.T) {
	da, _ := memPairPoll(t, time.Hour)
	cq, err := da.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cq.Wait(ctx) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v", err)
	}
	if err := cq.WaitDeadline(time.Now().Add(5 * time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitDeadline = %v", err)
	}
	go func() { done <- cq.Wait(context.Background()) }()
	for !da.polling.Load() {
		time.Sleep(time.Millisecond)
	}
	da.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait on close = %v", err)
	}
}

// Windows that pass without their completion close the busy-poll window; a
// parked waiter whose completion was read within the configured window
// opens it again.
func TestBusyPollWindowAdapts(t *testing.T) {
	da, _ := memPairPoll(t, 64*time.Microsecond)
	full := int64(64 * time.Microsecond)
	for i := 0; i < 8; i++ {
		da.missed()
	}
	if w := da.window.Load(); w != 0 {
		t.Fatalf("window %v after 8 misses, want closed", time.Duration(w))
	}
	start := da.nowNs()
	da.rxAt.Store(start + full + 1)
	da.parkedFor(start)
	if w := da.window.Load(); w != 0 {
		t.Fatalf("window %v after a completion read late, want closed", time.Duration(w))
	}
	da.rxAt.Store(start + full/2)
	da.parkedFor(start)
	if w := da.window.Load(); w != full {
		t.Fatalf("window %v after a completion read in time, want %v", time.Duration(w), time.Duration(full))
	}
	// A closed window means no polling: a Wait parks and still ends.
	for i := 0; i < 8; i++ {
		da.missed()
	}
	cq, err := da.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	var wc [1]WorkCompletion
	if n := cq.Poll(wc[:]); n != 0 {
		t.Fatalf("Poll = %d", n)
	}
	if err := cq.WaitDeadline(time.Now().Add(time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitDeadline = %v", err)
	}
}

// deafLink is a memory link whose receive goroutine, once it waits for
// frames, never wakes: only a goroutine that polls reads it.
type deafLink struct {
	*memlink.Link
	waiting chan struct{} // closed once the receive goroutine waits
	once    sync.Once
	closed  chan struct{}
}

func (l *deafLink) WaitReadable(ctx context.Context) error {
	l.once.Do(func() { close(l.waiting) })
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-l.closed:
		return link.ErrClosed
	}
}

func (l *deafLink) Close() error {
	close(l.closed)
	return l.Link.Close()
}

// Progress takes in a WRITE for a goroutine that spins on the memory the
// WRITE lands in: with the receive goroutine unable to run (here: it never
// wakes), the spinner's Progress calls receive the WRITE and acknowledge
// it, and the writer completes.
func TestProgressTakesWrite(t *testing.T) {
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	deaf := &deafLink{Link: lb, waiting: make(chan struct{}), closed: make(chan struct{})}
	da, db := openPairWith(t, la, deaf, addrA, addrB, Options{})
	a := newEndpoint(t, da, RC, 4096)
	b := newEndpoint(t, db, RC, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	select {
	case <-deaf.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("B's receive goroutine never waited for frames")
	}
	for round := byte(1); round <= 3; round++ {
		a.buf[63] = round
		wr := SendWR{ID: uint64(round), Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)},
			RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
		if err := a.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for b.mr.Sync(); b.buf[63] != round; b.mr.Sync() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the WRITE never landed (B counters %v)", round, db.Counters().Map())
			}
			db.Progress()
		}
		wc := waitWC(t, a.scq, 30*time.Second)
		wantOK(t, wc, WCRDMAWrite)
	}
	if n := db.ctr.polledPkts.Load(); n < 3 {
		t.Fatalf("B's pollers took %d frames, want the 3 WRITEs", n)
	}
}
