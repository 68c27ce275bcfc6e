package rsocket

import (
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// ackDropper loses every RC ACKNOWLEDGE written through it while drop is
// set, and the next dropReq RC requests (frames to a QP other than QP1
// that are not ACKs). It notes the PSN of the last ACK it let through.
type ackDropper struct {
	link.Link
	drop             atomic.Bool
	dropReq          atomic.Int64
	dropped, reqLost atomic.Int64
	lastAck          atomic.Int64 // PSN of the last ACK let through, -1 before one
}

func (l *ackDropper) WriteBatch(frames [][]byte) (int, error) {
	var p ib.Packet
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if ib.Parse(f, &p) == nil {
			if p.BTH.Opcode() == ib.RCAck {
				if l.drop.Load() {
					l.dropped.Add(1)
					continue
				}
				l.lastAck.Store(int64(p.BTH.PSN()))
			} else if p.BTH.DestQP() != 1 && l.dropReq.Add(-1) >= 0 {
				l.reqLost.Add(1)
				continue
			}
		}
		kept = append(kept, f)
	}
	if _, err := l.Link.WriteBatch(kept); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// reqTracker notes the PSN of the last RC request written through it.
type reqTracker struct {
	link.Link
	lastReq atomic.Int64 // -1 before one
}

func (l *reqTracker) WriteBatch(frames [][]byte) (int, error) {
	var p ib.Packet
	for _, f := range frames {
		if ib.Parse(f, &p) == nil && p.BTH.Opcode() != ib.RCAck && p.BTH.DestQP() != 1 {
			l.lastReq.Store(int64(p.BTH.PSN()))
		}
	}
	return l.Link.WriteBatch(frames)
}

// ackDropPair is devPair with B's ACKs going through an ackDropper and
// A's requests through a reqTracker.
func ackDropPair(t *testing.T) (*roce.Device, *roce.Device, *ackDropper, *reqTracker) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	drop := &ackDropper{Link: lb}
	drop.lastAck.Store(-1)
	track := &reqTracker{Link: la}
	track.lastReq.Store(-1)
	da, err := roce.OpenLink(track, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(drop, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db, drop, track
}

// waitClosed runs close with a hang guard.
func waitClosed(t *testing.T, what string, close func() error) {
	t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- close() }()
	select {
	case err := <-ch:
		if err != nil {
			t.Errorf("%s Close: %v", what, err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s Close still blocked after two minutes", what)
	}
}

// TestCloseSecondCloserDisconnects: A closes first and B's ACKs of A's
// writes are all lost, as the last ACK of a stream can be. A librdmacm A
// then waits in rshutdown, ignoring the DREQ, until a DISCONNECT from B
// arrives (its rdma_rxe QP retransmits forever), so B's Close must send one
// and keep its QP until that is acknowledged, although it lost its first
// transmission.
func TestCloseSecondCloserDisconnects(t *testing.T) {
	da, db, drop, track := ackDropPair(t)
	a, b, _ := connPair(t, da, db, nil, nil)
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := io.ReadFull(b, buf[:5]); err != nil {
		t.Fatal(err)
	}
	// Neither Close may give up on its peer (after retryTimeout, 2 s
	// here) before the exchange below is over: on a busy machine B's
	// Close can start later than that after A's, and A's DREQ would then
	// end B's Close before it sent anything.
	for _, c := range []*Conn{a, b} {
		c.mu.Lock()
		c.deadAfter = time.Minute
		c.mu.Unlock()
	}
	// The ACK of that write must reach A before the ACKs are lost: B may
	// send it a little later (with its next verb, or 20 µs on), and a
	// write whose ACKs are all lost draws a probe that narrows A's window
	// to the one PSN probed, so A's DISCONNECT would never leave.
	for deadline := time.Now().Add(time.Minute); drop.lastAck.Load() != track.lastReq.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("A's last request (PSN %d) not acknowledged after a minute (last ACK %d)", track.lastReq.Load(), drop.lastAck.Load())
		}
	}
	drop.drop.Store(true)
	aClosed := make(chan error, 1)
	go func() { aClosed <- a.Close() }()
	// B reads EOF: A's DISCONNECT arrived, and B's ACK of it was lost.
	if n, err := b.Read(buf); err != io.EOF {
		t.Fatalf("B read %d, %v; want EOF", n, err)
	}
	drop.dropReq.Store(1)
	waitClosed(t, "B", b.Close)
	waitClosed(t, "A", func() error { return <-aClosed })
	if drop.dropped.Load() == 0 || drop.reqLost.Load() == 0 {
		t.Fatalf("%d ACKs and %d requests dropped: the test tested nothing", drop.dropped.Load(), drop.reqLost.Load())
	}
	a.mu.Lock()
	got := a.peerDisc
	a.mu.Unlock()
	if !got {
		t.Fatal("B's DISCONNECT never reached A: a librdmacm A would wait for ever")
	}
}

// TestCloseAfterPeerShutdown: the peer shut down both ways (CloseWrite
// after ours sends DISCONNECT) but keeps its socket open. Close neither
// waits for the peer's DREQ nor gives up after the retry timeout.
func TestCloseAfterPeerShutdown(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	a, b, _ := connPair(t, da, db, nil, nil)
	before := ReadStats().CloseTimeouts
	buf := make([]byte, 16)
	if err := a.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Read(buf); err != io.EOF {
		t.Fatalf("B read %d, %v; want EOF", n, err)
	}
	if err := b.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Read(buf); err != io.EOF {
		t.Fatalf("A read %d, %v; want EOF", n, err)
	}
	waitClosed(t, "A", a.Close)
	if n := ReadStats().CloseTimeouts - before; n != 0 {
		t.Fatalf("A's Close gave up waiting %d times", n)
	}
	waitClosed(t, "B", b.Close)
}

// TestCloseControlSlotsBusy: the reader's four control slots are all
// taken by credit updates whose ACKs are lost when it closes. Close must
// still send DISCONNECT once a slot frees (as rshutdown waits for one):
// the peer sees it, not only the DREQ.
func TestCloseControlSlotsBusy(t *testing.T) {
	da, db, drop, _ := ackDropPair(t)
	// A writes, B reads and returns credits; B's ACKs are A's business,
	// so here the dropper sits on B's link and B is the writer: A's
	// credit writes wait for ACKs that B's link drops.
	a, b, _ := connPair(t, da, db, nil, nil)
	drop.drop.Store(true)
	data := make([]byte, 1<<20)
	wrote := make(chan error, 1)
	go func() { _, err := b.Write(data); wrote <- err }()
	got := 0
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(time.Minute)
	for {
		a.mu.Lock()
		busy := a.inflight() >= wire.QPCtrlSize
		a.mu.Unlock()
		if busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's control slots never filled (read %d bytes)", got)
		}
		a.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, _ := a.Read(buf)
		got += n
	}
	aClosed := make(chan error, 1)
	go func() { aClosed <- a.Close() }()
	<-a.closed
	drop.drop.Store(false)
	waitClosed(t, "A", func() error { return <-aClosed })
	// B's Write ends (EPIPE or closed) and B saw A's DISCONNECT.
	select {
	case <-wrote:
	case <-time.After(2 * time.Minute):
		t.Fatal("B's Write still blocked")
	}
	b.mu.Lock()
	peerDisc := b.peerDisc
	b.mu.Unlock()
	if !peerDisc {
		t.Fatal("A closed without sending DISCONNECT")
	}
}
