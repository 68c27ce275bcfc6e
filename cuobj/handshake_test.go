package cuobj

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/cmtest"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
)

// TestHandshakeDeadline: a connection to the client's listener whose RTU
// never arrives (from the address a live token was handed to, so it is
// admitted) ends at ClientOptions.HandshakeTimeout, counted, and the
// server's own connection goes on working beside it.
func TestHandshakeDeadline(t *testing.T) {
	var armed atomic.Bool
	var drop *cmtest.LossyLink
	sdev, cdev := memDevicesWrapped(t, func(l link.Link) link.Link {
		drop = cmtest.Lossy(l, func(m mad.MAD) bool { return armed.Load() && m.AttrID() == mad.AttrRTU })
		return drop
	}, nil)

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
		armed.Store(true)
		c, err := dialClient(ctx, t, sdev, srvIP, netip.AddrPortFrom(cliIP, tok.LID), tok.QPN)
		if err != nil {
			armed.Store(false)
			t.Errorf("the dial whose RTU is lost: %v", err)
			return nil
		}
		t.Cleanup(func() { c.Close() })
		// The RTU may leave after Dial returns.
		deadline := time.Now().Add(30 * time.Second)
		for drop.Lost() == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		armed.Store(false)
		for r.cli.Stats().HandshakeFailures.Load() == 0 {
			if time.Now().After(deadline) {
				t.Errorf("no handshake failure counted in 30 s (%d RTUs lost; %v)", drop.Lost(), r.cli.Stats())
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
		t.Fatalf("Get beside the stuck handshake = %d, %v", n, err)
	}
	if drop.Lost() == 0 {
		t.Error("no RTU was lost: the test proved nothing")
	}
}

// TestHandshakeTimeoutDefault: a zero or negative HandshakeTimeout takes
// the default, rather than ending every handshake at once.
func TestHandshakeTimeoutDefault(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
		r := newRig(t, sdev, cdev, 4096, &ClientOptions{HandshakeTimeout: d}, nil)
		if r.cli.hsTime != DefaultHandshakeTimeout {
			t.Errorf("HandshakeTimeout %v: %v, want %v", d, r.cli.hsTime, DefaultHandshakeTimeout)
		}
	}
}
