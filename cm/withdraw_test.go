// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package cm

import (
	"errors"
	"testing"

	"github.com/goroce/goroce/cm/mad"
)

// TestRejectWithdrawsQueuedREP: a passive side that accepts and then, in
// the same step, rejects (its QP refused the RTR attributes) sends only
// the REJ, as ib_send_cm_rej cancels an unsent REP; the active side gets
// the rejection, not a REP followed by one.
func TestRejectWithdrawsQueuedREP(t *testing.T) {
	p := newPair(t)
	_ = p.b.e.Listen(testSID)
	if _, err := p.a.e.Connect(p.connectParams(testSID)); err != nil {
		t.Fatal(err)
	}
	p.pump()
	req := p.b.take(t, EventRequest)
	if err := p.b.e.Accept(req.ID, acceptParams()); err != nil {
		t.Fatal(err)
	}
	if err := p.b.e.Reject(req.ID, mad.RejConsumerDefined, nil, nil); err != nil {
		t.Fatal(err)
	}
	p.pump()
	for _, o := range p.sent[p.b] {
		if a := mad.MAD(o.MAD[:]).AttrID(); a != mad.AttrREJ {
			t.Errorf("B sent %v; want only the REJ", a)
		}
	}
	if len(p.sent[p.b]) != 1 {
		t.Errorf("B sent %d MADs", len(p.sent[p.b]))
	}
	ev := p.a.take(t, EventRejected)
	if !errors.Is(ev.Err, mad.RejConsumerDefined) {
		t.Errorf("A's error %v", ev.Err)
	}
	p.drain()
	p.assertEmpty()
}
