package ib

// PSN is a 24-bit packet sequence number.
type PSN uint32

// PSNMask masks a value to the 24 bits of a PSN.
const PSNMask = 0xFFFFFF

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return PSN((uint32(p) + n) & PSNMask) }

// Next returns p+1 modulo 2^24.
func (p PSN) Next() PSN { return p.Add(1) }

// PSNDiff returns a−b modulo 2^24 as a signed value in [−2^23, 2^23−1], like
// rxe's psn_compare: positive when a is later than b.
func PSNDiff(a, b PSN) int32 { return int32((uint32(a)-uint32(b))<<8) >> 8 }

// Before reports whether p precedes q in modular order.
func (p PSN) Before(q PSN) bool { return PSNDiff(p, q) < 0 }

// After reports whether p follows q in modular order.
func (p PSN) After(q PSN) bool { return PSNDiff(p, q) > 0 }
