package xdplink_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/xdplink"
)

// TestInterfaceDown: sending on a downed interface reports ENETDOWN; once
// it is up again frames flow.
func TestInterfaceDown(t *testing.T) {
	a, b := pair(t, 1500, xdplink.Options{})
	nl := a.ns.Netlink()
	la, err := a.v.Link()
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetDown(la); err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, 200)
	udpFrame(frame, b.mac, a.mac, 1)
	_, err = a.l.WriteBatch([][]byte{frame})
	var fe *link.FrameError
	if !errors.Is(err, unix.ENETDOWN) || errors.As(err, &fe) {
		t.Fatalf("WriteBatch on a down interface: %v, want ENETDOWN, not blamed on a frame", err)
	}
	t.Log(err)
	if err := nl.LinkSetUp(la); err != nil {
		t.Fatal(err)
	}
	if err := a.v.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	udpFrame(frame, b.mac, a.mac, 2)
	marker := append([]byte(nil), frame...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	found := false
	for !found {
		if _, err := a.l.WriteBatch([][]byte{marker}); err != nil {
			t.Fatalf("WriteBatch after up: %v", err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := b.l.ReadBatch(rctx, func(frames [][]byte) {
			for _, f := range frames {
				found = found || bytes.Equal(f, marker)
			}
		})
		rcancel()
		if ctx.Err() != nil {
			t.Fatalf("no frame after the interface came back up: %v", err)
		}
	}
}
