package xdplink_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goroce/goroce/link/xdplink"
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
	// The veth may drop a frame while XDP settles: send until the blocked
	// WaitReadable sees one (nothing takes frames meanwhile).
	seq := uint32(0)
	send := func() {
		f := make([]byte, 100)
		udpFrame(f, b.mac, a.mac, seq)
		seq++
		if _, err := a.l.WriteBatch([][]byte{f}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		send()
		var err error
		select {
		case err = <-waited:
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) {
				t.Fatal("WaitReadable did not return after frames arrived")
			}
			continue
		}
		if err != nil {
			t.Fatalf("WaitReadable = %v", err)
		}
		break
	}
	// WaitReadable took nothing: the frames are there for PollBatch.
	got = got[:0]
	for deadline := time.Now().Add(20 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
		if _, err := b.l.PollBatch(fn); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) == 0 {
		t.Fatal("PollBatch found nothing after WaitReadable returned")
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("polled frames out of order: %v", got)
		}
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
