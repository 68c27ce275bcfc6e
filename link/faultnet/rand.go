package faultnet

import "math/bits"

// rng is xoshiro256** seeded through splitmix64: small, fast, and identical
// on every platform, which is what determinism across runs needs.
type rng struct{ s [4]uint64 }

func newRNG(seed uint64) rng {
	var r rng
	x := seed
	for i := range r.s {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		r.s[i] = z ^ (z >> 31)
	}
	return r
}

func rotl(x uint64, k uint) uint64 { return x<<k | x>>(64-k) }

func (r *rng) uint64() uint64 {
	s := &r.s
	res := rotl(s[1]*5, 7) * 9
	t := s[1] << 17
	s[2] ^= s[0]
	s[3] ^= s[1]
	s[1] ^= s[2]
	s[0] ^= s[3]
	s[2] ^= t
	s[3] = rotl(s[3], 45)
	return res
}

// float64 returns a uniform value in [0, 1).
func (r *rng) float64() float64 { return float64(r.uint64()>>11) * (1.0 / (1 << 53)) }

// chance reports true with probability p; p <= 0 consumes no randomness so
// that enabling one impairment does not perturb the others' sequences.
func (r *rng) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	return r.float64() < p
}

// intn returns a uniform value in [0, n) for n > 0.
func (r *rng) intn(n uint64) uint64 {
	// Lemire's multiply-shift; the tiny bias is irrelevant for impairments.
	hi, _ := bits.Mul64(r.uint64(), n)
	return hi
}
