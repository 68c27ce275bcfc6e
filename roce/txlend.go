package roce

import (
	"errors"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
)

// txLend builds frames in buffers the link lends (link.TxLender: the UMEM
// of an AF_XDP socket), so that the payload of a WRITE or SEND is copied
// once, from the MR into the buffer the frame is sent from, where the
// headers and the ICRC are put too. Links that lend nothing, or a pass for
// which the link has no buffer free, use the device's slots and WriteBatch.
// One per transmit shard, guarded by the shard's lock.
type txLend struct {
	l        link.TxLender // nil: the link lends nothing
	bufs     [][]byte      // lent for this pass; nil once handed back
	slots    []qp.TxPacket // the engine's slots over bufs
	sendBufs [][]byte      // the buffers of the frames to send, in order
	ret      [][]byte      // scratch for giving back
	n        int           // buffers lent for this pass
	want     int           // buffers to ask for: twice the last pass's packets, at least lendMin
	short    bool          // a lent buffer was too short: one pass in the device's slots
}

func (t *txLend) init(l link.Link, batch int) {
	tl, ok := l.(link.TxLender)
	if !ok {
		return
	}
	t.l = tl
	t.bufs = make([][]byte, batch)
	t.slots = make([]qp.TxPacket, batch)
	t.sendBufs = make([][]byte, batch)
	t.ret = make([][]byte, 0, batch)
	t.want = min(lendMin, batch)
}

// lendMin is the fewest buffers a pass asks for. A pass that fills all it
// was lent counts as a stream's, so this must hold more than an answer
// and the ACK leaving with it (CQ.SetAckWithReply) with a credit message
// beside them: with 2, every such pass was followed by an empty one that
// borrowed a whole batch and gave it back (1 us of each message of an
// rsocket ping-pong).
const lendMin = 4

// lent reports whether this pass runs in lent buffers.
func (t *txLend) lent() bool { return t.n > 0 }

// take returns the slots for the next transmit pass: lent buffers when
// the link has them, else own (the shard's slots). It asks for as many buffers as
// produced says, so that a pass with one packet to send takes few (lending
// costs a little per buffer), while a stream asks for a whole batch.
func (t *txLend) take(d *Device, own []qp.TxPacket) []qp.TxPacket {
	if t.l == nil || t.short {
		t.short = false
		return own
	}
	// What the engine needs of a slot (qp.Engine.Transmit) at the port
	// MTU, with the device's headroom, as the device's own slots have.
	size := txHeadroom + ib.ActiveMTU(int(d.netMTU.Load())).Bytes() + 256
	n := t.l.LendTx(t.bufs[:t.want], size)
	if n == 0 {
		return own
	}
	t.n = n
	for i := 0; i < n; i++ {
		t.slots[i].Buf = t.bufs[i]
		t.slots[i].Headroom = txHeadroom
	}
	return t.slots[:n]
}

// produced notes that the engine filled n slots: a pass that filled all
// it was lent is a stream, which gets a whole batch at once (each pass is
// a sendto); otherwise twice what it took.
func (t *txLend) produced(n int) {
	switch {
	case t.l == nil:
	case t.n > 0 && n == t.n:
		t.want = len(t.bufs)
	default:
		t.want = min(max(2*n, lendMin), len(t.bufs))
	}
}

// send notes that the frame of lent slot i is the k-th to send.
func (t *txLend) send(i, k int) {
	t.sendBufs[k] = t.bufs[i]
	t.bufs[i] = nil
}

// giveBack returns the lent buffers that are not being sent (unused slots,
// frames that could not be built, frames delivered locally).
func (t *txLend) giveBack() {
	if t.n == 0 {
		return
	}
	t.ret = t.ret[:0]
	for _, b := range t.bufs[:t.n] {
		if b != nil {
			t.ret = append(t.ret, b)
		}
	}
	if len(t.ret) > 0 {
		t.l.ReturnTx(t.ret)
	}
	clear(t.ret)
	clear(t.bufs[:t.n])
	for i := range t.slots[:t.n] {
		t.slots[i].Buf = nil
	}
	t.n = 0
}

// writeLent sends frames built in lent buffers; the link takes the buffers
// back.
func (d *Device) writeLent(t *txLend, frames [][]byte) {
	if len(frames) == 0 {
		return
	}
	if tap := d.tap.Load(); tap != nil {
		for _, f := range frames {
			tap.write(f)
		}
	}
	bufs := t.sendBufs[:len(frames)]
	n, err := t.l.WriteLent(bufs, frames)
	clear(bufs)
	d.ctr.sentPkts.Add(uint64(n))
	if err != nil && !errors.Is(err, link.ErrClosed) {
		d.noteSendErr(err)
	}
}

// noteSendErr counts a frame the link refused and logs it at powers of
// two.
func (d *Device) noteSendErr(err error) {
	if c := d.ctr.sendErr.Add(1); c&(c-1) == 0 {
		s := err.Error()
		d.lastTxErr.Store(&s)
		d.log.Warn("roce: link refused a frame", "err", err, "count", c)
	}
}
