package udplink

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
)

// PollBatch never waits, WaitReadable takes nothing, and neither blocks
// the other (WaitReadable holds the descriptor's read lock in the runtime
// poller; PollBatch must not need it).
func TestPollBatch(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	var got []int
	fn := func(frames [][]byte) {
		for _, f := range frames {
			pf, err := link.ParseFrame(f)
			if err != nil {
				t.Errorf("frame does not parse: %v", err)
				continue
			}
			got = append(got, int(binary.BigEndian.Uint32(f[pf.Payload:])))
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
	polled := make(chan error, 1)
	go func() {
		_, err := b.PollBatch(fn)
		polled <- err
	}()
	select {
	case err := <-polled:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("PollBatch blocked beside WaitReadable")
	}
	frames := [][]byte{
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(0, 32)),
		mkframe(a.LocalAddr(), b.LocalAddr(), 0, payload(1, 32)),
	}
	if _, err := a.WriteBatch(frames); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitReadable = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReadable did not return after datagrams arrived")
	}
	// Loopback delivery is synchronous, but be patient with a busy host.
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		if err := b.WaitReadable(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := b.PollBatch(fn); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("polled frames %v", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { waited <- b.WaitReadable(ctx) }()
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
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
