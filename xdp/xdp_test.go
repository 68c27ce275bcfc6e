package xdp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/xdp"
)

// receiver collects and checks test frames arriving on one socket.
type receiver struct {
	t      testing.TB
	s      *xdp.Socket
	descs  []xdp.Desc
	buf    []byte // assembly space for multi-buffer frames
	want   []byte // expected frame
	src    []byte // MAC the frames come from
	next   uint32 // expected sequence number
	got    int
	bytes  int
	multi  int    // frames that arrived in more than one descriptor
	minOff uint64 // lowest offset of a frame in its chunk
	others int    // frames that were not ours (IPv6 autoconfiguration etc.)
	d      time.Duration
}

func newReceiver(t testing.TB, s *xdp.Socket, src []byte) *receiver {
	return &receiver{t: t, s: s, src: src, minOff: 1 << 20, descs: make([]xdp.Desc, 256), buf: make([]byte, 16384), want: make([]byte, 16384)}
}

// until receives until total frames have arrived or the timeout passes.
func (r *receiver) until(total int, timeout time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for r.got < total {
		n := r.s.Receive(r.descs)
		if n == 0 {
			if time.Now().After(deadline) {
				st, _ := r.s.Stats()
				r.t.Fatalf("received %d of %d frames before timeout; stats %+v", r.got, total, st)
			}
			if _, err := r.s.Poll(unix.POLLIN, 10); err != nil {
				r.t.Fatal(err)
			}
			continue
		}
		for _, d := range r.descs[:n] {
			r.minOff = min(r.minOff, d.Addr&uint64(r.s.FrameSize()-1))
		}
		for i := 0; i < n; {
			var f []byte
			used := 1
			if !r.descs[i].More() {
				f = r.s.Frame(r.descs[i])
				if f == nil {
					r.t.Fatalf("descriptor %+v outside UMEM", r.descs[i])
				}
			} else {
				l, u, err := r.s.CopyFrame(r.buf, r.descs[i:n])
				if err != nil {
					r.t.Fatalf("assembling multi-buffer frame: %v", err)
				}
				f, used = r.buf[:l], u
				r.multi++
			}
			i += used
			r.check(f)
		}
		if rel := r.s.Release(r.descs[:n]); rel != n {
			r.t.Fatalf("released %d of %d descriptors", rel, n)
		}
	}
}

func (r *receiver) check(f []byte) {
	r.t.Helper()
	if len(f) < 22 || binary.BigEndian.Uint16(f[12:14]) != testEtherType {
		r.others++
		return
	}
	seq := binary.BigEndian.Uint32(f[14:18])
	if seq != r.next {
		r.t.Fatalf("frame %d arrived, want %d", seq, r.next)
	}
	want := r.want[:len(f)]
	fillFrame(want, f[0:6], r.src, seq)
	if int(binary.BigEndian.Uint32(f[18:22])) != len(f) || !bytes.Equal(f, want) {
		r.t.Fatalf("frame %d (%d bytes) differs from what was sent", seq, len(f))
	}
	r.next++
	r.got++
	r.bytes += len(f)
}

// cross sends total frames of up to maxLen bytes from one side to the other
// in batches and checks each byte on arrival.
func cross(t testing.TB, from, to *side, total, maxLen, batch int) (frames, nbytes, multi int, d time.Duration) {
	t.Helper()
	r := crossR(t, from, to, total, maxLen, batch)
	return r.got, r.bytes, r.multi, r.d
}

func crossR(t testing.TB, from, to *side, total, maxLen, batch int) *receiver {
	t.Helper()
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, maxLen)
	}
	r := newReceiver(t, to.sock, from.mac)
	start := time.Now()
	seq := uint32(0)
	for sent := 0; sent < total; {
		k := min(batch, total-sent)
		for i := 0; i < k; i++ {
			l := frameLen(seq+uint32(i), maxLen)
			bufs[i] = bufs[i][:l]
			fillFrame(bufs[i], to.mac, from.mac, seq+uint32(i))
		}
		for off := 0; off < k; {
			n, err := from.sock.Transmit(bufs[off:k])
			if err != nil {
				t.Fatalf("transmit: %v", err)
			}
			off += n
			if n == 0 {
				if _, err := from.sock.Complete(); err != nil {
					t.Fatal(err)
				}
				r.until(sent+off, 5*time.Second) // let the peer drain
			}
		}
		sent += k
		seq += uint32(k)
		r.until(sent, 5*time.Second)
	}
	r.d = time.Since(start)
	return r
}

func TestCrossVeth(t *testing.T) {
	for _, tc := range []struct {
		mtu, frameSize, headroom, total int
	}{
		{1500, 2048, 0, 20000},
		{3000, 4096, 0, 20000},
		{1500, 2048, 200, 5000},
	} {
		t.Run(fmt.Sprintf("mtu%d-frame%d-headroom%d", tc.mtu, tc.frameSize, tc.headroom), func(t *testing.T) {
			a, b := newPair(t, tc.mtu, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: tc.frameSize, Headroom: tc.headroom}})
			if want := tc.frameSize - 256 - tc.headroom; a.sock.RxChunkCapacity() != want {
				t.Errorf("RxChunkCapacity %d, want %d", a.sock.RxChunkCapacity(), want)
			}
			t.Logf("zero-copy %v, need_wakeup %v", a.sock.ZeroCopy(), a.sock.NeedWakeup())
			if zc, err := a.sock.KernelZeroCopy(); err != nil || zc {
				t.Errorf("XDP_OPTIONS on veth: zero-copy %v, %v; want copy mode", zc, err)
			}
			maxLen := tc.mtu + 14
			for _, dir := range []struct {
				name     string
				from, to *side
			}{{"A->B", a, b}, {"B->A", b, a}} {
				r := crossR(t, dir.from, dir.to, tc.total, maxLen, 64)
				n, nb, d := r.got, r.bytes, r.d
				t.Logf("%s: %d frames, %d bytes byte-exact in %v (%.0f frames/s, %.1f MB/s)",
					dir.name, n, nb, d.Round(time.Millisecond), float64(n)/d.Seconds(), float64(nb)/d.Seconds()/1e6)
				if r.minOff < uint64(256+tc.headroom) {
					t.Errorf("a frame started at offset %d of its chunk, inside the %d+%d bytes of headroom", r.minOff, 256, tc.headroom)
				}
			}
			st, err := b.sock.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("B stats %+v", st)
		})
	}
}

func TestMultibuffer(t *testing.T) {
	for _, fs := range []int{4096, 2048} {
		t.Run(fmt.Sprintf("frame%d", fs), func(t *testing.T) {
			a, b := newPair(t, 9000, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: fs}, Multibuffer: true})
			if !a.sock.Multibuffer() {
				t.Fatal("socket not in multi-buffer mode")
			}
			if n, err := a.sock.Transmit([][]byte{make([]byte, a.sock.MaxFrame()+1)}); n != 0 || !errors.Is(err, xdp.ErrFrameTooLarge) {
				t.Fatalf("frame of MaxFrame+1 bytes: %d, %v", n, err)
			}
			// A 4096-MTU RoCE frame first: 4170 bytes.
			for _, dir := range []struct{ from, to *side }{{a, b}, {b, a}} {
				frame := make([]byte, 4170)
				fillFrame(frame, dir.to.mac, dir.from.mac, 0)
				if n, err := dir.from.sock.Transmit([][]byte{frame}); n != 1 || err != nil {
					t.Fatalf("transmit 4170 bytes: %d, %v", n, err)
				}
				r := newReceiver(t, dir.to.sock, dir.from.mac)
				r.until(1, 5*time.Second)
				if r.multi != 1 || r.bytes != 4170 {
					t.Fatalf("4170-byte frame: %d multi-buffer, %d bytes", r.multi, r.bytes)
				}
			}
			n, nb, multi, d := cross(t, a, b, 5000, 9014, 32)
			t.Logf("A->B %d frames (%d in several chunks), %d bytes in %v", n, multi, nb, d.Round(time.Millisecond))
			if multi == 0 {
				t.Error("no frame needed several chunks")
			}
			n, nb, multi, d = cross(t, b, a, 5000, 9014, 32)
			t.Logf("B->A %d frames (%d in several chunks), %d bytes in %v", n, multi, nb, d.Round(time.Millisecond))
		})
	}
}

func TestFrameTooLargeWithoutSG(t *testing.T) {
	a, _ := newPair(t, 3000, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 4096}, Mode: xdp.ModeCopy})
	n, err := a.sock.Transmit([][]byte{make([]byte, 100), make([]byte, 4170)})
	if n != 1 || !errors.Is(err, xdp.ErrFrameTooLarge) {
		t.Fatalf("Transmit(100, 4170 bytes) without SG = %d, %v; want 1, ErrFrameTooLarge", n, err)
	}
	t.Log(err)
	if n, err := a.sock.Transmit([][]byte{{}}); n != 0 || !errors.Is(err, xdp.ErrEmptyFrame) {
		t.Fatalf("Transmit(empty) = %d, %v", n, err)
	}
	if a.sock.Frame(xdp.Desc{Addr: 1 << 40, Len: 10}) != nil || a.sock.Frame(xdp.Desc{Addr: 4000, Len: 200}) != nil {
		t.Fatal("Frame accepted a descriptor outside the UMEM or across a chunk")
	}
}

func TestStats(t *testing.T) {
	t.Run("rx_ring_full", func(t *testing.T) {
		// 16 receive chunks but an RX ring of 4: the ring fills first.
		a, b := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 32}, RingSize: 4})
		sendN(t, a, b, 20)
		st := waitStats(t, b.sock, func(s xdp.Stats) bool { return s.RxRingFull > 0 })
		t.Logf("stats %+v", st)
	})
	t.Run("fill_ring_empty", func(t *testing.T) {
		// 4 receive chunks, never released: the fill ring runs dry.
		a, b := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 8}, RingSize: 64})
		sendN(t, a, b, 20)
		st := waitStats(t, b.sock, func(s xdp.Stats) bool { return s.RxDropped > 0 && s.RxFillRingEmptyDescs > 0 })
		t.Logf("stats %+v", st)
	})
}

func sendN(t *testing.T, a, b *side, n int) {
	f := make([]byte, 100)
	for i := 0; i < n; i++ {
		fillFrame(f, b.mac, a.mac, uint32(i))
		for {
			k, err := a.sock.Transmit([][]byte{f})
			if err != nil {
				t.Fatal(err)
			}
			if k == 1 {
				break
			}
			a.sock.Complete()
			time.Sleep(time.Millisecond)
		}
	}
}

func waitStats(t *testing.T, s *xdp.Socket, ok func(xdp.Stats) bool) xdp.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters did not move: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestNoAllocs guards the data path: a transmit batch, its reception and
// release allocate nothing.
func TestNoAllocs(t *testing.T) {
	a, b := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
	const batch = 32
	frames := make([][]byte, batch)
	for i := range frames {
		frames[i] = make([]byte, 1000)
		fillFrame(frames[i], b.mac, a.mac, uint32(i))
	}
	descs := make([]xdp.Desc, batch)
	sum := 0
	cycle := func() {
		for off := 0; off < batch; {
			n, err := a.sock.Transmit(frames[off:])
			if err != nil {
				t.Fatal(err)
			}
			off += n
			if n == 0 {
				a.sock.Complete()
			}
		}
		for got := 0; got < batch; {
			n := b.sock.Receive(descs)
			if n == 0 {
				b.sock.Poll(unix.POLLIN, 100)
				continue
			}
			for _, d := range descs[:n] {
				f := b.sock.Frame(d)
				if len(f) == 1000 && binary.BigEndian.Uint16(f[12:14]) == testEtherType {
					got++
					sum += int(f[100])
				}
			}
			b.sock.Release(descs[:n])
		}
	}
	cycle() // warm up
	if allocs := testing.AllocsPerRun(200, cycle); allocs != 0 {
		t.Fatalf("%v allocations per TX+RX batch cycle, want 0", allocs)
	}
}

func TestBadInput(t *testing.T) {
	a, _ := newPair(t, 1500, xdp.Config{})
	err := a.ns.Do(func() error {
		if _, err := xdp.Open("nosuchif0", 0, xdp.Config{}); !errors.Is(err, xdp.ErrNoSuchInterface) {
			return fmt.Errorf("Open(nosuchif0) = %v, want ErrNoSuchInterface", err)
		}
		for _, q := range []int{1, 64, -1} {
			_, err := xdp.Open(a.veth.Name, q, xdp.Config{})
			var qe *xdp.QueueRangeError
			if !errors.Is(err, xdp.ErrQueueOutOfRange) || !errors.As(err, &qe) {
				return fmt.Errorf("Open(queue %d) = %v, want ErrQueueOutOfRange", q, err)
			}
			t.Log(err)
		}
		if _, err := xdp.Open(a.veth.Name, 0, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 3000}}); !errors.Is(err, xdp.ErrBadConfig) {
			return fmt.Errorf("frame size 3000: %v", err)
		}
		if _, err := xdp.Open(a.veth.Name, 0, xdp.Config{RingSize: 100}); !errors.Is(err, xdp.ErrBadConfig) {
			return fmt.Errorf("ring size 100: %v", err)
		}
		// The queue is taken by the side's socket.
		if s, err := xdp.Open(a.veth.Name, 0, xdp.Config{}); err == nil {
			s.Close()
			return errors.New("second socket on a busy queue was accepted")
		} else {
			t.Log(err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.sock.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.sock.Close(); !errors.Is(err, xdp.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
	if _, err := a.sock.Transmit([][]byte{make([]byte, 60)}); !errors.Is(err, xdp.ErrClosed) {
		t.Fatalf("Transmit after Close = %v", err)
	}
	if n := a.sock.Receive(make([]xdp.Desc, 4)); n != 0 {
		t.Fatal("Receive after Close returned frames")
	}
}

func TestFeatureError(t *testing.T) {
	err := error(&xdp.FeatureError{Feature: "AF_XDP multi-buffer (XDP_USE_SG)", MinVersion: "6.6", Err: unix.EINVAL})
	if !errors.Is(err, xdp.ErrNotSupported) || !errors.Is(err, unix.EINVAL) {
		t.Fatal("FeatureError does not match ErrNotSupported and its errno")
	}
	if want := "AF_XDP multi-buffer (XDP_USE_SG) not supported (requires Linux >= 6.6): invalid argument"; err.Error() != want {
		t.Fatalf("%q, want %q", err.Error(), want)
	}
}

// BenchmarkCross measures frames per second from one AF_XDP socket through
// a veth pair into another (copy mode on veth).
func BenchmarkCross(b *testing.B) {
	for _, size := range []int{64, 1102, 1514} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			x, y := newPair(b, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
			const batch = 64
			frames := make([][]byte, batch)
			for i := range frames {
				frames[i] = make([]byte, size)
				fillFrame(frames[i], y.mac, x.mac, uint32(i))
			}
			descs := make([]xdp.Desc, batch)
			b.ReportAllocs()
			b.SetBytes(int64(size * batch))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for off := 0; off < batch; {
					n, err := x.sock.Transmit(frames[off:])
					if err != nil {
						b.Fatal(err)
					}
					off += n
					if n == 0 {
						x.sock.Complete()
					}
				}
				for got := 0; got < batch; {
					n := y.sock.Receive(descs)
					if n == 0 {
						y.sock.Poll(unix.POLLIN, 100)
						continue
					}
					for _, d := range descs[:n] {
						if f := y.sock.Frame(d); len(f) == size && binary.BigEndian.Uint16(f[12:14]) == testEtherType {
							got++
						}
					}
					y.sock.Release(descs[:n])
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}

// TestOversizeReceiveWithoutSG sends a 4170-byte frame (multi-buffer on the
// sending side) to a socket without multi-buffer: the kernel cannot place it
// in one 4096-byte chunk and counts a drop.
func TestOversizeReceiveWithoutSG(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 9000})
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	a := openSide(t, p.VethA, xdp.Config{Multibuffer: true})
	b := openSideFrags(t, p.VethB, xdp.Config{}, true)
	big := make([]byte, 4170)
	fillFrame(big, b.mac, a.mac, 0)
	if n, err := a.sock.Transmit([][]byte{big}); n != 1 || err != nil {
		t.Fatalf("Transmit: %d, %v", n, err)
	}
	st := waitStats(t, b.sock, func(s xdp.Stats) bool { return s.RxDropped > 0 })
	t.Logf("receiver without multi-buffer: %+v", st)
	// A frame that fits still arrives afterwards.
	small := make([]byte, 1000)
	fillFrame(small, b.mac, a.mac, 0)
	if n, err := a.sock.Transmit([][]byte{small}); n != 1 || err != nil {
		t.Fatalf("Transmit: %d, %v", n, err)
	}
	newReceiver(t, b.sock, a.mac).until(1, 5*time.Second)
}

// TestZeroCopyUnsupported asks for zero-copy on veth, which has none.
func TestZeroCopyUnsupported(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPair(t, 1500)
	err := p.A.Do(func() error {
		s, err := xdp.Open(p.VethA.Name, 0, xdp.Config{Mode: xdp.ModeZeroCopy})
		if err == nil {
			s.Close()
			return errors.New("zero-copy bind on veth succeeded")
		}
		if !errors.Is(err, xdp.ErrNotSupported) {
			return fmt.Errorf("ModeZeroCopy on veth: %v, want ErrNotSupported", err)
		}
		t.Log(err)
		// Auto mode falls back to copy mode on the same queue.
		s, err = xdp.Open(p.VethA.Name, 0, xdp.Config{})
		if err != nil {
			return err
		}
		defer s.Close()
		if s.ZeroCopy() {
			return errors.New("auto mode reports zero-copy on veth")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestReceiveFewerDescsThanSegments gives Receive fewer descriptors than a
// 9014-byte frame has segments (six 1792-byte pieces): the frame is dropped
// and counted, never handed out in pieces, and the next frame is intact.
func TestReceiveFewerDescsThanSegments(t *testing.T) {
	a, b := newPair(t, 9000, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}, Multibuffer: true})
	big, small := make([]byte, 9014), make([]byte, 1000)
	fillFrame(big, b.mac, a.mac, 0)
	fillFrame(small, b.mac, a.mac, 0)
	if n, err := a.sock.Transmit([][]byte{big, small}); n != 2 || err != nil {
		t.Fatalf("Transmit: %d, %v", n, err)
	}
	descs := make([]xdp.Desc, 4)
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := b.sock.Receive(descs)
		if n == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("small frame did not arrive; oversize %d", b.sock.Oversize())
			}
			b.sock.Poll(unix.POLLIN, 10)
			continue
		}
		if descs[n-1].More() {
			t.Fatal("Receive handed out part of a frame")
		}
		found := false
		for _, d := range descs[:n] {
			f := b.sock.Frame(d)
			found = found || len(f) == 1000 && binary.BigEndian.Uint16(f[12:14]) == testEtherType
		}
		b.sock.Release(descs[:n])
		if found {
			break
		}
	}
	if b.sock.Oversize() != 1 {
		t.Fatalf("Oversize = %d, want 1", b.sock.Oversize())
	}
}

// TestOpenCloseNoLeak opens and closes sockets repeatedly and checks that
// descriptors and mappings are all given back.
func TestOpenCloseNoLeak(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN)
	p := netnstest.NewPair(t, 1500)
	count := func() (fds, maps int) {
		ents, _ := os.ReadDir("/proc/self/fd")
		b, _ := os.ReadFile("/proc/self/maps")
		return len(ents), bytes.Count(b, []byte("\n"))
	}
	err := p.A.Do(func() error {
		s, err := xdp.Open(p.VethA.Name, 0, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 64}})
		if err != nil {
			return err
		}
		s.Close()
		fds0, maps0 := count()
		for i := 0; i < 30; i++ {
			s, err := xdp.Open(p.VethA.Name, 0, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 64}, Multibuffer: i%2 == 0})
			if err != nil {
				return err
			}
			if err := s.Close(); err != nil {
				return err
			}
		}
		// A failing open (bad ring size) must not leak either.
		if _, err := xdp.Open(p.VethA.Name, 0, xdp.Config{UMEMConfig: xdp.UMEMConfig{NumFrames: 64}, RingSize: 3}); err == nil {
			return errors.New("ring size 3 accepted")
		}
		fds1, maps1 := count()
		// A leaking socket leaves at least one mapping per cycle behind (its
		// UMEM or a ring); the Go runtime itself adds a few as the heap and
		// stacks grow, so allow fewer than half the cycles' worth.
		if fds1 > fds0 || maps1 >= maps0+15 {
			return fmt.Errorf("after 30 open/close cycles: fds %d -> %d, mappings %d -> %d", fds0, fds1, maps0, maps1)
		}
		t.Logf("fds %d -> %d, mappings %d -> %d", fds0, fds1, maps0, maps1)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestInPlaceTx builds frames directly in TX chunks (AllocTx, TxBuffer,
// SubmitTx) instead of copying them in with Transmit.
func TestInPlaceTx(t *testing.T) {
	a, b := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
	free0 := a.sock.TxFree()
	descs := make([]xdp.Desc, 32)
	if n := a.sock.AllocTx(descs); n != 32 {
		t.Fatalf("AllocTx = %d", n)
	}
	// Bad descriptors are refused whole.
	bad := []xdp.Desc{descs[0], {Addr: 12345, Len: 100}}
	bad[0].Len = 100
	if n, err := a.sock.SubmitTx(bad); n != 0 || err == nil {
		t.Fatalf("SubmitTx with a foreign address = %d, %v", n, err)
	}
	if n, err := a.sock.SubmitTx([]xdp.Desc{{Addr: descs[0].Addr, Len: 0}}); n != 0 || err == nil {
		t.Fatalf("SubmitTx with length 0 = %d, %v", n, err)
	}
	if n, err := a.sock.SubmitTx([]xdp.Desc{{Addr: descs[0].Addr, Len: 100, Options: unix.XDP_PKT_CONTD}}); n != 0 || err == nil {
		t.Fatalf("SubmitTx chaining without multi-buffer = %d, %v", n, err)
	}
	// Give half back, send the other half.
	a.sock.FreeTx(descs[16:])
	r := newReceiver(t, b.sock, a.mac)
	for i, d := range descs[:16] {
		buf := a.sock.TxBuffer(d)
		l := frameLen(uint32(i), 1514)
		fillFrame(buf[:l], b.mac, a.mac, uint32(i))
		descs[i].Len = uint32(l)
	}
	if n, err := a.sock.SubmitTx(descs[:16]); n != 16 || err != nil {
		t.Fatalf("SubmitTx = %d, %v", n, err)
	}
	r.until(16, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for a.sock.TxFree() != free0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d TX chunks free, want all %d back", a.sock.TxFree(), free0)
		}
		a.sock.Complete()
		time.Sleep(time.Millisecond)
	}
	if a.sock.Sent() != 16 {
		t.Fatalf("Sent = %d", a.sock.Sent())
	}
}
