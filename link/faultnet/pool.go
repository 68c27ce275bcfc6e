package faultnet

import "math/bits"

// Buffers are pooled in power-of-two size classes so that a steady stream
// of packets, whatever their sizes, stops allocating once warmed up.
const (
	minClassShift = 6  // 64 bytes
	maxClassShift = 16 // 64 KiB; larger packets are allocated and not pooled
	numClasses    = maxClassShift - minClassShift + 1
)

type pool struct {
	free [numClasses][][]byte
}

func class(n int) (int, bool) {
	if n <= 1<<minClassShift {
		return 0, true
	}
	shift := bits.Len(uint(n - 1))
	if shift > maxClassShift {
		return 0, false
	}
	return shift - minClassShift, true
}

func (p *pool) get(n int) []byte {
	c, ok := class(n)
	if !ok {
		return make([]byte, n)
	}
	if f := p.free[c]; len(f) > 0 {
		b := f[len(f)-1]
		f[len(f)-1] = nil
		p.free[c] = f[:len(f)-1]
		return b[:n]
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

func (p *pool) put(b []byte) {
	c, ok := class(cap(b))
	if !ok || cap(b) != 1<<(c+minClassShift) {
		return
	}
	p.free[c] = append(p.free[c], b[:0])
}
