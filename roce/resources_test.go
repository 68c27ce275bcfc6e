package roce

import (
	"context"
	"errors"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/faultnet"
)

// TestResources checks that every create counts one object and every
// successful destroy one fewer, and that refused destroys (busy, repeated)
// leave the count alone.
func TestResources(t *testing.T) {
	da, _ := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	if r := da.Resources(); r != (Resources{}) {
		t.Fatalf("fresh device: %+v", r)
	}
	e := newEndpoint(t, da, UD, 256)
	srq, err := e.pd.CreateSRQ(SRQAttr{MaxWR: 16, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	ah, err := e.pd.CreateAH(context.Background(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
	if err != nil {
		t.Fatal(err)
	}
	want := Resources{PD: 1, CQ: 2, QP: 1, SRQ: 1, MR: 1, AH: 1}
	if r := da.Resources(); r != want {
		t.Fatalf("got %+v, want %+v", r, want)
	}
	qpn := e.qp.QPN()
	if !da.HasQP(qpn) {
		t.Fatalf("QP %d not in the table", qpn)
	}
	if err := e.pd.Close(); !errors.Is(err, qp.ErrBusy) {
		t.Fatalf("closing a busy PD: %v", err)
	}
	if err := e.scq.Close(); !errors.Is(err, qp.ErrBusy) {
		t.Fatalf("closing a busy CQ: %v", err)
	}
	if r := da.Resources(); r != want {
		t.Fatalf("after refused closes: %+v, want %+v", r, want)
	}
	for _, c := range []interface{ Close() error }{ah, srq, e.mr, e.qp, e.scq, e.rcq, e.pd} {
		if err := c.Close(); err != nil {
			t.Fatalf("%T: %v", c, err)
		}
		if err := c.Close(); err == nil {
			t.Fatalf("%T closed twice", c)
		}
	}
	if r := da.Resources(); r != (Resources{}) {
		t.Fatalf("after closing everything: %+v", r)
	}
	if da.HasQP(qpn) {
		t.Fatalf("QP %d still in the table", qpn)
	}
}
