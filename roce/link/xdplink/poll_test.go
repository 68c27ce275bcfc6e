package xdplink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/roce/link/xdplink"
)

// PollBatch never waits, WaitReadable takes nothing, and neither blocks
// the other.
func TestPollBatch(t *testing.T) {
	a, b := pair(t, 1500, xdplink.Options{})
	var got []uint32
	fn := func(frames [][]byte) {
		for _, f := range frames {
			if isOurs(f) {
				got = append(got, binary.BigEndian.Uint32(f[42:46]))
			}
		}
	}
	if _, err := b.l.PollBatch(fn); err != nil {
		t.Fatal(err)
	}
	if allocs := testing.AllocsPerRun(100, func() { b.l.PollBatch(fn) }); allocs != 0 {
		t.Fatalf("%v allocations per PollBatch", allocs)
	}
	waited := make(chan error, 1)
	go func() { waited <- b.l.WaitReadable(context.Background()) }()
	polled := make(chan error, 1)
	go func() {
		_, err := b.l.PollBatch(fn)
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
	got = got[:0]
	// The veth may drop a frame while XDP settles: send until both arrive.
	deadline := time.Now().Add(20 * time.Second)
	for seq := uint32(0); len(got) < 2 && time.Now().Before(deadline); seq += 2 {
		f0, f1 := make([]byte, 100), make([]byte, 100)
		udpFrame(f0, b.mac, a.mac, seq)
		udpFrame(f1, b.mac, a.mac, seq+1)
		if _, err := a.l.WriteBatch([][]byte{f0, f1}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		for len(got) < 2 && ctx.Err() == nil {
			if err := b.l.WaitReadable(ctx); err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
			if _, err := b.l.PollBatch(fn); err != nil {
				t.Fatal(err)
			}
			if len(got) == 1 && got[0]%2 != 0 {
				got = got[:0]
			}
		}
		cancel()
		if len(got) > 0 && len(got) < 2 {
			got = got[:0]
		}
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("WaitReadable = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReadable did not return after frames arrived")
	}
	if len(got) != 2 || got[1] != got[0]+1 {
		t.Fatalf("polled frames %v", got)
	}
	go func() { waited <- b.l.WaitReadable(context.Background()) }()
	b.l.Close()
	if err := <-waited; !errors.Is(err, xdplink.ErrClosed) {
		t.Fatalf("WaitReadable on close = %v", err)
	}
	if _, err := b.l.PollBatch(fn); !errors.Is(err, xdplink.ErrClosed) {
		t.Fatalf("PollBatch after close = %v", err)
	}
}
