package xdp_test

import (
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/xdp"
)

// TestTxSpans builds frames in place in spans of adjacent chunks
// (AllocTxSpan, SubmitTxSpans): a 4096-MTU RoCE frame after 86 bytes of
// headroom crosses into a second chunk and arrives whole, as does a small
// frame in a two-chunk span, whose unused chunk is freed at once.
func TestTxSpans(t *testing.T) {
	a, b := newPair(t, 9000, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 4096}, Multibuffer: true})
	if !a.sock.Multibuffer() {
		t.Skip("no multi-buffer")
	}
	free0 := a.sock.TxFree()
	r := newReceiver(t, b.sock, a.mac)
	const total = 600
	spans, frames := make([][]byte, 0, 16), make([][]byte, 0, 16)
	for seq := 0; seq < total; {
		spans, frames = spans[:0], frames[:0]
		for len(spans) < cap(spans) && seq+len(spans) < total {
			sp := a.sock.AllocTxSpan(2)
			if sp == nil {
				break
			}
			if len(sp) != 8192 {
				t.Fatalf("span of %d bytes, want 8192", len(sp))
			}
			l := frameLen(uint32(seq+len(spans)), 4170)
			f := sp[86 : 86+l]
			fillFrame(f, b.mac, a.mac, uint32(seq+len(spans)))
			spans, frames = append(spans, sp), append(frames, f)
		}
		if len(spans) == 0 {
			a.sock.Complete()
			time.Sleep(time.Millisecond)
			continue
		}
		n, err := a.sock.SubmitTxSpans(spans, frames)
		if err != nil {
			t.Fatalf("SubmitTxSpans: %d, %v", n, err)
		}
		for _, sp := range spans[n:] {
			a.sock.FreeTxSpan(sp)
		}
		// Frames must arrive in order: the ones not queued are built
		// again.
		seq += n
		r.until(seq, 5*time.Second)
	}
	if r.multi == 0 {
		t.Error("no frame crossed into a second chunk")
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.sock.TxFree() != free0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d TX chunks free, want all %d back", a.sock.TxFree(), free0)
		}
		a.sock.Complete()
		time.Sleep(time.Millisecond)
	}
	if a.sock.Sent() != total {
		t.Fatalf("Sent = %d", a.sock.Sent())
	}
}

// Spans and frames that are not what AllocTxSpan handed out are refused,
// and a refused span can still be freed.
func TestTxSpanMisuse(t *testing.T) {
	a, _ := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
	if sp := a.sock.AllocTxSpan(2); sp != nil {
		t.Fatal("two-chunk span without multi-buffer")
	}
	if sp := a.sock.AllocTxSpan(0); sp != nil {
		t.Fatal("empty span")
	}
	free0 := a.sock.TxFree()
	sp := a.sock.AllocTxSpan(1)
	if len(sp) != 2048 {
		t.Fatalf("span of %d bytes", len(sp))
	}
	for _, c := range []struct {
		name        string
		span, frame []byte
	}{
		{"foreign span", make([]byte, 2048), sp[:60]},
		{"span not at a chunk", sp[1:], sp[1:61]},
		{"frame outside", sp, make([]byte, 60)},
	} {
		if n, err := a.sock.SubmitTxSpans([][]byte{c.span}, [][]byte{c.frame}); n != 0 || !errors.Is(err, xdp.ErrBadSpan) {
			t.Errorf("%s: %d, %v", c.name, n, err)
		}
	}
	if n, err := a.sock.SubmitTxSpans([][]byte{sp}, [][]byte{sp[:0]}); n != 0 || !errors.Is(err, xdp.ErrEmptyFrame) {
		t.Errorf("empty frame: %d, %v", n, err)
	}
	a.sock.FreeTxSpan(sp)
	a.sock.FreeTxSpan(sp) // twice: ignored
	if got := a.sock.TxFree(); got != free0 {
		t.Fatalf("%d TX chunks free, want %d", got, free0)
	}
	// A freed span is not a held one any more.
	if n, err := a.sock.SubmitTxSpans([][]byte{sp}, [][]byte{sp[:60]}); n != 0 || !errors.Is(err, xdp.ErrBadSpan) {
		t.Errorf("freed span: %d, %v", n, err)
	}
}

// Building frames in spans allocates nothing.
func TestTxSpanAllocs(t *testing.T) {
	a, _ := newPair(t, 1500, xdp.Config{UMEMConfig: xdp.UMEMConfig{FrameSize: 2048}})
	spans, frames := make([][]byte, 8), make([][]byte, 8)
	round := func() {
		for i := range spans {
			spans[i] = a.sock.AllocTxSpan(1)
			if spans[i] == nil {
				t.Fatal("no span")
			}
			frames[i] = spans[i][64 : 64+60]
			fillFrame(frames[i], a.mac, a.mac, 0)
		}
		if n, err := a.sock.SubmitTxSpans(spans, frames); n != len(spans) || err != nil {
			t.Fatalf("SubmitTxSpans: %d, %v", n, err)
		}
		a.sock.Complete()
	}
	if allocs := testing.AllocsPerRun(100, round); allocs != 0 {
		t.Fatalf("%.1f allocations per batch", allocs)
	}
}
