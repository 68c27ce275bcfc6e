package rsocket

import (
	"io"
	"net"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestAckWithReply: in a request/response exchange the ACK of a request
// leaves with the response, in one link write (on AF_XDP one sendto), not
// in a write of its own before it (the connection's CQ asks for
// roce.CQ.SetAckWithReply; the devices do not).
func TestAckWithReply(t *testing.T) {
	ma, mb := memlink.PairWithOptions(memlink.Options{})
	da, err := roce.OpenLink(ma, roce.Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: mb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(mb, roce.Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: ma.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c, s, _ := connPair(t, da, db, nil, nil)
	const rounds = 300
	done := make(chan error, 1)
	go func() {
		b := make([]byte, 64)
		for i := 0; i < rounds; i++ {
			if _, err := io.ReadFull(s, b); err != nil {
				done <- err
				return
			}
			if _, err := s.Write(b); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	b := make([]byte, 64)
	w0, f0 := mb.Writes()
	for i := 0; i < rounds; i++ {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	w1, f1 := mb.Writes()
	w, f := w1-w0, f1-f0
	t.Logf("server: %d frames in %d link writes over %d round trips", f, w, rounds)
	// A response carries the ACK of its request when it comes within the
	// deferral bound (20 µs); a wait that parked, or a response slower than
	// that (a loaded host, the race detector: 379 writes for 604 frames),
	// sends them apart. Without the deferral every ACK leaves alone, one
	// write per frame; at least a tenth of the round trips must join them.
	if f < 2*rounds-rounds/10 || 10*w > 9*f {
		t.Errorf("server sent %d frames in %d writes over %d round trips: want the ACK to leave with the response in at least a tenth of them", f, w, rounds)
	}
}
