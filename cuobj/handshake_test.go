package cuobj

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
)

// rtuDropper loses the RTUs its device sends while armed.
type rtuDropper struct {
	link.Link
	armed atomic.Bool
	lost  atomic.Int32
}

func (l *rtuDropper) WriteBatch(frames [][]byte) (int, error) {
	if !l.armed.Load() {
		return l.Link.WriteBatch(frames)
	}
	var p ib.Packet
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if ib.Parse(f, &p) == nil && p.BTH.DestQP() == 1 && len(p.Payload) >= mad.HeaderSize+8 &&
			mad.MAD(p.Payload).AttrID() == mad.AttrRTU {
			l.lost.Add(1)
			continue
		}
		kept = append(kept, f)
	}
	if _, err := l.Link.WriteBatch(kept); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// TestHandshakeDeadline: a connection to the client's listener whose RTU
// never arrives (from the address a live token was handed to, so it is
// admitted) ends at ClientOptions.HandshakeTimeout, counted, and the
// server's own connection goes on working beside it.
func TestHandshakeDeadline(t *testing.T) {
	drop := &rtuDropper{}
	sdev, cdev := memDevicesWrapped(t, func(l link.Link) link.Link { drop.Link = l; return drop }, nil)

	// Region tokens: the token's qp field is the client's endpoint, which
	// the stuck dial's hello names.
	r := newRig(t, sdev, cdev, 4096, &ClientOptions{RegionTokens: true, HandshakeTimeout: 300 * time.Millisecond}, nil)
	ctx := ctxT(t, 90*time.Second)
	buf := make([]byte, 4096)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(4096, 7)
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
		t.Fatalf("first Get = %d, %v", n, err)
	}
	r.hook = func(h *Handle, info *RDMAInfo) error {
		tok := info.Token
		drop.armed.Store(true)
		c, err := dialClient(ctx, t, sdev, srvIP, netip.AddrPortFrom(cliIP, tok.LID), tok.QPN)
		if err != nil {
			drop.armed.Store(false)
			t.Errorf("the dial whose RTU is lost: %v", err)
			return nil
		}
		t.Cleanup(func() { c.Close() })
		// The RTU may leave after Dial returns.
		deadline := time.Now().Add(30 * time.Second)
		for drop.lost.Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		drop.armed.Store(false)
		for r.cli.Stats().HandshakeFailures.Load() == 0 {
			if time.Now().After(deadline) {
				t.Errorf("no handshake failure counted in 30 s (%d RTUs lost; %v)", drop.lost.Load(), r.cli.Stats())
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
		t.Fatalf("Get beside the stuck handshake = %d, %v", n, err)
	}
	if drop.lost.Load() == 0 {
		t.Error("no RTU was lost: the test proved nothing")
	}
}
