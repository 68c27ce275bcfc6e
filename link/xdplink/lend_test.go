package xdplink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
)

// Frames built in lent UMEM spans arrive intact: a 4170-byte frame after
// 128 bytes of headroom spans two chunks; the link refuses what the device
// would drop and takes every span back; a lend-send cycle allocates
// nothing.
func TestLendTx(t *testing.T) {
	for _, tc := range []struct {
		mtu, frameSize, frameLen, size int
		multi                          bool
	}{
		{1500, 2048, 1000, 1408, false},
		{9000, 4096, 4170, 4480, true},
	} {
		t.Run(fmt.Sprint(tc.frameLen), func(t *testing.T) {
			a, b := pair(t, tc.mtu, xdplink.Options{FrameSize: tc.frameSize, Multibuffer: tc.multi})
			free0 := a.l.Socket().TxFree()
			const batch, headroom = 16, 128
			bufs := make([][]byte, batch)
			frames := make([][]byte, batch)
			got, seq := 0, uint32(0)
			count := func(fs [][]byte) {
				for _, f := range fs {
					if isOurs(f) && len(f) == tc.frameLen {
						got++
					}
				}
			}
			ctx := context.Background()
			cycle := func() {
				n := a.l.LendTx(bufs, tc.size)
				if n != batch {
					t.Fatalf("LendTx lent %d of %d", n, batch)
				}
				for i, buf := range bufs {
					if len(buf) < tc.size {
						t.Fatalf("lent %d bytes, asked for %d", len(buf), tc.size)
					}
					frames[i] = buf[headroom : headroom+tc.frameLen]
					udpFrame(frames[i], b.mac, a.mac, seq)
					seq++
				}
				if n, err := a.l.WriteLent(bufs, frames); n != batch || err != nil {
					t.Fatalf("WriteLent: %d, %v", n, err)
				}
				for got < batch {
					if _, err := b.l.ReadBatch(ctx, count); err != nil {
						t.Fatal(err)
					}
				}
				got = 0
			}
			cycle()
			if allocs := testing.AllocsPerRun(100, cycle); allocs != 0 {
				t.Fatalf("%v allocations per lend-send cycle, want 0", allocs)
			}

			// Refused frames: too short, too long; the rest is sent.
			n := a.l.LendTx(bufs[:4], tc.size)
			if n != 4 {
				t.Fatalf("LendTx lent %d of 4", n)
			}
			for i := range 4 {
				frames[i] = bufs[i][headroom : headroom+tc.frameLen]
				udpFrame(frames[i], b.mac, a.mac, seq)
			}
			frames[1] = bufs[1][:10]
			want := 3
			if len(bufs[2]) > tc.mtu+100 {
				frames[2] = bufs[2][:tc.mtu+100]
				want = 2
			}
			sent, err := a.l.WriteLent(bufs[:4], frames[:4])
			var fe *link.FrameError
			if sent != want || !errors.As(err, &fe) || fe.Index != 1 || !errors.Is(err, link.ErrMalformed) || link.ReasonOf(err) != "truncated" {
				t.Fatalf("WriteLent with refused frames: %d, %v", sent, err)
			}
			// ReturnTx gives back unused spans.
			if n := a.l.LendTx(bufs[:3], tc.size); n != 3 {
				t.Fatalf("LendTx lent %d of 3", n)
			}
			a.l.ReturnTx(bufs[:3])
			// Too large to lend.
			if n := a.l.LendTx(bufs[:1], 17*tc.frameSize); n != 0 {
				t.Fatalf("LendTx of %d bytes lent %d", 17*tc.frameSize, n)
			}
			deadline := time.Now().Add(5 * time.Second)
			for a.l.Socket().TxFree() != free0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d TX chunks free, want %d", a.l.Socket().TxFree(), free0)
				}
				a.l.Socket().Complete()
				time.Sleep(time.Millisecond)
			}
		})
	}
}

// Close waits for lent spans, which live in the UMEM it frees.
func TestCloseWaitsForLoans(t *testing.T) {
	a, _ := pair(t, 1500, xdplink.Options{FrameSize: 2048})
	bufs := make([][]byte, 2)
	if n := a.l.LendTx(bufs, 1000); n != 2 {
		t.Fatalf("LendTx lent %d", n)
	}
	closed := make(chan error, 1)
	go func() { closed <- a.l.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned with spans lent: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	bufs[0][0] = 1 // still mapped
	if n, err := a.l.WriteLent(bufs[:1], [][]byte{bufs[0][:60]}); n != 0 || !errors.Is(err, link.ErrClosed) {
		t.Fatalf("WriteLent while closing: %d, %v", n, err)
	}
	a.l.ReturnTx(bufs[1:])
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n := a.l.LendTx(bufs, 1000); n != 0 {
		t.Fatalf("LendTx after Close lent %d", n)
	}
}
