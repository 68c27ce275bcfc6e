package xdp

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrBadSpan is returned by SubmitTxSpans for a span that is not one from
// AllocTxSpan held by the caller, or a frame that does not lie inside its
// span.
var ErrBadSpan = errors.New("xdp: not a held TX span, or a frame outside its span")

// AllocTxSpan takes k adjacent free TX chunks and returns them as one
// buffer of k chunk sizes, in which a frame is built in place: the copy
// Transmit makes is saved, and a frame larger than a chunk is built as
// one contiguous piece (k > 1 needs multi-buffer; k ≤ MaxSegments). It
// returns nil when k is out of range or no k adjacent chunks are free after
// collecting completions. The span goes back through SubmitTxSpans or
// FreeTxSpan.
func (s *Socket) AllocTxSpan(k int) []byte {
	if s.closed || k < 1 || k > MaxSegments || (k > 1 && !s.sg) {
		return nil
	}
	a, ok := s.txFree.get(k)
	if !ok {
		s.reap()
		if a, ok = s.txFree.get(k); !ok {
			return nil
		}
	}
	end := a + uint64(k)*uint64(s.frameSize)
	return s.mem[a:end:end]
}

// memAddr returns the UMEM address of b's first byte, if b lies inside
// the UMEM.
func (s *Socket) memAddr(b []byte) (uint64, bool) {
	if len(b) == 0 || len(s.mem) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	base := uintptr(unsafe.Pointer(unsafe.SliceData(s.mem)))
	if p < base || p-base > uintptr(len(s.mem)) || uint64(p-base)+uint64(len(b)) > uint64(len(s.mem)) {
		return 0, false
	}
	return uint64(p - base), true
}

// spanAddr checks that span is a span from AllocTxSpan still held by the
// caller and returns its address and chunk count.
func (s *Socket) spanAddr(span []byte) (uint64, int, bool) {
	a, ok := s.memAddr(span)
	fs := uint64(s.frameSize)
	if !ok || a&(fs-1) != 0 || uint64(len(span))%fs != 0 {
		return 0, 0, false
	}
	k := len(span) / int(fs)
	if k > MaxSegments {
		return 0, 0, false
	}
	for i := 0; i < k; i++ {
		c := a + uint64(i)*fs
		if !s.isTxChunk(c) || !s.txFree.taken(c) {
			return 0, 0, false
		}
	}
	return a, k, true
}

// SubmitTxSpans queues frames built in spans from AllocTxSpan: frames[i]
// lies inside spans[i], anywhere (the room before it is headroom). A frame
// is carried by one descriptor per chunk it touches, chained with
// XDP_PKT_CONTD; the chunks of its span it does not touch are freed at
// once. It returns how many frames were queued: it stops without error
// when the TX ring is full, and with an error at a span or frame that does
// not qualify. Spans from the returned index on still belong to the
// caller. It kicks the kernel once, if it needs it.
func (s *Socket) SubmitTxSpans(spans, frames [][]byte) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	if len(frames) < len(spans) {
		spans = spans[:len(frames)]
	}
	fs := uint64(s.frameSize)
	n := 0
	var err error
	for i, span := range spans {
		sa, k, ok := s.spanAddr(span)
		if !ok {
			err = fmt.Errorf("%w: span %d", ErrBadSpan, i)
			break
		}
		f := frames[i]
		fa, ok := s.memAddr(f)
		if len(f) == 0 {
			err = ErrEmptyFrame
			break
		}
		fe := fa + uint64(len(f))
		if !ok || fa < sa || fe > sa+uint64(k)*fs {
			err = fmt.Errorf("%w: frame %d", ErrBadSpan, i)
			break
		}
		c0, c1 := fa&^(fs-1), (fe-1)&^(fs-1)
		segs := uint32((c1-c0)/fs + 1)
		if segs > 1 && !s.sg {
			err = s.tooLarge(len(f))
			break
		}
		if s.tx.free(segs) < segs {
			break
		}
		prod := s.tx.cachedProd
		for j := uint32(0); j < segs; j++ {
			c := c0 + uint64(j)*fs
			a, e := max(fa, c), min(fe, c+fs)
			var opt uint32
			if j+1 < segs {
				opt = unix.XDP_PKT_CONTD
			}
			s.tx.descs[(prod+j)&s.tx.mask] = unix.XDPDesc{Addr: a, Len: uint32(e - a), Options: opt}
		}
		s.tx.cachedProd += segs
		for c := sa; c < sa+uint64(k)*fs; c += fs {
			if c < c0 || c > c1 {
				s.txFree.put(c)
			}
		}
		n++
		s.sent++
	}
	if n > 0 {
		s.tx.submit()
		if kerr := s.kick(); kerr != nil && err == nil {
			err = kerr
		}
	}
	return n, err
}

// FreeTxSpan gives a span from AllocTxSpan back unused. Anything else is
// ignored.
func (s *Socket) FreeTxSpan(span []byte) {
	if s.closed {
		return
	}
	a, k, ok := s.spanAddr(span)
	if !ok {
		return
	}
	for i := 0; i < k; i++ {
		s.txFree.put(a + uint64(i)*uint64(s.frameSize))
	}
}
