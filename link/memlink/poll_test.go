package memlink

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
)

// PollBatch never waits, WaitReadable takes nothing, and neither blocks
// the other.
func TestPollBatch(t *testing.T) {
	a, b := Pair(faultnet.Config{}, faultnet.Config{})
	defer a.Close()
	var got []int
	fn := func(frames [][]byte) {
		for _, f := range frames {
			got = append(got, int(binary.BigEndian.Uint32(f[14:])))
		}
	}
	if n, err := b.PollBatch(fn); n != 0 || err != nil || len(got) != 0 {
		t.Fatalf("empty PollBatch = %d, %v (fn got %v)", n, err, got)
	}
	if allocs := testing.AllocsPerRun(100, func() { b.PollBatch(fn) }); allocs != 0 {
		t.Fatalf("%v allocations per empty PollBatch", allocs)
	}

	waited := make(chan error, 1)
	go func() { waited <- b.WaitReadable(context.Background()) }()
	// While WaitReadable sleeps, a poll still answers at once.
	if n, err := b.PollBatch(fn); n != 0 || err != nil {
		t.Fatalf("PollBatch beside WaitReadable = %d, %v", n, err)
	}
	if _, err := a.WriteBatch([][]byte{frame(0, 60), frame(1, 60), frame(2, 60)}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitReadable = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReadable did not return after frames arrived")
	}
	// WaitReadable took nothing: a second one returns at once.
	if err := b.WaitReadable(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n, err := b.PollBatch(fn); n != 3 || err != nil || len(got) != 3 || got[0] != 0 || got[2] != 2 {
		t.Fatalf("PollBatch = %d, %v, frames %v", n, err, got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.WaitReadable(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReadable with an ended context = %v", err)
	}
	go func() { waited <- b.WaitReadable(context.Background()) }()
	b.Close()
	if err := <-waited; !errors.Is(err, link.ErrClosed) {
		t.Fatalf("WaitReadable on close = %v", err)
	}
	if _, err := b.PollBatch(fn); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("PollBatch after close = %v", err)
	}
}
