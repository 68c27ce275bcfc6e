package xdplink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
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

// TestMultiQueueTx sends through both queues' views at once (link.TxQueues),
// a goroutine each, half of the frames copied (WriteBatch), half built in
// lent spans (WriteLent). veth hands a frame sent on queue q to the peer's
// queue q, so every frame of view q reaching A's socket q shows that the
// view sent on its own socket; the per-queue counters say so too.
func TestMultiQueueTx(t *testing.T) {
	p, receivers, l := multiQueueSetup(t)
	views := l.TxQueues()
	if len(views) != 2 {
		t.Fatalf("%d views", len(views))
	}
	const perQueue, burst, window = 1024, 32, 96 // window: under A's 256 receive chunks per queue
	var got [2]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	// A's two sockets, read from one goroutine.
	wg.Add(1)
	go func() {
		defer wg.Done()
		var seen [2][perQueue]bool
		descs := make([]xdp.Desc, 64)
		for {
			idle := true
			for q, s := range receivers {
				n := s.Receive(descs)
				for _, d := range descs[:n] {
					f := s.Frame(d)
					if f == nil || !isOurs(f) {
						continue
					}
					seq := binary.BigEndian.Uint32(f[42:46])
					from, i := int(seq>>16), seq&0xffff
					switch {
					case from != q || i >= perQueue:
						errs <- fmt.Errorf("frame %d of view %d arrived on queue %d", i, from, q)
						return
					case seen[q][i]:
						errs <- fmt.Errorf("frame %d of view %d arrived twice", i, from)
						return
					}
					seen[q][i] = true
					got[q].Add(1)
				}
				if n > 0 {
					s.Release(descs[:n])
					idle = false
				}
			}
			if idle {
				select {
				case <-stop:
					return
				default:
				}
				receivers[0].Poll(unix.POLLIN, 1)
			}
		}
	}()
	for q, v := range views {
		lender, ok := v.(link.TxLender)
		if !ok {
			t.Fatalf("view %d lends no buffers", q)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			frames := make([][]byte, burst)
			for i := range frames {
				frames[i] = make([]byte, 600)
			}
			bufs := make([][]byte, burst)
			lent := make([][]byte, burst)
			for i := 0; i < perQueue; i += burst {
				deadline := time.Now().Add(10 * time.Second)
				for int64(i)-got[q].Load() > window-burst {
					if time.Now().After(deadline) {
						errs <- fmt.Errorf("view %d: %d of %d frames arrived", q, got[q].Load(), i)
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
				if i%(2*burst) == 0 {
					for j := range frames {
						udpFrame(frames[j], p.VethA.HardwareAddr, p.VethB.HardwareAddr, uint32(q)<<16|uint32(i+j))
					}
					if n, err := v.WriteBatch(frames); n != burst || err != nil {
						errs <- fmt.Errorf("view %d: WriteBatch: %d, %v", q, n, err)
						return
					}
					continue
				}
				for sent := 0; sent < burst; {
					n := lender.LendTx(bufs[:burst-sent], 600)
					if n == 0 {
						if time.Now().After(deadline) {
							errs <- fmt.Errorf("view %d lends nothing", q)
							return
						}
						time.Sleep(100 * time.Microsecond)
						continue
					}
					for j, b := range bufs[:n] {
						lent[j] = b[:600]
						udpFrame(lent[j], p.VethA.HardwareAddr, p.VethB.HardwareAddr, uint32(q)<<16|uint32(i+sent+j))
					}
					if k, err := lender.WriteLent(bufs[:n], lent[:n]); k != n || err != nil {
						errs <- fmt.Errorf("view %d: WriteLent: %d of %d, %v", q, k, n, err)
						return
					}
					sent += n
				}
			}
		}()
	}
	deadline := time.Now().Add(20 * time.Second)
	for (got[0].Load() < perQueue || got[1].Load() < perQueue) && time.Now().Before(deadline) && len(errs) == 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if a, b := got[0].Load(), got[1].Load(); a != perQueue || b != perQueue {
		t.Fatalf("queues 0 and 1 of A received %d and %d frames, want %d each", a, b, perQueue)
	}
	st := l.Stats()
	for q, s := range l.Sockets() {
		if st.QueueSent[q] != perQueue || s.Sent() != perQueue {
			t.Errorf("queue %d: Stats.QueueSent %d, socket sent %d, want %d", q, st.QueueSent[q], s.Sent(), perQueue)
		}
	}
	t.Logf("%d frames through each of 2 views at once: Stats %+v", perQueue, st)
	one := [][]byte{make([]byte, 600)}
	udpFrame(one[0], p.VethA.HardwareAddr, p.VethB.HardwareAddr, 1<<31)
	if allocs := testing.AllocsPerRun(50, func() { views[1].WriteBatch(one) }); allocs != 0 {
		t.Errorf("%v allocations per WriteBatch through a view, want 0", allocs)
	}

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for q, v := range views {
		if n, err := v.WriteBatch([][]byte{make([]byte, 60)}); n != 0 || !errors.Is(err, net.ErrClosed) {
			t.Errorf("view %d: WriteBatch after Close: %d, %v", q, n, err)
		}
		if n := v.(link.TxLender).LendTx(make([][]byte, 1), 100); n != 0 {
			t.Errorf("view %d: LendTx after Close lent %d", q, n)
		}
	}
}
