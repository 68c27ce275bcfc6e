package udplink

import (
	"context"
	"errors"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
)

func listenPlain(t testing.TB, addr string) *PlainLink {
	t.Helper()
	l, err := ListenPlain(netip.AddrPortFrom(netip.MustParseAddr(addr), 0), Options{EphemeralPort: true, MaxDatagram: 2000})
	if err != nil {
		if addr == "::1" || addr == "::" {
			t.Skipf("IPv6 unavailable: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The portable link carries frames both ways, one datagram per call, with
// the headers synthesized as on Linux; bound to a wildcard address it
// learns each datagram's destination from its control messages.
func TestPlainLoopback(t *testing.T) {
	for _, tc := range []struct{ bind, peer string }{
		{"127.0.0.1", "127.0.0.1"},
		{"::1", "::1"},
		{"0.0.0.0", "127.0.0.1"},
		{"::", "::1"},
	} {
		t.Run(tc.bind, func(t *testing.T) {
			if runtime.GOOS == "windows" && netip.MustParseAddr(tc.bind).IsUnspecified() {
				t.Skip("windows does not report a datagram's destination")
			}
			a, b := listenPlain(t, tc.bind), listenPlain(t, tc.peer)
			peer := netip.MustParseAddr(tc.peer)
			aAddr := netip.AddrPortFrom(peer, a.LocalAddr().Port()) // a's frames leave from the peer address
			for _, dir := range []struct {
				s, r         *PlainLink
				from, to     netip.AddrPort
				wildcardRecv bool
			}{{a, b, aAddr, b.LocalAddr(), false}, {b, a, b.LocalAddr(), aAddr, true}} {
				const n = 150
				frames := make([][]byte, n)
				for i := range frames {
					frames[i] = mkframe(dir.from, dir.to, uint8(i%2)<<2, payload(i, 28+i*10))
				}
				if k, err := dir.s.WriteBatch(frames); k != n || err != nil {
					t.Fatalf("WriteBatch = %d, %v", k, err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				for i := 0; i < n; i++ {
					k, err := dir.r.ReadBatch(ctx, func(fs [][]byte) {
						if len(fs) != 1 {
							t.Fatalf("%d frames in one batch", len(fs))
						}
						pf, err := link.ParseFrame(fs[0])
						if err != nil {
							t.Fatalf("synthesized frame does not parse: %v", err)
						}
						if pf.Src != dir.from.Addr() || pf.SrcPort != dir.from.Port() || pf.Dst != dir.to.Addr() || pf.DstPort != dir.to.Port() {
							t.Fatalf("frame %v:%d -> %v:%d, want %v -> %v", pf.Src, pf.SrcPort, pf.Dst, pf.DstPort, dir.from, dir.to)
						}
						if string(fs[0][pf.Payload:pf.End]) != string(payload(i, 28+i*10)) {
							t.Fatalf("frame %d payload differs", i)
						}
						if pf.Version == 4 && !ib.IPv4(fs[0][pf.IPOffset:pf.IPOffset+link.IPv4Size]).ChecksumValid() {
							t.Fatalf("frame %d: bad IPv4 checksum", i)
						}
					})
					if k != 1 || err != nil {
						cancel()
						t.Fatalf("ReadBatch %d = %d, %v", i, k, err)
					}
				}
				cancel()
			}
			if st := a.Stats(); st.GSO || st.GRO || st.GSOSends != 0 {
				t.Fatalf("Stats = %+v: the plain link has no offloads", st)
			}
			if info := a.Info(); info.Kind != link.KindUDP || !info.Synthetic || info.FixedSourcePort != a.LocalAddr().Port() {
				t.Fatalf("Info = %+v", info)
			}
		})
	}
}

// Oversize datagrams are dropped and counted; refused frames name their
// index; a cancelled context and Close end a blocked read.
func TestPlainDropsAndErrors(t *testing.T) {
	a, b := listenPlain(t, "127.0.0.1"), listenPlain(t, "127.0.0.1")
	big := mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 3000))
	small := mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(1, 100))
	if k, err := a.WriteBatch([][]byte{big, small}); k != 2 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", k, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got int
	if _, err := b.ReadBatch(ctx, func(fs [][]byte) {
		pf, _ := link.ParseFrame(fs[0])
		got = pf.End - pf.Payload
	}); err != nil || got != 100 {
		t.Fatalf("ReadBatch: %v, payload %d; want the 100-byte datagram", err, got)
	}
	if b.Stats().Truncated != 1 {
		t.Fatalf("Truncated = %d, want 1", b.Stats().Truncated)
	}

	other := mkframe(netip.MustParseAddrPort("127.0.0.9:1"), b.LocalAddr(), 0, payload(2, 10))
	var fe *link.FrameError
	if k, err := a.WriteBatch([][]byte{small, other}); k != 1 || !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, link.ErrRefused) || link.ReasonOf(err) != "source-port" {
		t.Fatalf("WriteBatch of a foreign frame = %d, %v", k, err)
	}

	cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer ccancel()
	drain, dcancel := context.WithTimeout(context.Background(), time.Second)
	b.ReadBatch(drain, func([][]byte) {}) // the small frame just sent
	dcancel()
	if _, err := b.ReadBatch(cctx, func([][]byte) {}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadBatch after its context ended: %v", err)
	}
	done := make(chan error)
	go func() {
		_, err := b.ReadBatch(context.Background(), func([][]byte) {})
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case err := <-done:
		if !errors.Is(err, link.ErrClosed) {
			t.Fatalf("ReadBatch on close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock ReadBatch")
	}
	if err := b.Close(); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}
