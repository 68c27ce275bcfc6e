package udplink

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/sys"
	"github.com/goroce/goroce/link"
)

func listenOpts(t testing.TB, addr string, opts Options) *Link {
	t.Helper()
	opts.EphemeralPort = true
	l, err := ListenOptions(netip.AddrPortFrom(netip.MustParseAddr(addr), 0), opts)
	if err != nil {
		if addr == "::1" {
			t.Skipf("IPv6 loopback unavailable: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func requireOffloads(t testing.TB, l *Link) {
	t.Helper()
	if s := l.Stats(); !s.GSO || !s.GRO {
		t.Skipf("kernel without UDP GSO (4.18) or GRO (5.0): %+v", s)
	}
}

// runsOf prepares frames as one chunk and returns each message's payload
// sizes, checking the UDP_SEGMENT message of every run.
func runsOf(t *testing.T, l *Link, frames [][]byte, single int) [][]int {
	t.Helper()
	nf, nm, bad := l.senders[0].fillChunk(frames, single, true)
	defer l.senders[0].clearSend(nf)
	if bad != nil || nf != min(len(frames), l.batch) {
		t.Fatalf("fillChunk = %d frames, %v", nf, bad)
	}
	var runs [][]int
	for k := 0; k < nm; k++ {
		r := l.senders[0].runs[k]
		h := &l.senders[0].wmsgs[k].Hdr
		if int(h.Iovlen) != r.count || h.Iov != &l.senders[0].wiovs[r.first] {
			t.Fatalf("message %d: %d iovecs from %p, run %+v", k, h.Iovlen, h.Iov, r)
		}
		var sizes []int
		for j := r.first; j < r.first+r.count; j++ {
			sizes = append(sizes, int(l.senders[0].wiovs[j].Len))
		}
		seg := 0
		if h.Controllen > 0 {
			oob := unsafe.Slice(h.Control, h.Controllen)
			for {
				c, rest, ok := sys.NextCmsg(oob)
				if !ok {
					break
				}
				oob = rest
				if c.Level == unix.SOL_UDP && c.Type == unix.UDP_SEGMENT {
					seg = int(*(*uint16)(unsafe.Pointer(&c.Data[0])))
				}
			}
		}
		switch {
		case r.count > 1 && seg != sizes[0]:
			t.Fatalf("run %v: UDP_SEGMENT %d", sizes, seg)
		case r.count == 1 && seg != 0:
			t.Fatalf("single datagram with UDP_SEGMENT %d", seg)
		}
		runs = append(runs, sizes)
	}
	return runs
}

func sizesOf(n, size int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = size
	}
	return s
}

func TestGSORuns(t *testing.T) {
	a := listenOpts(t, "127.0.0.1", Options{Batch: 128})
	b := netip.MustParseAddrPort("127.0.0.1:5000")
	c := netip.MustParseAddrPort("127.0.0.1:5001")
	remote := netip.MustParseAddrPort("10.1.2.3:4791")
	mk := func(dst netip.AddrPort, tos uint8, sizes ...int) [][]byte {
		var fs [][]byte
		for i, s := range sizes {
			fs = append(fs, mkframe(a.LocalAddr(), dst, tos, payload(i, s)))
		}
		return fs
	}
	// qp sets the destination QPN of frames (payload's is 0).
	qp := func(fs [][]byte, qpn uint32) [][]byte {
		for _, f := range fs {
			pf, _ := link.ParseFrame(f)
			binary.BigEndian.PutUint32(f[pf.Payload+4:], qpn)
		}
		return fs
	}
	cat := func(fss ...[][]byte) (all [][]byte) {
		for _, fs := range fss {
			all = append(all, fs...)
		}
		return all
	}
	for _, tc := range []struct {
		name   string
		frames [][]byte
		single int
		want   [][]int
	}{
		{"equal", mk(b, 0, sizesOf(10, 1000)...), 0, [][]int{sizesOf(10, 1000)}},
		{"one", mk(b, 0, 1000), 0, [][]int{{1000}}},
		{"short last ends the run", mk(b, 0, 1000, 1000, 1000, 400, 1000, 1000), 0,
			[][]int{{1000, 1000, 1000, 400}, {1000, 1000}}},
		{"mixed sizes", mk(b, 0, 1000, 1200, 1200, 800, 800, 800), 0,
			[][]int{{1000}, {1200, 1200, 800}, {800, 800}}},
		{"mixed destinations", cat(mk(b, 0, 1000, 1000), mk(c, 0, 1000), mk(b, 0, 1000, 1000)), 0,
			[][]int{{1000, 1000}, {1000}, {1000, 1000}}},
		{"traffic class", cat(mk(b, 0, 1000, 1000), mk(b, 26<<2, 1000, 1000)), 0,
			[][]int{{1000, 1000}, {1000, 1000}}},
		{"segment limit", mk(b, 0, sizesOf(100, 100)...), 0,
			[][]int{sizesOf(gsoMaxSegments, 100), sizesOf(100-gsoMaxSegments, 100)}},
		{"byte limit", mk(b, 0, sizesOf(20, 4000)...), 0, [][]int{sizesOf(16, 4000), sizesOf(4, 4000)}},
		{"empty payloads stay alone", cat([][]byte{mkframe(a.LocalAddr(), b, 0, nil), mkframe(a.LocalAddr(), b, 0, nil)}, mk(b, 0, 100, 100)), 0,
			[][]int{{0}, {0}, {100, 100}}},
		{"resent one by one", mk(b, 0, sizesOf(5, 1000)...), 3,
			[][]int{{1000}, {1000}, {1000}, {1000, 1000}}},
		{"another QP ends the run", cat(mk(b, 0, 1000, 1000), qp(mk(b, 0, 1000, 1000), 18), mk(b, 0, 1000)), 0,
			[][]int{{1000, 1000}, {1000, 1000}, {1000}}},
		// The kernel gives an IPv4 run's segments consecutive IDs, which
		// a peer checking the ICRC over the wire header refuses.
		{"remote IPv4 never", mk(remote, 0, 1000, 1000, 1000), 0, [][]int{{1000}, {1000}, {1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runsOf(t, a, tc.frames, tc.single)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("runs %v, want %v", got, tc.want)
			}
		})
	}

	// IPv6 has no ID: a remote peer gets runs too.
	v6 := listenOpts(t, "::1", Options{})
	src := netip.AddrPortFrom(v6.LocalAddr().Addr(), v6.LocalAddr().Port())
	dst := netip.MustParseAddrPort("[fd00::2]:4791")
	frames := [][]byte{mkframe(src, dst, 0, payload(0, 1000)), mkframe(src, dst, 0, payload(1, 1000))}
	if got := runsOf(t, v6, frames, 0); fmt.Sprint(got) != "[[1000 1000]]" {
		t.Fatalf("IPv6 remote runs %v", got)
	}
}

// groFixture puts datagrams of the given lengths, each with segment size
// seg (0: no UDP_GRO message), into the receive state of l as recvmmsg
// would, and returns what each buffer holds.
func groFixture(l *Link, from netip.AddrPort, lens []int, seg []int) [][]byte {
	l.resetRecv()
	var bufs [][]byte
	for i, n := range lens {
		p := payload(i, n)
		scatter(&l.rmsgs[i].Hdr, p)
		bufs = append(bufs, p)
		m := &l.rmsgs[i]
		m.Len = uint32(n)
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&l.rnames[i]))
		sa.Family = unix.AF_INET
		sa.Addr = from.Addr().As4()
		pp := (*[2]byte)(unsafe.Pointer(&sa.Port))
		pp[0], pp[1] = byte(from.Port()>>8), byte(from.Port())
		oob := l.roob[i*oobSize : (i+1)*oobSize]
		d, off := sys.PutCmsg(oob, unix.IPPROTO_IP, unix.IP_PKTINFO, unix.SizeofInet4Pktinfo)
		(*unix.Inet4Pktinfo)(unsafe.Pointer(&d[0])).Addr = l.addr.As4()
		if seg[i] > 0 {
			d, sp := sys.PutCmsg(oob[off:], unix.SOL_UDP, unix.UDP_GRO, 4)
			*(*int32)(unsafe.Pointer(&d[0])) = int32(seg[i])
			off += sp
		}
		m.Hdr.SetControllen(off)
	}
	l.rn = len(lens)
	l.rdirty = len(lens) // as recvmmsg would: the next read resets them
	return bufs
}

// scatter writes p across the iovecs of m, as the kernel fills a receive.
func scatter(m *unix.Msghdr, p []byte) {
	for _, iov := range unsafe.Slice(m.Iov, m.Iovlen) {
		if len(p) == 0 {
			return
		}
		c := copy(unsafe.Slice(iov.Base, iov.Len), p)
		p = p[c:]
	}
	if len(p) > 0 {
		panic("scatter: more data than the receive buffer holds")
	}
}

func TestGROSplit(t *testing.T) {
	l := listenOpts(t, "127.0.0.1", Options{MaxDatagram: 4200})
	requireOffloads(t, l)
	from := netip.MustParseAddrPort("127.0.0.9:7000")
	for _, tc := range []struct {
		name      string
		lens, seg []int
		want      [][]int // per buffer: the segment sizes delivered
		truncated uint64
	}{
		{"exact", []int{4000}, []int{1000}, [][]int{{1000, 1000, 1000, 1000}}, 0},
		{"short last", []int{3500}, []int{1000}, [][]int{{1000, 1000, 1000, 500}}, 0},
		{"no UDP_GRO message", []int{1200}, []int{0}, [][]int{{1200}}, 0},
		{"segment as long as the buffer", []int{1200}, []int{1200}, [][]int{{1200}}, 0},
		{"mixed buffers", []int{300, 8272, 20}, []int{0, 4136, 0}, [][]int{{300}, {4136, 4136}, {20}}, 0},
		// Segments longer than MaxDatagram are dropped; a short last one
		// that fits is kept.
		{"over MaxDatagram", []int{9000, 100}, []int{5000, 0}, [][]int{{4000}, {100}}, 1},
		{"full run", []int{64 * 1000}, []int{1000}, [][]int{sizesOf(64, 1000)}, 0},
		{"full run of 1024", []int{64 * 1024}, []int{1024}, [][]int{sizesOf(64, 1024)}, 0},
		{"runs of two sizes", []int{4136 * 3, 1024*5 + 7}, []int{4136, 1024}, [][]int{{4136, 4136, 4136}, {1024, 1024, 1024, 1024, 1024, 7}}, 0},
	} {
		// Every case under every receive layout: one iovec, and spread for
		// 1024, 4136 and 4200-byte segments (in place when they match,
		// gathered across the iovecs when they do not).
		for _, spread := range []int{0, 1024, 4136, 4200} {
			t.Run(fmt.Sprintf("%s/spread%d", tc.name, spread), func(t *testing.T) {
				l.setSpread(spread)
				testGROSplit(t, l, from, tc.lens, tc.seg, tc.want, tc.truncated)
				if spread != 0 && l.off.spread != spread {
					t.Fatalf("layout changed to %d after fewer than %d datagrams", l.off.spread, spreadWindow)
				}
			})
		}
	}
}

// testGROSplit delivers buffers of lens with segment sizes seg from the
// receive layout l has now and checks the frames against want (per
// buffer, the segment sizes delivered). With a layout for the one segment
// size of every coalesced buffer (and no lone datagram longer), nothing
// may be copied; with none, every segment but each buffer's first is.
func testGROSplit(t *testing.T, l *Link, from netip.AddrPort, lens, seg []int, wantSegs [][]int, truncated uint64) {
	l.off.hits, l.off.misses = 0, 0
	spread := l.off.spread
	before, copiedBefore := l.Stats().Truncated, l.Stats().GROCopied
	bufs := groFixture(l, from, lens, seg)
	var want [][]byte
	firsts, matched := 0, true
	for i, segs := range wantSegs {
		off := 0
		if truncated > 0 && i == 0 {
			off = seg[0] // the dropped segment
		}
		if off == 0 {
			firsts++
		}
		coalesced := seg[i] > 0 && seg[i] < lens[i]
		if coalesced && seg[i] != spread || !coalesced && lens[i] > spread {
			matched = false // a segment size of its own, or one datagram across iovecs
		}
		for _, s := range segs {
			want = append(want, bufs[i][off:off+s])
			off += s
		}
	}
	var got [][]byte
	n := l.deliver(func(frames [][]byte) {
		for _, f := range frames {
			got = append(got, append([]byte(nil), f...))
		}
	})
	if n != len(want) || len(got) != len(want) {
		t.Fatalf("delivered %d frames, want %d", len(got), len(want))
	}
	for i, f := range got {
		pf, err := link.ParseFrame(f)
		if err != nil || pf.End != len(f) {
			t.Fatalf("frame %d: %v, end %d of %d", i, err, pf.End, len(f))
		}
		if pf.Src != from.Addr() || pf.SrcPort != from.Port() || pf.Dst != l.addr || pf.DstPort != l.port {
			t.Fatalf("frame %d: %v:%d -> %v:%d", i, pf.Src, pf.SrcPort, pf.Dst, pf.DstPort)
		}
		if ip := f[pf.IPOffset:pf.UDPOffset]; !ib.IPv4(ip).ChecksumValid() {
			t.Fatalf("frame %d: IPv4 checksum", i)
		}
		if !bytes.Equal(f[pf.Payload:pf.End], want[i]) {
			t.Fatalf("frame %d: payload of %d bytes differs from the %d-byte segment", i, pf.End-pf.Payload, len(want[i]))
		}
	}
	if d := l.Stats().Truncated - before; d != truncated {
		t.Fatalf("truncated %d, want %d", d, truncated)
	}
	copied := l.Stats().GROCopied - copiedBefore
	switch {
	case spread == 0 && copied != uint64(len(want)-firsts):
		t.Fatalf("one iovec: %d segments copied, want %d", copied, len(want)-firsts)
	case spread > 0 && matched && truncated == 0 && copied != 0:
		t.Fatalf("layout for the segment size: %d segments copied, want none", copied)
	}
}

// TestGROInPlace sends runs of one size over loopback: after the first
// coalesced buffer the receive layout fits them, and the segments stay
// where the kernel put them.
func TestGROInPlace(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			s, r := listenOpts(t, addr, Options{}), listenOpts(t, addr, Options{})
			requireOffloads(t, r)
			for range 10 {
				exchange(t, s, []*Link{r}, sizesOf(64, 4096+28+4))
			}
			st := r.Stats()
			if st.GRODatagrams < 320 {
				t.Skipf("only %d of 640 datagrams arrived coalesced: the kernel kept few runs whole", st.GRODatagrams)
			}
			if st.GROCopied > 64 || r.off.spread != 4096+28+4 {
				t.Fatalf("%d of %d coalesced datagrams copied, layout for %d-byte segments", st.GROCopied, st.GRODatagrams, r.off.spread)
			}
		})
	}
}

func FuzzGROSegment(f *testing.F) {
	b := make([]byte, 128)
	d, off := sys.PutCmsg(b, unix.IPPROTO_IP, unix.IP_TOS, 1)
	d[0] = 1
	d, sp := sys.PutCmsg(b[off:], unix.SOL_UDP, unix.UDP_GRO, 4)
	*(*int32)(unsafe.Pointer(&d[0])) = 1400
	f.Add(b[:off+sp])
	f.Add(b[:off])
	f.Add(b[:off+sp-1])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Aligned, as the kernel's control buffer is.
		buf := make([]uint64, (len(b)+7)/8)
		a := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*8)[:len(b)]
		copy(a, b)
		if s := groSegment(a); s < 0 {
			t.Fatalf("segment %d", s)
		}
	})
}

// exchange sends rounds of frames from s to r (and, when r2 is set,
// alternately to it) and checks every payload on arrival, in order.
func exchange(t *testing.T, s *Link, rs []*Link, sizes []int) {
	t.Helper()
	var frames [][]byte
	want := make([][][]byte, len(rs))
	for i, size := range sizes {
		k := (i / 7) % len(rs) // runs of 7 to each receiver in turn
		p := payload(i, size)
		frames = append(frames, mkframe(s.LocalAddr(), rs[k].LocalAddr(), 0, p))
		want[k] = append(want[k], p)
	}
	if n, err := s.WriteBatch(frames); n != len(frames) || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	for k, r := range rs {
		got := collect(t, r, s.LocalAddr(), len(want[k]), 5*time.Second)
		for i, f := range got {
			pf, _ := link.ParseFrame(f)
			if !bytes.Equal(f[pf.Payload:pf.End], want[k][i]) {
				t.Fatalf("receiver %d frame %d: %d bytes differ from the %d sent", k, i, pf.End-pf.Payload, len(want[k][i]))
			}
		}
	}
}

func TestGSOGROLoopback(t *testing.T) {
	var sizes []int
	for i := 0; i < 300; i++ {
		switch {
		case i%50 == 49:
			sizes = append(sizes, 77) // a short one ends a run
		case i < 150:
			sizes = append(sizes, 1024+28+4)
		default:
			sizes = append(sizes, 4096+28+4)
		}
	}
	for _, addr := range []string{"127.0.0.1", "::1"} {
		for _, mode := range []struct {
			name     string
			tx, rx   Options
			gso, gro bool
		}{
			{"GSO+GRO", Options{}, Options{}, true, true},
			{"GSO, no GRO", Options{}, Options{DisableGRO: true}, true, false},
			{"GRO, no GSO", Options{DisableGSO: true}, Options{}, false, false},
			{"neither", Options{DisableGSO: true}, Options{DisableGRO: true}, false, false},
		} {
			t.Run(addr+"/"+mode.name, func(t *testing.T) {
				s := listenOpts(t, addr, mode.tx)
				r1, r2 := listenOpts(t, addr, mode.rx), listenOpts(t, addr, mode.rx)
				requireOffloads(t, listenOpts(t, addr, Options{}))
				exchange(t, s, []*Link{r1}, sizes)
				exchange(t, s, []*Link{r1, r2}, sizes)
				st, rt := s.Stats(), r1.Stats()
				if st.GSO != mode.gso || (st.GSOSends > 0) != mode.gso || st.GSOFallbacks != 0 {
					t.Fatalf("sender stats %+v", st)
				}
				if rt.GRO != !mode.rx.DisableGRO || (rt.GROBuffers > 0) != mode.gro || rt.Truncated != 0 {
					t.Fatalf("receiver stats %+v", rt)
				}
				if mode.gso && mode.gro && rt.GRODatagrams < st.GSODatagrams/4 {
					t.Fatalf("sent %d datagrams in runs, %d arrived in coalesced buffers", st.GSODatagrams, rt.GRODatagrams)
				}
			})
		}
	}
}

// TestGSOFallback makes the kernel refuse segmentation for real: it will
// not segment without UDP checksums (SO_NO_CHECK). The run is resent one
// datagram at a time and GSO is turned off.
func TestGSOFallback(t *testing.T) {
	s, r := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	requireOffloads(t, s)
	var serr error
	if err := s.rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	sizes := sizesOf(40, 1000)
	sizes[0] = 500 // a single datagram before the first run
	exchange(t, s, []*Link{r}, sizes)
	if st := s.Stats(); st.GSO || st.GSOFallbacks != 1 || st.GSOSends != 0 {
		t.Fatalf("stats %+v, want GSO off after one fallback", st)
	}
	exchange(t, s, []*Link{r}, sizes)
	if st := s.Stats(); st.GSOFallbacks != 1 {
		t.Fatalf("stats %+v after GSO was turned off", st)
	}
}

func TestNoAllocOffloads(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		for i, opts := range []Options{{}, {DisableGRO: true}, {DisableGSO: true}} {
			t.Run(fmt.Sprintf("%s/%s", addr, []string{"GSO+GRO", "GSO", "GRO"}[i]), func(t *testing.T) {
				a, b := listenOpts(t, addr, opts), listenOpts(t, addr, opts)
				// Runs, a short datagram, and a second destination.
				var frames [][]byte
				for i := 0; i < 40; i++ {
					dst, size := b.LocalAddr(), 1024
					switch {
					case i == 20:
						size = 100
					case i > 30:
						dst = a.LocalAddr()
					}
					frames = append(frames, mkframe(a.LocalAddr(), dst, 0, payload(i, size)))
				}
				ctx := context.Background()
				got := 0
				fn := func(f [][]byte) { got += len(f) }
				step := func() {
					if _, err := a.WriteBatch(frames); err != nil {
						t.Fatal(err)
					}
					for got < 31 {
						if _, err := b.ReadBatch(ctx, fn); err != nil {
							t.Fatal(err)
						}
					}
					for got < 40 {
						if _, err := a.ReadBatch(ctx, fn); err != nil {
							t.Fatal(err)
						}
					}
					got -= 40
				}
				for range 50 {
					step()
				}
				if allocs := testing.AllocsPerRun(200, step); allocs != 0 {
					t.Fatalf("%v allocations per batch", allocs)
				}
			})
		}
	}
}

// FuzzGROLayout delivers one received buffer of plen bytes cut at seg from
// a receive layout for spread-byte segments: the frames must be the run's
// segments in order, whatever the three sizes.
func FuzzGROLayout(f *testing.F) {
	f.Add(uint16(4112*15), uint16(4112), uint16(4112))
	f.Add(uint16(4128*2), uint16(4128), uint16(4112))
	f.Add(uint16(4128), uint16(0), uint16(4112))
	f.Add(uint16(65000), uint16(1024), uint16(1025))
	f.Add(uint16(3000), uint16(1000), uint16(0))
	l := listenOpts(f, "127.0.0.1", Options{MaxDatagram: 4200})
	requireOffloads(f, l)
	from := netip.MustParseAddrPort("127.0.0.9:7000")
	f.Fuzz(func(t *testing.T, plen, seg, spread uint16) {
		n := min(int(plen), groBufSize-8)
		if n == 0 {
			return
		}
		l.setSpread(int(spread))
		l.off.hits, l.off.misses = 0, 0
		bufs := groFixture(l, from, []int{n}, []int{int(seg)})
		cut := int(seg)
		if cut <= 0 || cut >= n {
			cut = n
		}
		off := 0
		l.deliver(func(frames [][]byte) {
			for _, fr := range frames {
				pf, err := link.ParseFrame(fr)
				if err != nil {
					t.Fatal(err)
				}
				for off < n && min(cut, n-off) > l.off.maxDatagram {
					off += cut // dropped as too long
				}
				want := bufs[0][off : off+min(cut, n-off)]
				if !bytes.Equal(fr[pf.Payload:pf.End], want) {
					t.Fatalf("segment at %d differs", off)
				}
				off += cut
			}
		})
	})
}

// TestGROPullTail: a run cut a little above the receive layout's segment
// size (a message's first packet, with its RETH, leads a run of the
// others) keeps the segments whose tails fit in the header gap where they
// are, and gathers the rest; every frame carries its own segment.
func TestGROPullTail(t *testing.T) {
	l := listenOpts(t, "127.0.0.1", Options{MaxDatagram: 4200})
	requireOffloads(t, l)
	from := netip.MustParseAddrPort("127.0.0.9:7000")
	for _, tc := range []struct {
		lens   []int // segment sizes of the run
		copied uint64
	}{
		{[]int{4128, 4112}, 0},
		{[]int{4128, 4128}, 0},
		{[]int{4128, 4128, 4112}, 0},
		{[]int{4128, 4128, 4128}, 1}, // the third tail (48 bytes) does not fit the 42-byte gap
		{[]int{4128, 4128, 10}, 0},
		{[]int{4150, 4150}, 1}, // 76 bytes past the spread: the second does not fit
	} {
		l.setSpread(4112)
		l.off.hits, l.off.misses = 0, 0
		plen := 0
		for _, n := range tc.lens {
			plen += n
		}
		before := l.Stats().GROCopied
		bufs := groFixture(l, from, []int{plen}, []int{tc.lens[0]})
		var got [][]byte
		l.deliver(func(frames [][]byte) {
			for _, f := range frames {
				pf, err := link.ParseFrame(f)
				if err != nil || pf.End != len(f) {
					t.Fatalf("%v: frame %d: %v", tc.lens, len(got), err)
				}
				got = append(got, append([]byte(nil), f[pf.Payload:pf.End]...))
			}
		})
		if len(got) != len(tc.lens) {
			t.Fatalf("%v: %d frames", tc.lens, len(got))
		}
		off := 0
		for i, n := range tc.lens {
			if !bytes.Equal(got[i], bufs[0][off:off+n]) {
				t.Fatalf("%v: segment %d differs", tc.lens, i)
			}
			off += n
		}
		if c := l.Stats().GROCopied - before; c != tc.copied {
			t.Fatalf("%v: %d segments copied, want %d", tc.lens, c, tc.copied)
		}
	}
}
