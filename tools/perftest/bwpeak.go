// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"math"
	"math/bits"
	"time"
)

// spanFits reports whether every difference of two of the timestamps fits
// in an int64, so that no window's time wraps around.
func spanFits(posted, completed []time.Duration) bool {
	lo, hi := time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	for _, s := range [2][]time.Duration{posted, completed} {
		for _, v := range s {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return uint64(hi)-uint64(lo) <= math.MaxInt64
}

// bestWindow returns perftest's least per-message time,
//
//	min over j in J, i <= j, of (completed[j]-posted[i]) / (j-i+1)
//
// truncated toward zero, where J holds the indices cqMod-1, 2cqMod-1, ...
// below n and n-1. cqMod must be in [1, n] and no difference of two
// timestamps may overflow (spanFits).
//
// The time of window (i, j) is the slope from A_i = (i-1, posted[i]) to
// B_j = (j, completed[j]), and A_i lies left of B_j. The least slope from
// B_j to a point on its left is to a vertex of the upper convex hull of those
// points, and along that hull the slope to B_j falls, then rises: the hull
// grows one point per message and each j is a binary search, O(n log n)
// against perftest's O(n^2/cqMod). Slopes are compared exactly as fractions;
// truncation is monotone, so truncating the least slope gives the least
// truncated time.
func bestWindow(cqMod int, posted, completed []time.Duration) time.Duration {
	n := len(posted)
	hull := make([]int, 0, n) // message indices i of the vertices A_i
	added := 0
	var num, den int64 // least slope so far
	query := func(j int) {
		for ; added <= j; added++ {
			// A_added joins on the right; vertices it does not leave strictly
			// above the chain drop out.
			for len(hull) >= 2 {
				a, b := hull[len(hull)-2], hull[len(hull)-1]
				if cmpFrac(int64(posted[b]-posted[a]), int64(b-a), int64(posted[added]-posted[b]), int64(added-b)) > 0 {
					break
				}
				hull = hull[:len(hull)-1]
			}
			hull = append(hull, added)
		}
		slope := func(k int) (int64, int64) {
			i := hull[k]
			return int64(completed[j] - posted[i]), int64(j - i + 1)
		}
		// First vertex k whose successor's slope to B_j is not smaller.
		lo, hi := 0, len(hull)-1
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			a, b := slope(m)
			an, bn := slope(m + 1)
			if cmpFrac(an, bn, a, b) < 0 {
				lo = m + 1
			} else {
				hi = m
			}
		}
		a, b := slope(lo)
		if den == 0 || cmpFrac(a, b, num, den) < 0 {
			num, den = a, b
		}
	}
	for j := cqMod - 1; j < n; j += cqMod {
		query(j)
	}
	if n%cqMod != 0 {
		query(n - 1)
	}
	return time.Duration(num / den)
}

// cmpFrac compares a/b with c/d for b, d > 0: -1, 0 or +1. The cross
// products need 128 bits (nanoseconds times counts overflow int64).
func cmpFrac(a, b, c, d int64) int {
	xh, xl := mul128(a, d)
	yh, yl := mul128(c, b)
	switch {
	case xh < yh:
		return -1
	case xh > yh:
		return 1
	case xl < yl:
		return -1
	case xl > yl:
		return 1
	}
	return 0
}

// mul128 returns x*y as a two's complement 128-bit value (high, low).
func mul128(x, y int64) (int64, uint64) {
	neg := (x < 0) != (y < 0)
	ux, uy := uint64(x), uint64(y)
	if x < 0 {
		ux = -ux
	}
	if y < 0 {
		uy = -uy
	}
	hi, lo := bits.Mul64(ux, uy)
	if neg {
		lo = -lo
		hi = ^hi
		if lo == 0 {
			hi++
		}
	}
	return int64(hi), lo
}
