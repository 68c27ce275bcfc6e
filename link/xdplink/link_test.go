package xdplink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
	"github.com/goroce/goroce/xdp"
)

type end struct {
	ns  *netnstest.NS
	v   *netnstest.Veth
	l   *xdplink.Link
	mac []byte
}

func open(t testing.TB, v *netnstest.Veth, opts xdplink.Options) *end {
	t.Helper()
	e := &end{ns: v.NS, v: v, mac: v.HardwareAddr}
	err := v.NS.Do(func() (err error) {
		e.l, err = xdplink.Open(v.Name, opts)
		return err
	})
	if err != nil {
		if errors.Is(err, xdp.ErrNotSupported) {
			t.Skipf("AF_XDP or XDP unavailable: %v", err)
		}
		t.Fatalf("Open(%s): %v", v.Name, err)
	}
	t.Cleanup(func() { e.l.Close() })
	return e
}

func pair(t testing.TB, mtu int, opts xdplink.Options) (a, b *end) {
	t.Helper()
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPair(t, mtu)
	for _, v := range []*netnstest.Veth{p.VethA, p.VethB} {
		if err := v.WaitReady(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return open(t, p.VethA, opts), open(t, p.VethB, opts)
}

// udpFrame writes an Ethernet/IPv4/UDP frame to port 4791 of length len(f)
// carrying seq and a pattern derived from it.
func udpFrame(f, dst, src []byte, seq uint32) {
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	clear(ip)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(len(f)-14))
	ip[6] = 0x40 // DF
	ip[8] = 64
	ip[9] = 17
	copy(ip[12:16], []byte{10, 99, 0, 1})
	copy(ip[16:20], []byte{10, 99, 0, 2})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:12], ^uint16(sum))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:2], 49152)
	binary.BigEndian.PutUint16(udp[2:4], 4791)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(f)-34))
	binary.BigEndian.PutUint16(udp[6:8], 0)
	binary.BigEndian.PutUint32(f[42:46], seq)
	x := seq*2654435761 + 7
	for i := 46; i < len(f); i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		f[i] = byte(x)
	}
}

func isOurs(f []byte) bool {
	return len(f) >= 46 && binary.BigEndian.Uint16(f[12:14]) == 0x0800 && f[23] == 17 && binary.BigEndian.Uint16(f[36:38]) == 4791
}

// crossLink sends total frames from a to b with WriteBatch and checks them
// byte for byte as ReadBatch delivers them.
func crossLink(t testing.TB, a, b *end, total, maxLen, batch int) time.Duration {
	t.Helper()
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, maxLen)
	}
	want := make([]byte, maxLen)
	next := uint32(0)
	var bad error
	check := func(frames [][]byte) {
		for _, f := range frames {
			if !isOurs(f) {
				continue
			}
			seq := binary.BigEndian.Uint32(f[42:46])
			w := want[:len(f)]
			udpFrame(w, f[0:6], a.mac, seq)
			if seq != next || string(w) != string(f) {
				if bad == nil {
					bad = fmt.Errorf("frame %d (%d bytes) arrived, want frame %d intact", seq, len(f), next)
				}
			}
			next++
		}
	}
	start := time.Now()
	for sent := 0; sent < total; {
		k := min(batch, total-sent)
		for i := 0; i < k; i++ {
			l := maxLen
			if (sent+i)%3 == 1 {
				l = 64 + (sent+i)*131%(maxLen-64)
			}
			bufs[i] = bufs[i][:l]
			udpFrame(bufs[i], b.mac, a.mac, uint32(sent+i))
		}
		n, err := a.l.WriteBatch(bufs[:k])
		if err != nil || n != k {
			t.Fatalf("WriteBatch: %d of %d, %v", n, k, err)
		}
		sent += k
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for int(next) < sent {
			if _, err := b.l.ReadBatch(ctx, check); err != nil {
				cancel()
				st, _ := b.l.Socket().Stats()
				ast, _ := a.l.Socket().Stats()
				steer, _ := b.l.SteeringStats()
				t.Fatalf("ReadBatch after %d of %d frames: %v (receiver %+v, steering %+v, %s; sender %+v, %d descriptors not taken by the kernel, %d chunks in flight, %+v, %s)",
					next, sent, err, st, steer, vethStats(b), ast, a.l.Socket().TxUnsent(), a.l.Socket().TxPending(), a.l.Stats(), vethStats(a))
			}
			if bad != nil {
				t.Fatal(bad)
			}
		}
		cancel()
	}
	return time.Since(start)
}

// vethStats is what the kernel counted on e's veth, for a failure message:
// which side lost frames.
func vethStats(e *end) string {
	l, err := e.ns.Netlink().LinkByName(e.v.Name)
	if err != nil {
		return fmt.Sprintf("%s: %v", e.v.Name, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return e.v.Name + ": no statistics"
	}
	return fmt.Sprintf("%s: rx %d packets, %d dropped; tx %d packets, %d dropped", e.v.Name, st.RxPackets, st.RxDropped, st.TxPackets, st.TxDropped)
}

func TestCross(t *testing.T) {
	for _, tc := range []struct {
		mtu, frameSize int
		multi          bool
		attach         bpf.AttachMode
	}{
		{1500, 2048, false, bpf.AttachAuto},
		{3000, 4096, false, bpf.AttachAuto},
		{9000, 4096, true, bpf.AttachAuto},
		{9000, 2048, true, bpf.AttachAuto},
		{1500, 2048, false, bpf.AttachGeneric},
		{9000, 4096, true, bpf.AttachGeneric},
	} {
		t.Run(fmt.Sprintf("mtu%d-frame%d-%v", tc.mtu, tc.frameSize, tc.attach), func(t *testing.T) {
			a, b := pair(t, tc.mtu, xdplink.Options{FrameSize: tc.frameSize, Multibuffer: tc.multi, Attach: tc.attach})
			if tc.attach != bpf.AttachAuto && a.l.AttachMode() != tc.attach {
				t.Fatalf("attached in %v mode, want %v", a.l.AttachMode(), tc.attach)
			}
			t.Logf("attach mode %v, zero-copy %v, multi-buffer %v", a.l.AttachMode(), a.l.Socket().ZeroCopy(), a.l.Socket().Multibuffer())
			if a.l.MTU() != tc.mtu || len(a.l.HardwareAddr()) != 6 || a.l.Info().Kind != "afxdp" {
				t.Fatalf("MTU %d, MAC %v, info %+v", a.l.MTU(), a.l.HardwareAddr(), a.l.Info())
			}
			if tc.multi {
				// One 4096-MTU RoCE frame first.
				crossLink(t, a, b, 1, 4170, 1)
			}
			const total = 10000
			d := crossLink(t, a, b, total, tc.mtu+14, 32)
			t.Logf("A->B %d frames byte-exact in %v (%.0f frames/s)", total, d.Round(time.Millisecond), total/d.Seconds())
			d = crossLink(t, b, a, total, tc.mtu+14, 32)
			t.Logf("B->A %d frames byte-exact in %v (%.0f frames/s)", total, d.Round(time.Millisecond), total/d.Seconds())
		})
	}
}

func TestCancelAndClose(t *testing.T) {
	a, _ := pair(t, 1500, xdplink.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := a.l.ReadBatch(ctx, func([][]byte) {})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("ReadBatch with 50ms deadline: %v after %v", err, time.Since(start))
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.l.ReadBatch(context.Background(), func([][]byte) {})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := a.l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, xdplink.ErrClosed) {
			t.Fatalf("blocked ReadBatch after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ReadBatch still blocked after Close")
	}
	if err := a.l.Close(); !errors.Is(err, xdplink.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.l.WriteBatch([][]byte{make([]byte, 60)}); !errors.Is(err, xdplink.ErrClosed) {
		t.Fatalf("WriteBatch after Close: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPair(t, 3000)
	err := p.A.Do(func() error {
		if _, err := xdplink.Open("nosuchif0", xdplink.Options{}); !errors.Is(err, xdp.ErrNoSuchInterface) {
			return fmt.Errorf("missing interface: %v", err)
		}
		if _, err := xdplink.Open(p.VethA.Name, xdplink.Options{Queue: 3}); !errors.Is(err, xdp.ErrQueueOutOfRange) {
			return fmt.Errorf("queue 3: %v", err)
		}
		l, err := xdplink.Open(p.VethA.Name, xdplink.Options{FrameSize: 4096})
		if err != nil {
			return err
		}
		defer l.Close()
		ok := make([]byte, 100)
		for _, tc := range []struct {
			frame  []byte
			want   error
			reason string
		}{
			{make([]byte, 3100), link.ErrTooLarge, ""},
			{make([]byte, 10), link.ErrMalformed, "truncated"},
		} {
			n, err := l.WriteBatch([][]byte{ok, tc.frame, ok})
			var fe *link.FrameError
			if n != 1 || !errors.Is(err, tc.want) || link.ReasonOf(err) != tc.reason || !errors.As(err, &fe) || fe.Index != 1 {
				return fmt.Errorf("WriteBatch(100, %d, 100 bytes) = %d, %v; want 1, %v at index 1", len(tc.frame), n, err, tc.want)
			}
			t.Log(err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// At MTU 9000 a 4170-byte frame fits the device but not one 4096-byte
	// chunk: without multi-buffer the socket refuses it.
	if err := p.VethA.SetMTU(9000); err != nil {
		t.Fatal(err)
	}
	if err := p.VethB.SetMTU(9000); err != nil {
		t.Fatal(err)
	}
	err = p.A.Do(func() error {
		l, err := xdplink.Open(p.VethA.Name, xdplink.Options{FrameSize: 4096})
		if err != nil {
			return err
		}
		defer l.Close()
		t.Logf("non-frags program at MTU 9000: %v mode", l.AttachMode())
		n, err := l.WriteBatch([][]byte{make([]byte, 4170)})
		if n != 0 || !errors.Is(err, xdp.ErrFrameTooLarge) || !errors.Is(err, link.ErrTooLarge) {
			return fmt.Errorf("4170-byte frame without multi-buffer: %d, %v", n, err)
		}
		t.Log(err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNoAllocs guards the data path: WriteBatch on one end and ReadBatch on
// the other allocate nothing per batch.
func TestNoAllocs(t *testing.T) {
	for _, tc := range []struct {
		mtu, frameSize, frameLen int
		multi                    bool
	}{
		{1500, 2048, 1000, false},
		{9000, 4096, 4170, true}, // every frame in two chunks
	} {
		t.Run(fmt.Sprint(tc.frameLen), func(t *testing.T) {
			noAllocs(t, tc.mtu, tc.frameLen, xdplink.Options{FrameSize: tc.frameSize, Multibuffer: tc.multi})
		})
	}
}

func noAllocs(t *testing.T, mtu, frameLen int, opts xdplink.Options) {
	a, b := pair(t, mtu, opts)
	const batch = 32
	frames := make([][]byte, batch)
	for i := range frames {
		frames[i] = make([]byte, frameLen)
		udpFrame(frames[i], b.mac, a.mac, uint32(i))
	}
	got := 0
	count := func(fs [][]byte) {
		for _, f := range fs {
			if isOurs(f) && len(f) == frameLen {
				got++
			}
		}
	}
	ctx := context.Background()
	cycle := func() {
		if n, err := a.l.WriteBatch(frames); n != batch || err != nil {
			t.Fatalf("WriteBatch: %d, %v", n, err)
		}
		for got < batch {
			if _, err := b.l.ReadBatch(ctx, count); err != nil {
				t.Fatal(err)
			}
		}
		got = 0
	}
	cycle()
	if allocs := testing.AllocsPerRun(200, cycle); allocs != 0 {
		t.Fatalf("%v allocations per WriteBatch+ReadBatch cycle, want 0", allocs)
	}
}

func BenchmarkCross(b *testing.B) {
	for _, size := range []int{1024 + 78, 1514} {
		b.Run(fmt.Sprint(size), func(bb *testing.B) {
			x, y := pair(bb, 1500, xdplink.Options{FrameSize: 2048})
			const batch = 32
			frames := make([][]byte, batch)
			for i := range frames {
				frames[i] = make([]byte, size)
				udpFrame(frames[i], y.mac, x.mac, uint32(i))
			}
			got := 0
			count := func(fs [][]byte) { got += len(fs) }
			ctx := context.Background()
			bb.ReportAllocs()
			bb.SetBytes(int64(size) * batch)
			bb.ResetTimer()
			for i := 0; i < bb.N; i++ {
				if n, err := x.l.WriteBatch(frames); n != batch || err != nil {
					bb.Fatalf("WriteBatch: %d, %v", n, err)
				}
				for got < batch {
					if _, err := y.l.ReadBatch(ctx, count); err != nil {
						bb.Fatal(err)
					}
				}
				got -= batch
			}
			bb.ReportMetric(float64(bb.N*batch)/bb.Elapsed().Seconds(), "frames/s")
		})
	}
}

// TestOpenCloseNoLeak opens and closes links repeatedly: descriptors
// (socket, program, maps, eventfd) and the XDP attachment are given back.
func TestOpenCloseNoLeak(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := netnstest.NewPair(t, 1500)
	fds := func() int {
		ents, _ := os.ReadDir("/proc/self/fd")
		return len(ents)
	}
	err := p.A.Do(func() error {
		l, err := xdplink.Open(p.VethA.Name, xdplink.Options{NumFrames: 64})
		if err != nil {
			return err
		}
		l.Close()
		before := fds()
		for i := 0; i < 20; i++ {
			l, err := xdplink.Open(p.VethA.Name, xdplink.Options{NumFrames: 64})
			if err != nil {
				return fmt.Errorf("cycle %d: %w", i, err)
			}
			if err := l.Close(); err != nil {
				return err
			}
		}
		if after := fds(); after > before {
			return fmt.Errorf("descriptors %d -> %d after 20 open/close cycles", before, after)
		}
		info, err := bpf.Attached(p.VethA.Index)
		if err != nil {
			return err
		}
		if info.Attached {
			return fmt.Errorf("an XDP program is still attached after Close: %+v", info)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
