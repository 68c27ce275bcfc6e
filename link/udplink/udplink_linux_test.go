package udplink

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link"
)

func listen(t testing.TB, addr string) *Link {
	t.Helper()
	l, err := ListenOptions(netip.AddrPortFrom(netip.MustParseAddr(addr), 0), Options{EphemeralPort: true})
	if err != nil {
		if addr == "::1" {
			t.Skipf("IPv6 loopback unavailable: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// collect reads until n frames arrived, checking each against the sender.
func collect(t *testing.T, r *Link, from netip.AddrPort, n int, timeout time.Duration) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got [][]byte
	for len(got) < n {
		_, err := r.ReadBatch(ctx, func(frames [][]byte) {
			for _, f := range frames {
				got = append(got, append([]byte(nil), f...))
			}
		})
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", len(got), n, err)
		}
	}
	for _, f := range got {
		pf, err := link.ParseFrame(f)
		if err != nil {
			t.Fatalf("synthesized frame does not parse: %v", err)
		}
		if pf.Src != from.Addr() || pf.SrcPort != from.Port() || pf.Dst != r.LocalAddr().Addr() || pf.DstPort != r.LocalAddr().Port() {
			t.Fatalf("frame %v:%d -> %v:%d, want %v -> %v", pf.Src, pf.SrcPort, pf.Dst, pf.DstPort, from, r.LocalAddr())
		}
		if pf.TTL != 64 {
			t.Fatalf("TTL %d", pf.TTL)
		}
		if pf.Version == 4 {
			ip := f[pf.IPOffset:]
			if binary.BigEndian.Uint16(ip[4:]) != 0 || binary.BigEndian.Uint16(ip[6:]) != 0x4000 || !ib.IPv4(ip[:20]).ChecksumValid() {
				t.Fatalf("IPv4 header % x: want ID 0, DF, valid checksum", ip[:20])
			}
		}
	}
	return got
}

func TestLoopbackBatches(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			a, b := listen(t, addr), listen(t, addr)
			for _, dir := range []struct{ s, r *Link }{{a, b}, {b, a}} {
				const n = 150 // more than one sendmmsg/recvmmsg batch
				frames := make([][]byte, n)
				for i := range frames {
					frames[i] = mkframe(dir.s.LocalAddr(), dir.r.LocalAddr(), 0, payload(i, 28+i*10))
				}
				if k, err := dir.s.WriteBatch(frames); k != n || err != nil {
					t.Fatalf("WriteBatch = %d, %v", k, err)
				}
				got := collect(t, dir.r, dir.s.LocalAddr(), n, 5*time.Second)
				for i, f := range got {
					pf, _ := link.ParseFrame(f)
					if want := payload(i, 28+i*10); string(f[pf.Payload:pf.End]) != string(want) {
						t.Fatalf("frame %d payload differs (len %d, want %d)", i, pf.End-pf.Payload, len(want))
					}
				}
			}
			info := a.Info()
			if info.Kind != link.KindUDP || !info.Synthetic || info.FixedSourcePort != a.LocalAddr().Port() || info.IPIDZero != (addr == "127.0.0.1") {
				t.Fatalf("Info = %+v", info)
			}
			if a.MTU() != 65536 || len(a.HardwareAddr()) != 6 {
				t.Logf("loopback MTU %d, MAC %v", a.MTU(), a.HardwareAddr())
			}
		})
	}
}

func TestLargeDatagrams(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			a, b := listen(t, addr), listen(t, addr)
			sizes := []int{4096 + 28 + 4, 4500, 9000}
			for i, s := range sizes {
				f := mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(i, s))
				if _, err := a.WriteBatch([][]byte{f}); err != nil {
					t.Fatal(err)
				}
			}
			got := collect(t, b, a.LocalAddr(), len(sizes), 5*time.Second)
			for i, f := range got {
				pf, _ := link.ParseFrame(f)
				if string(f[pf.Payload:pf.End]) != string(payload(i, sizes[i])) {
					t.Fatalf("datagram of %d bytes altered", sizes[i])
				}
			}
		})
	}
}

func TestOversizeDatagramDropped(t *testing.T) {
	a := listen(t, "127.0.0.1")
	b, err := ListenOptions(netip.MustParseAddrPort("127.0.0.1:0"), Options{EphemeralPort: true, MaxDatagram: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.WriteBatch([][]byte{
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 2000)),
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(1, 1000)),
	})
	got := collect(t, b, a.LocalAddr(), 1, 5*time.Second)
	if pf, _ := link.ParseFrame(got[0]); pf.End-pf.Payload != 1000 {
		t.Fatalf("got a %d-byte datagram", pf.End-pf.Payload)
	}
	if b.Stats().Truncated != 1 {
		t.Fatalf("stats %+v", b.Stats())
	}
}

func TestTrafficClass(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			a, b := listen(t, addr), listen(t, addr)
			// DSCP 26 with ECT(0), as RoCE traffic is usually marked.
			const tos = 26<<2 | 2
			a.WriteBatch([][]byte{mkframe(a.LocalAddr(), b.LocalAddr(), tos, payload(0, 40))})
			got := collect(t, b, a.LocalAddr(), 1, 5*time.Second)
			if pf, _ := link.ParseFrame(got[0]); pf.TOS != tos {
				t.Fatalf("TOS %#x, want %#x", pf.TOS, tos)
			}
		})
	}
}

func TestWildcardSourceAddress(t *testing.T) {
	a := listen(t, "0.0.0.0")
	b := listen(t, "127.0.0.1")
	// Any 127/8 address is local: the frame's source must be the one used.
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		from := netip.AddrPortFrom(netip.MustParseAddr(src), a.LocalAddr().Port())
		if _, err := a.WriteBatch([][]byte{mkframe(from, b.LocalAddr(), 0, payload(0, 40))}); err != nil {
			t.Fatal(err)
		}
		collect(t, b, from, 1, 5*time.Second)
	}
	// And a wildcard receiver reports the real destination.
	if _, err := b.WriteBatch([][]byte{mkframe(b.LocalAddr(), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), a.LocalAddr().Port()), 0, payload(0, 40))}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.ReadBatch(ctx, func(frames [][]byte) {
		pf, err := link.ParseFrame(frames[0])
		if err != nil || pf.Dst.String() != "127.0.0.3" {
			t.Fatalf("destination %v, %v", pf.Dst, err)
		}
	})
}

// TestServesAddr: a link bound to one address serves that address only; a
// wildcard link serves its family. ServesAddr agrees with what WriteBatch
// accepts as a source.
func TestServesAddr(t *testing.T) {
	one, any4 := listen(t, "127.0.0.1"), listen(t, "0.0.0.0")
	peer := listen(t, "127.0.0.1")
	for _, c := range []struct {
		l    *Link
		addr string
		want bool
	}{
		{one, "127.0.0.1", true}, {one, "::ffff:127.0.0.1", true}, {one, "127.0.0.2", false}, {one, "::1", false},
		{any4, "127.0.0.2", true}, {any4, "192.0.2.1", true}, {any4, "::1", false},
	} {
		a := netip.MustParseAddr(c.addr)
		if got := c.l.ServesAddr(a); got != c.want {
			t.Errorf("%v.ServesAddr(%v) = %v, want %v", c.l.LocalAddr(), a, got, c.want)
		}
		if !a.Unmap().Is4() || (c.l == any4 && c.want) {
			continue // a wildcard's sends from a non-local address fail in the kernel, not here
		}
		from := netip.AddrPortFrom(a.Unmap(), c.l.LocalAddr().Port())
		_, err := c.l.WriteBatch([][]byte{mkframe(from, peer.LocalAddr(), 0, payload(0, 40))})
		if refused := errors.Is(err, link.ErrRefused) && link.ReasonOf(err) == "source-addr"; refused == c.want {
			t.Errorf("%v: send from %v: %v", c.l.LocalAddr(), a, err)
		}
	}
}

func TestContextCancel(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		start := time.Now()
		_, err := b.ReadBatch(ctx, func([][]byte) { t.Fatal("no frame was sent") })
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
			t.Fatalf("got %v after %v", err, time.Since(start))
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.ReadBatch(ctx, func([][]byte) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	// The link still works after cancellations.
	a.WriteBatch([][]byte{mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 40))})
	collect(t, b, a.LocalAddr(), 1, 5*time.Second)
}

func TestCloseUnblocks(t *testing.T) {
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		a := listen(t, "127.0.0.1")
		errc := make(chan error)
		go func() {
			_, err := a.ReadBatch(ctx, func([][]byte) {})
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, link.ErrClosed) {
				t.Fatalf("got %v", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not unblock ReadBatch")
		}
		if _, err := a.WriteBatch([][]byte{make([]byte, 60)}); !errors.Is(err, link.ErrClosed) {
			t.Fatalf("write after close: %v", err)
		}
		if _, err := a.ReadBatch(ctx, func([][]byte) {}); !errors.Is(err, link.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	}
}

func TestBadFrames(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	good := mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 40))
	arp := append([]byte(nil), good...)
	arp[12], arp[13] = 0x08, 0x06
	v6 := mkframe(netip.MustParseAddrPort("[::1]:1"), netip.MustParseAddrPort("[::1]:2"), 0, payload(0, 40))
	wrongPort := mkframe(netip.AddrPortFrom(a.LocalAddr().Addr(), 1), b.LocalAddr(), 0, payload(0, 40))
	wrongAddr := mkframe(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), a.LocalAddr().Port()), b.LocalAddr(), 0, payload(0, 40))
	for _, tc := range []struct {
		name   string
		frame  []byte
		want   error
		reason string
	}{
		{"short", good[:20], link.ErrMalformed, "truncated"},
		{"not IP", arp, link.ErrMalformed, "not-ip"},
		{"IPv6 on IPv4 link", v6, link.ErrRefused, "family"},
		{"source port", wrongPort, link.ErrRefused, "source-port"},
		{"source address", wrongAddr, link.ErrRefused, "source-addr"},
		{"truncated UDP", good[:len(good)-1], link.ErrMalformed, "truncated"},
	} {
		n, err := a.WriteBatch([][]byte{good, good, tc.frame, good})
		var fe *link.FrameError
		if n != 2 || !errors.As(err, &fe) || fe.Index != 2 || !errors.Is(err, tc.want) || link.ReasonOf(err) != tc.reason {
			t.Errorf("%s: n=%d err=%v, want 2, %v (%s) at index 2", tc.name, n, err, tc.want, tc.reason)
		}
	}
	// The frames before each bad one were really sent.
	collect(t, b, a.LocalAddr(), 12, 5*time.Second)

	// And the reverse family mismatch on an IPv6 link.
	if _, err := netip.ParseAddr("::1"); err == nil {
		c := listen(t, "::1")
		if _, err := c.WriteBatch([][]byte{good}); !errors.Is(err, link.ErrRefused) || link.ReasonOf(err) != "family" {
			t.Errorf("IPv4 frame on IPv6 link: %v", err)
		}
	}
}

func TestNoAllocSteadyState(t *testing.T) {
	t.Run("tos0", func(t *testing.T) { testNoAllocSteadyState(t, false) })
	// With congestion control on: the socket's TOS is ECT(0); frames carry
	// it, CNPs 0, and CE-marked ones (as a switch left them) arrive.
	t.Run("ect", func(t *testing.T) { testNoAllocSteadyState(t, true) })
}

func testNoAllocSteadyState(t *testing.T, ect bool) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	const batch = 16
	frames := make([][]byte, batch)
	for i := range frames {
		var tos uint8
		if ect {
			tos = []uint8{ecnECT0, ecnECT0, ecnECT0, 0, ecnCE}[i%5]
		}
		frames[i] = mkframe(a.LocalAddr(), b.LocalAddr(), tos, payload(i, 1024))
	}
	if ect {
		if err := a.SetDefaultTOS(ecnECT0); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	got := 0
	fn := func(f [][]byte) { got += len(f) }
	step := func() {
		if _, err := a.WriteBatch(frames); err != nil {
			t.Fatal(err)
		}
		for got < batch {
			if _, err := b.ReadBatch(ctx, fn); err != nil {
				t.Fatal(err)
			}
		}
		got -= batch
	}
	for range 100 {
		step()
	}
	if allocs := testing.AllocsPerRun(500, step); allocs != 0 {
		t.Fatalf("%v allocations per batch of %d frames", allocs, batch)
	}
}

// rocev2 builds a real RoCEv2 UD SEND frame, ICRC included, as the
// transport would for this link: source port from Info, IPv4 ID ipid.
func rocev2(t *testing.T, src, dst netip.AddrPort, ipid uint16, seq int) []byte {
	t.Helper()
	s := ib.FrameSpec{
		Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(),
		HopLimit: 64, DontFragment: true, IPID: ipid,
		BTH:     ib.BTHFields{Opcode: ib.UDSendOnly, PKey: 0xFFFF, DestQP: 17, PSN: ib.PSN(seq)},
		DETH:    &ib.DETHFields{QKey: 0x11111111, SrcQP: 18},
		Payload: payload(seq, 100),
	}
	buf := make([]byte, 512)
	n, err := ib.Build(buf, &s)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestWireICRC checks on the wire the assumption behind Info.IPIDZero and
// FixedSourcePort: an unconnected socket with DF set sends IPv4 ID 0 from
// the bound port, so the ICRC the transport computes over its own headers
// is the one a peer verifies on the frame the kernel actually sends. It
// captures the loopback of a private namespace (where the receiver can own
// port 4791) with an AF_PACKET socket.
func TestWireICRC(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("capturing with AF_PACKET needs root (CAP_NET_RAW)")
	}
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			ns := netnstest.New(t)
			var fd int
			var a, b *Link
			err := ns.Do(func() (err error) {
				if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL))); err != nil {
					return err
				}
				lo, err := net.InterfaceByName("lo")
				if err != nil {
					return err
				}
				if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lo.Index}); err != nil {
					return err
				}
				// Without GSO: to a loopback peer the kernel keeps a run
				// whole, so the capture would see one datagram per run.
				if a, err = ListenOptions(netip.AddrPortFrom(netip.MustParseAddr(addr), 0), Options{EphemeralPort: true, DisableGSO: true}); err != nil {
					return err
				}
				b, err = Listen(netip.AddrPortFrom(netip.MustParseAddr(addr), 0)) // the RoCEv2 port
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			defer a.Close()
			defer b.Close()
			wireICRC(t, fd, a, b)
		})
	}
}

func wireICRC(t *testing.T, fd int, a, b *Link) {
	tv := unix.Timeval{Usec: 100000}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	const n = 5
	sent := make([][]byte, n)
	for i := range sent {
		sent[i] = rocev2(t, a.LocalAddr(), b.LocalAddr(), 0, i)
	}
	// A frame whose ICRC assumed another IPv4 ID: the check must fail on
	// the wire, which shows the check can fail.
	wrongID := rocev2(t, a.LocalAddr(), b.LocalAddr(), 0x1234, n)
	if _, err := a.WriteBatch(append(sent, wrongID)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 70000)
	seen := map[int]bool{}
	deadline := time.Now().Add(3 * time.Second)
	for len(seen) < n+1 && time.Now().Before(deadline) {
		k, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		wire := buf[:k]
		pf, err := link.ParseFrame(wire)
		if err != nil || pf.SrcPort != a.LocalAddr().Port() || pf.DstPort != b.LocalAddr().Port() {
			continue
		}
		i := int(ib.BTH(wire[pf.Payload:]).PSN())
		if pf.Version == 4 {
			ip := wire[pf.IPOffset : pf.IPOffset+20]
			if id := binary.BigEndian.Uint16(ip[4:]); id != 0 {
				t.Fatalf("IPv4 ID %#x on the wire, want 0 (header % x)", id, ip)
			}
			if binary.BigEndian.Uint16(ip[6:])&0x4000 == 0 {
				t.Fatal("DF not set on the wire")
			}
		}
		err = ib.VerifyFrameICRC(wire)
		switch {
		case i == n && pf.Version == 4 && err == nil:
			t.Fatal("a frame built with IPv4 ID 0x1234 verified on the wire")
		case i == n && pf.Version == 6 && err != nil:
			t.Fatalf("IPv6 has no ID; the frame should verify: %v", err)
		case i < n && err != nil:
			t.Fatalf("frame %d: ICRC on the wire: %v", i, err)
		}
		seen[i] = true
	}
	if len(seen) < n+1 {
		t.Fatalf("captured %d of %d datagrams", len(seen), n+1)
	}
	// The receiving link's synthesized frames carry ID 0 too, so from a
	// Linux sender they verify as well.
	got := collect(t, b, a.LocalAddr(), n+1, 5*time.Second)
	for i, f := range got[:n] {
		if err := ib.VerifyFrameICRC(f); err != nil {
			t.Fatalf("received frame %d: %v", i, err)
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func BenchmarkLoopback(b *testing.B) {
	for _, size := range []int{64, 1024, 4096} {
		for _, off := range []struct {
			name string
			opts Options
		}{{"", Options{}}, {"/no-offload", Options{DisableGSO: true, DisableGRO: true}}} {
			b.Run(fmt.Sprintf("%dB%s", size, off.name), func(b *testing.B) {
				benchLoopback(b, size, off.opts)
			})
		}
	}
}

func benchLoopback(b *testing.B, size int, opts Options) {
	x, y := listenOpts(b, "127.0.0.1", opts), listenOpts(b, "127.0.0.1", opts)
	const batch = 32
	frames := make([][]byte, batch)
	for i := range frames {
		frames[i] = mkframe(x.LocalAddr(), y.LocalAddr(), 0, payload(i, size))
	}
	ctx := context.Background()
	got := 0
	fn := func(f [][]byte) { got += len(f) }
	b.ReportAllocs()
	b.SetBytes(int64(batch * size))
	for b.Loop() {
		x.WriteBatch(frames)
		for got < batch {
			y.ReadBatch(ctx, fn)
		}
		got -= batch
	}
}

// TestCancelStress interleaves context expiries with arriving traffic: no
// expiry may leak into a later call (as a spurious timeout or a lost
// frame).
func TestCancelStress(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	const n = 3000
	go func() {
		for i := 0; i < n; i += 10 {
			batch := make([][]byte, 10)
			for j := range batch {
				batch[j] = mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(i+j, 32))
			}
			a.WriteBatch(batch)
			time.Sleep(time.Duration(i%7) * 20 * time.Microsecond)
		}
	}()
	got, timeouts := 0, 0
	fn := func(f [][]byte) { got += len(f) }
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; got < n && time.Now().Before(deadline); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*30*time.Microsecond)
		_, err := b.ReadBatch(ctx, fn)
		cancel()
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			timeouts++
		case err != nil:
			t.Fatalf("after %d frames: %v", got, err)
		}
	}
	if got != n {
		t.Fatalf("received %d of %d frames", got, n)
	}
	t.Logf("%d frames, %d expiries", got, timeouts)
}

// An address inside a loopback prefix but not listed on lo (127.0.0.2) is
// carried by lo, so the link must report lo's MTU, not a 1500 guess: the
// path MTU of the loopback perf run follows from it.
func TestLoopbackPrefixMTU(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skipf("no lo: %v", err)
	}
	for _, a := range []string{"127.0.0.1", "127.0.0.2", "::1"} {
		if l := listen(t, a); l.MTU() != lo.MTU {
			t.Errorf("%s: MTU %d, lo has %d", a, l.MTU(), lo.MTU)
		}
	}
}

// A wildcard link reports 1500 unless told its MTU; a link bound to an
// address reports its interface's whatever it is told.
func TestWildcardMTU(t *testing.T) {
	for _, c := range []struct {
		addr      string
		opt, want int
	}{{"0.0.0.0", 0, 1500}, {"0.0.0.0", 65536, 65536}, {"0.0.0.0", 9000, 9000}} {
		l, err := ListenOptions(netip.AddrPortFrom(netip.MustParseAddr(c.addr), 0), Options{EphemeralPort: true, WildcardMTU: c.opt})
		if err != nil {
			t.Skipf("no socket on %s: %v", c.addr, err)
		}
		if l.MTU() != c.want {
			t.Errorf("%s with WildcardMTU %d: MTU %d, want %d", c.addr, c.opt, l.MTU(), c.want)
		}
		l.Close()
	}
	if lo, err := net.InterfaceByName("lo"); err == nil {
		l, err := ListenOptions(netip.MustParseAddrPort("127.0.0.1:0"), Options{EphemeralPort: true, WildcardMTU: 1234})
		if err != nil {
			t.Skipf("no socket on 127.0.0.1: %v", err)
		}
		defer l.Close()
		if l.MTU() != lo.MTU {
			t.Errorf("127.0.0.1 with WildcardMTU 1234: MTU %d, lo has %d", l.MTU(), lo.MTU)
		}
	}
}

func TestPickInterface(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	ifs := []ifaceAddrs{
		{mtu: 65536, loopback: true, prefixes: pfx("127.0.0.1/8")},
		{mtu: 1500, prefixes: pfx("10.0.0.1/8", "fe80::1/64")},
		{mtu: 9000, prefixes: pfx("10.1.0.1/16", "10.2.0.9/16")},
	}
	for _, c := range []struct {
		ip   string
		want int
	}{
		{"127.0.0.1", 0},
		{"127.0.0.2", 0},
		{"127.255.0.1", 0},
		{"::1", 0},              // loopback with no prefix listed: lo
		{"::ffff:127.0.0.2", 0}, // v4-mapped
		{"10.0.0.1", 1},         // exact
		{"10.2.0.9", 2},         // exact beats the shorter 10/8
		{"10.1.2.3", 2},         // longest prefix
		{"10.3.0.1", 1},         // only 10/8 covers it
		{"fe80::2%eth0", 1},     // zone does not hide the prefix
		{"192.168.0.1", -1},     // on no interface
		{"2001:db8::1", -1},
	} {
		if got := pickInterface(netip.MustParseAddr(c.ip), ifs); got != c.want {
			t.Errorf("%s: interface %d, want %d", c.ip, got, c.want)
		}
	}
}
