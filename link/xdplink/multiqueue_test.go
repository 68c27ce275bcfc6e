package xdplink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/xdp"
)

// TestMultiQueue takes over both queues of B's veth with one Link. A sends
// from an AF_XDP socket on each of its two queues; veth delivers a frame
// sent on queue q to the peer's queue q, so every frame reaching the Link
// proves both sockets are read.
func TestMultiQueue(t *testing.T) {
	p, senders, l := multiQueueSetup(t)
	const perQueue = 1000
	frame := make([]byte, 600)
	var seen [2][perQueue]bool
	got := 0
	collect := func(frames [][]byte) {
		for _, f := range frames {
			if !isOurs(f) {
				continue
			}
			seq := binary.BigEndian.Uint32(f[42:46])
			q, i := seq>>16, seq&0xffff
			if q < 2 && i < perQueue && !seen[q][i] {
				seen[q][i] = true
				got++
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	drain := func(want int) {
		for got < want {
			if _, err := l.ReadBatch(ctx, collect); err != nil {
				for q, s := range l.Sockets() {
					st, _ := s.Stats()
					t.Logf("B q%d: stats %+v", q, st)
				}
				t.Fatalf("after %d of %d frames: %v", got, want, err)
			}
		}
	}
	const burst = 64 // per queue, well under B's 256 receive chunks
	for i := 0; i < perQueue; i += burst {
		for q, s := range senders {
			for j := i; j < min(i+burst, perQueue); j++ {
				udpFrame(frame, p.VethB.HardwareAddr, p.VethA.HardwareAddr, uint32(q)<<16|uint32(j))
				transmit(t, s, frame)
			}
		}
		drain(2 * min(i+burst, perQueue))
	}
	for q, s := range l.Sockets() {
		if s.Received() < perQueue {
			t.Errorf("B's socket on queue %d received %d frames, want at least %d", q, s.Received(), perQueue)
		}
	}
	t.Logf("%d frames from each of 2 queues through one Link (socket counts %d, %d)", perQueue, l.Sockets()[0].Received(), l.Sockets()[1].Received())
}

// transmit sends frame from s, waiting for room.
func transmit(t *testing.T, s *xdp.Socket, frame []byte) {
	t.Helper()
	for {
		n, err := s.Transmit([][]byte{frame})
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		s.Complete()
		s.Poll(unix.POLLOUT, 1)
	}
}

// TestMultiQueueViews reads each queue through its own view
// (link.MultiQueue), from a goroutine each, as a device does: every frame
// sent on queue q arrives on view q, in order, and Close ends both
// readers.
func TestMultiQueueViews(t *testing.T) {
	p, senders, l := multiQueueSetup(t)
	views := l.RxQueues()
	if len(views) != 2 {
		t.Fatalf("%d views", len(views))
	}
	const perQueue = 600
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var counts [2]atomic.Int64
	for q, v := range views {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := uint32(0)
			for {
				_, err := v.ReadBatch(context.Background(), func(frames [][]byte) {
					for _, f := range frames {
						if !isOurs(f) {
							continue
						}
						seq := binary.BigEndian.Uint32(f[42:46])
						if int(seq>>16) != q || seq&0xffff != next {
							errs <- fmt.Errorf("view %d: frame %d of queue %d, want %d of queue %d", q, seq&0xffff, seq>>16, next, q)
						}
						next = seq&0xffff + 1
						counts[q].Add(1)
					}
				})
				if err != nil {
					if !errors.Is(err, xdplink.ErrClosed) {
						errs <- err
					}
					return
				}
			}
		}()
	}
	frame := make([]byte, 600)
	const burst = 64
	for i := 0; i < perQueue; i += burst {
		for q, s := range senders {
			for j := i; j < min(i+burst, perQueue); j++ {
				udpFrame(frame, p.VethB.HardwareAddr, p.VethA.HardwareAddr, uint32(q)<<16|uint32(j))
				transmit(t, s, frame)
			}
		}
		// Stay within B's receive chunks: wait for the burst.
		deadline := time.Now().Add(10 * time.Second)
		for counts[0].Load()+counts[1].Load() < int64(2*min(i+burst, perQueue)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if a, b := counts[0].Load(), counts[1].Load(); a != perQueue || b != perQueue {
		t.Fatalf("views read %d and %d frames, want %d each", a, b, perQueue)
	}
}

// multiQueueSetup opens a two-queue veth pair, an AF_XDP sender on each
// of A's queues, and a Link on both of B's.
func multiQueueSetup(t *testing.T) (*netnstest.Pair, [2]*xdp.Socket, *xdplink.Link) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 1500, Queues: 2})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var senders [2]*xdp.Socket
	err := p.A.Do(func() error {
		prog, err := bpf.Load(bpf.Options{Queues: 2})
		if err != nil {
			return err
		}
		t.Cleanup(func() { prog.Close() })
		for q := range senders {
			s, err := xdp.Open(p.VethA.Name, q, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 512}})
			if err != nil {
				return err
			}
			t.Cleanup(func() { s.Close() })
			senders[q] = s
			if err := prog.Register(q, s.FD()); err != nil {
				return err
			}
		}
		_, err = prog.Attach(p.VethA.Index, bpf.AttachAuto)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var l *xdplink.Link
	err = p.B.Do(func() error {
		if _, err := xdplink.Open(p.VethB.Name, xdplink.Options{Queues: []int{1, 1}}); !errors.Is(err, xdp.ErrBadConfig) {
			return errors.New("a queue listed twice was accepted")
		}
		if _, err := xdplink.Open(p.VethB.Name, xdplink.Options{Queues: []int{0, 2}}); !errors.Is(err, xdp.ErrQueueOutOfRange) {
			return errors.New("queue 2 of a two-queue veth was accepted")
		}
		var err error
		l, err = xdplink.Open(p.VethB.Name, xdplink.Options{Queues: []int{0, 1}, NumFrames: 512})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if len(l.Sockets()) != 2 {
		t.Fatalf("%d sockets", len(l.Sockets()))
	}
	return p, senders, l
}
