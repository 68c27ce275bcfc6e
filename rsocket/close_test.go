package rsocket

import (
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/faultnet"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/roce/link"
	"github.com/goroce/goroce/roce/link/memlink"
	"github.com/goroce/goroce/rsocket/wire"
)

// ackDropper loses every RC ACKNOWLEDGE written through it while drop is
// set, and the next dropReq RC requests (frames to a QP other than QP1
// that are not ACKs).
type ackDropper struct {
	link.Link
	drop             atomic.Bool
	dropReq          atomic.Int64
	dropped, reqLost atomic.Int64
}

func (l *ackDropper) WriteBatch(frames [][]byte) (int, error) {
	if !l.drop.Load() && l.dropReq.Load() <= 0 {
		return l.Link.WriteBatch(frames)
	}
	var p ib.Packet
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if ib.Parse(f, &p) == nil {
			if p.BTH.Opcode() == ib.RCAck {
				if l.drop.Load() {
					l.dropped.Add(1)
					continue
				}
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

// ackDropPair is devPair with B's ACKs going through an ackDropper.
func ackDropPair(t *testing.T) (*roce.Device, *roce.Device, *ackDropper) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	drop := &ackDropper{Link: lb}
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(drop, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db, drop
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
	da, db, drop := ackDropPair(t)
	a, b, _ := connPair(t, da, db, nil, nil)
	if _, err := a.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if _, err := io.ReadFull(b, buf[:5]); err != nil {
		t.Fatal(err)
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
	da, db, drop := ackDropPair(t)
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
