package xdp

import "math/bits"

// txPool tracks a socket's free TX chunks, one bit per chunk, so that a
// run of adjacent chunks can be taken for one frame built in place: the
// UMEM is contiguous, so adjacent chunks are one buffer to the builder and
// several chained descriptors to the kernel (AllocTxSpan).
type txPool struct {
	base  uint64   // address of the first TX chunk
	shift uint     // log2 of the chunk size
	n     int      // TX chunks
	bits  []uint64 // bit i set: chunk i is free
	free  int      // bits set
	next  int      // word where the next search starts
}

func newTxPool(base uint64, chunkSize uint32, n int) txPool {
	p := txPool{base: base, shift: uint(bits.TrailingZeros32(chunkSize)), n: n, bits: make([]uint64, (n+63)/64)}
	for i := 0; i < n; i++ {
		p.bits[i/64] |= 1 << (i % 64)
	}
	p.free = n
	return p
}

// get takes k (1 ≤ k ≤ 64) adjacent free chunks and returns the address of
// the first. A run never crosses a 64-chunk word, which costs at most a
// few chunks of a word to fragmentation and keeps the search to one AND
// per word and chunk of the run.
func (p *txPool) get(k int) (uint64, bool) {
	if p.free < k || k < 1 || k > 64 {
		return 0, false
	}
	nw := len(p.bits)
	w := p.next
	for j := 0; j < nw; j++ {
		if w >= nw {
			w = 0
		}
		if b := p.bits[w]; b != 0 {
			m := b
			for i := 1; i < k; i++ {
				m &= b >> i
			}
			if m != 0 {
				i := bits.TrailingZeros64(m)
				p.bits[w] &^= (1<<k - 1) << i
				p.free -= k
				p.next = w
				return p.base + uint64(w*64+i)<<p.shift, true
			}
		}
		w++
	}
	return 0, false
}

// put gives back the chunk at addr (any address inside it). Chunks outside
// the pool and chunks already free are ignored, so a faulty completion
// ring cannot make the pool hand out a chunk twice.
func (p *txPool) put(addr uint64) {
	if addr < p.base {
		return
	}
	i := (addr - p.base) >> p.shift
	if i >= uint64(p.n) {
		return
	}
	w, b := i/64, uint64(1)<<(i%64)
	if p.bits[w]&b != 0 {
		return
	}
	p.bits[w] |= b
	p.free++
}

// taken reports whether the chunk at addr is outside the free set (handed
// out), for checking that a submitted span was allocated.
func (p *txPool) taken(addr uint64) bool {
	i := (addr - p.base) >> p.shift
	return addr >= p.base && i < uint64(p.n) && p.bits[i/64]&(1<<(i%64)) == 0
}
