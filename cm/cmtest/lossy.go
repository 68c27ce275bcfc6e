package cmtest

import (
	"sync"
	"sync/atomic"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
)

// LossyLink passes frames through to its link, but for the CM MADs
// (RoCEv2 packets to QP1) that its lose function picks: those are lost.
type LossyLink struct {
	link.Link
	lose func(mad.MAD) bool
	lost atomic.Int64
}

// Lossy wraps l: the MADs sent through it for which lose returns true are
// lost. lose runs for every MAD sent, on the device's transmit path.
func Lossy(l link.Link, lose func(mad.MAD) bool) *LossyLink {
	return &LossyLink{Link: l, lose: lose}
}

// Lost returns how many MADs were lost.
func (l *LossyLink) Lost() int64 { return l.lost.Load() }

// WriteBatch sends frames, but for the MADs lose picks; it reports them as
// sent.
func (l *LossyLink) WriteBatch(frames [][]byte) (int, error) {
	var p ib.Packet
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if ib.Parse(f, &p) == nil && p.BTH.DestQP() == 1 && len(p.Payload) >= mad.HeaderSize+8 && l.lose(mad.MAD(p.Payload)) {
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

// RTUs returns a lose function that loses every RTU, the retransmissions
// included, of the first n connections whose RTU it sees (by the sender's
// communication ID): they are established on the dialer's side and never
// on the listener's.
func RTUs(n int) func(mad.MAD) bool {
	var mu sync.Mutex
	lost := map[uint32]bool{}
	return func(m mad.MAD) bool {
		if m.AttrID() != mad.AttrRTU {
			return false
		}
		id := m.RTU().LocalCommID()
		mu.Lock()
		defer mu.Unlock()
		if !lost[id] && len(lost) < n {
			lost[id] = true
		}
		return lost[id]
	}
}
