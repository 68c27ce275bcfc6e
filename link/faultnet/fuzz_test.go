package faultnet

import (
	"encoding/binary"
	"testing"
	"time"
)

// FuzzPipe drives a pipe with a configuration and a call sequence taken
// from the input and checks the accounting: after draining, every pushed
// packet was dropped, tail-dropped or delivered, plus the duplicates.
func FuzzPipe(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 12 {
			return
		}
		prob := func(b byte) float64 { return float64(b) / 255 }
		cfg := Config{
			Seed: uint64(in[0]), Loss: prob(in[1]), Duplicate: prob(in[2]), Reorder: prob(in[3]),
			Corrupt: prob(in[4]), Delay: time.Duration(in[5]) * time.Microsecond,
			Jitter: time.Duration(in[6]) * time.Microsecond, ReorderDepth: int(in[7] % 5),
			ReorderTimeout: time.Duration(in[8]) * time.Microsecond,
			Bandwidth:      int64(in[9]) * 1e6, QueueLimit: int(in[10] % 20),
		}
		p := New(cfg)
		var now time.Duration
		pkt := make([]byte, 300)
		for _, op := range in[11:] {
			now += time.Duration(op&0x0F) * time.Microsecond
			switch {
			case op&0x30 == 0x30:
				p.Pop(now, func(b []byte) {})
			case op&0x30 == 0x20:
				p.PopBatch(now, int(op>>6), func(b [][]byte) {})
			default:
				binary.BigEndian.PutUint16(pkt, uint16(op))
				p.Push(now, pkt[:int(op)])
			}
		}
		for i := 0; p.Len() > 0; i++ {
			d, ok := p.NextDue()
			if !ok || i > 10000 {
				t.Fatalf("%d packets stuck (NextDue %v, %v)", p.Len(), d, ok)
			}
			now = max(now, d)
			if p.Pop(now, func([]byte) {}) == 0 && p.Len() > 0 {
				if d2, _ := p.NextDue(); d2 <= now {
					t.Fatalf("packet due at %v not delivered at %v", d2, now)
				}
			}
		}
		s := p.Stats()
		if s.Pushed-s.Dropped-s.Overflowed+s.Duplicated != s.Delivered {
			t.Fatalf("accounting: %+v", s)
		}
	})
}
