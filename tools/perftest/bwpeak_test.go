// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// runTimes returns the timestamps of an n-message run as a sender sees
// them: posts gap apart on average, and every message of a cqMod batch
// completed when the batch's signaled completion arrives, lat after the
// batch's last post.
func runTimes(rng *rand.Rand, n, cqMod int, gap, lat time.Duration) BWTimes {
	t := BWTimes{Posted: make([]time.Duration, n), Completed: make([]time.Duration, n)}
	var now time.Duration
	for i := range n {
		now += time.Duration(rng.Int64N(int64(2*gap) + 1))
		t.Posted[i] = now
	}
	for start := 0; start < n; start += cqMod {
		end := min(start+cqMod, n)
		done := t.Posted[end-1] + time.Duration(rng.Int64N(int64(2*lat)+1))
		if start > 0 {
			done = max(done, t.Completed[start-1])
		}
		for i := start; i < end; i++ {
			t.Completed[i] = done
		}
	}
	return t
}

// oddTimes returns timestamps of kind k, each an input perftest's loop
// handles that a run would not produce.
func oddTimes(rng *rand.Rand, n, k int) BWTimes {
	t := BWTimes{Posted: make([]time.Duration, n), Completed: make([]time.Duration, n)}
	switch k {
	case 0: // all equal
		v := time.Duration(rng.Int64N(3) - 1)
		for i := range n {
			t.Posted[i], t.Completed[i] = v, v
		}
	case 1: // few distinct values, in any order: ties and negative windows
		for i := range n {
			t.Posted[i] = time.Duration(rng.Int64N(5))
			t.Completed[i] = time.Duration(rng.Int64N(5))
		}
	case 2: // posts out of order
		for i := range n {
			t.Posted[i] = time.Duration(rng.Int64N(1e9))
			t.Completed[i] = t.Posted[i] + time.Duration(rng.Int64N(1e6))
		}
	case 3: // completions before posts
		t = runTimes(rng, n, 1+rng.IntN(8), time.Microsecond, 10*time.Microsecond)
		for i := range n {
			t.Completed[i] -= time.Duration(rng.Int64N(1e5))
		}
	case 4: // huge timestamps whose differences still fit
		base := time.Duration(1<<62 - rng.Int64N(1e6))
		for i := range n {
			t.Posted[i] = base + time.Duration(rng.Int64N(1<<61))
			t.Completed[i] = base - time.Duration(rng.Int64N(1<<61))
		}
	case 5: // huge differences: windows wrap around
		for i := range n {
			t.Posted[i] = time.Duration(rng.Uint64())
			t.Completed[i] = time.Duration(rng.Uint64())
		}
	case 6: // near the ends of the range, differences just fitting
		for i := range n {
			t.Posted[i] = time.Duration(math.MinInt64/2 + rng.Int64N(3))
			t.Completed[i] = time.Duration(math.MaxInt64/2 - rng.Int64N(3))
		}
	default: // a run with a few timestamps swapped or zeroed
		t = runTimes(rng, n, 1+rng.IntN(8), time.Microsecond, 10*time.Microsecond)
		for range 1 + n/100 {
			i, j := rng.IntN(n), rng.IntN(n)
			t.Posted[i], t.Completed[j] = t.Completed[j], 0
		}
	}
	return t
}

func checkBW(t *testing.T, size uint64, cqMod int, tm BWTimes, gbits bool) {
	t.Helper()
	got := BWReportFrom(size, cqMod, tm, gbits)
	want := bwReportQuadratic(size, cqMod, tm, gbits)
	if got != want {
		t.Fatalf("cqMod %d, n %d/%d: %+v, perftest's loop gives %+v\nposted %v\ncompleted %v",
			cqMod, len(tm.Posted), len(tm.Completed), got, want, tm.Posted, tm.Completed)
	}
}

// TestBWReportFromMatchesLoop compares the peak with perftest's own loop
// over every window, on runs and on inputs no run produces.
func TestBWReportFromMatchesLoop(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cqMods := []int{1, 2, 3, 7, 100, 1000}
	cases := 600
	if testing.Short() {
		cases = 100
	}
	for c := range cases {
		n := rng.IntN(40)
		if c%4 == 0 {
			n = rng.IntN(3001)
		}
		cqMod := cqMods[rng.IntN(len(cqMods))]
		var tm BWTimes
		if c%2 == 0 {
			gap := time.Duration(1 + rng.Int64N(2000))
			tm = runTimes(rng, n, cqMod, gap, time.Duration(rng.Int64N(50000)))
		} else {
			tm = oddTimes(rng, n, rng.IntN(8))
		}
		checkBW(t, uint64(1)<<rng.IntN(24), cqMod, tm, c%3 == 0)
	}
	// Posted and Completed of unequal lengths, cqMod out of range.
	tm := runTimes(rng, 50, 3, time.Microsecond, time.Microsecond)
	for _, q := range []int{-5, 0, 49, 50, 51, 1 << 40} {
		checkBW(t, 4096, q, BWTimes{Posted: tm.Posted, Completed: tm.Completed[:37]}, false)
		checkBW(t, 4096, q, BWTimes{Posted: tm.Posted[:20], Completed: tm.Completed}, true)
	}
}

// TestBWReportFromHugeCQMod checks a cqMod whose index arithmetic would
// overflow in perftest's loop: it ends windows at the last message alone.
func TestBWReportFromHugeCQMod(t *testing.T) {
	tm := runTimes(rand.New(rand.NewPCG(3, 4)), 100, 1, time.Microsecond, time.Microsecond)
	want := bwReportQuadratic(64, 100, tm, false)
	for _, q := range []int{math.MaxInt - 1, math.MaxInt} {
		if got := BWReportFrom(64, q, tm, false); got != want {
			t.Errorf("cqMod %d: %+v, want %+v", q, got, want)
		}
	}
}

func TestCmpFrac(t *testing.T) {
	const m = math.MaxInt64
	for _, c := range []struct {
		a, b, c, d int64
		want       int
	}{
		{1, 2, 2, 4, 0},
		{-1, 2, 1, 2, -1},
		{m, 3, m - 1, 3, 1},
		{m, m, m - 1, m - 1, 0},
		{m, m - 1, m - 1, m - 2, -1}, // m/(m-1) < (m-1)/(m-2)
		{-m, m - 1, -(m - 1), m - 2, 1},
		{math.MinInt64, 1, -m, 1, -1},
		{0, 5, -0, 7, 0},
		{-3, 1 << 40, 0, 1, -1},
		// -2^64 against -(2^64+1) = -67280421310721 * 274177: a product
		// whose low word is zero.
		{-(1 << 32), 274177, -67280421310721, 1 << 32, 1},
		{-(1 << 32), 1 << 24, -(1 << 40), 1 << 32, 0},
	} {
		if got := cmpFrac(c.a, c.b, c.c, c.d); got != c.want {
			t.Errorf("cmpFrac(%d/%d, %d/%d) = %d, want %d", c.a, c.b, c.c, c.d, got, c.want)
		}
	}
}

// FuzzBWReportFrom compares BWReportFrom with perftest's loop. The first
// bytes choose cqMod and the encoding; then each message takes either two
// raw int64s or two small signed steps (post after the previous post,
// completion from the post), so both wrapping and ordinary runs come up.
func FuzzBWReportFrom(f *testing.F) {
	f.Add([]byte{2, 1, 10, 20, 10, 20, 10, 20, 10, 20})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0xc0})
	f.Add([]byte{3, 1, 0, 0, 0xff, 0xff, 5, 0x80, 0, 1, 7, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 2 {
			return
		}
		cqMod, raw := int(b[0]), b[1]&1 != 0
		b = b[2:]
		var tm BWTimes
		if raw {
			for ; len(b) >= 16 && len(tm.Posted) < 512; b = b[16:] {
				tm.Posted = append(tm.Posted, time.Duration(binary.LittleEndian.Uint64(b)))
				tm.Completed = append(tm.Completed, time.Duration(binary.LittleEndian.Uint64(b[8:])))
			}
		} else {
			var p time.Duration
			for ; len(b) >= 2 && len(tm.Posted) < 4096; b = b[2:] {
				p += time.Duration(int8(b[0]))
				tm.Posted = append(tm.Posted, p)
				tm.Completed = append(tm.Completed, p+time.Duration(int8(b[1])))
			}
		}
		checkBW(t, 65536, cqMod, tm, false)
	})
}

// BenchmarkBWReportFrom measures a 40,000-message run with completions
// every 100 messages, and every message as rocectl perf write-bw signals
// them at its default 64 KiB size.
func BenchmarkBWReportFrom(b *testing.B) {
	for _, cqMod := range []int{100, 1} {
		tm := runTimes(rand.New(rand.NewPCG(5, 6)), 40000, cqMod, 500*time.Nanosecond, 20*time.Microsecond)
		for _, c := range []struct {
			name string
			f    func(uint64, int, BWTimes, bool) BWReport
		}{{"loop", bwReportQuadratic}, {"hull", BWReportFrom}} {
			b.Run(fmt.Sprintf("cqmod%d/%s", cqMod, c.name), func(b *testing.B) {
				for b.Loop() {
					c.f(65536, cqMod, tm, false)
				}
			})
		}
	}
}
