package cm

import (
	"net/netip"
	"time"
)

// Defaults of the per-source REQ rate limit (Config.REQRate and friends).
// A peer that opens connections one after another in a loop stays well
// under them; one source flooding a listener with REQs does not.
const (
	DefaultREQRate    = 200  // REQs a second from one source address
	DefaultREQBurst   = 200  // REQs one source may send at once
	DefaultREQSources = 4096 // source addresses remembered
)

// reqLimiter is a token bucket per source address, in a table of bounded
// size: when it is full, the source seen first is forgotten (a forgotten
// source starts again with a full bucket, as a new one does).
type reqLimiter struct {
	rate    float64 // tokens a second
	burst   float64
	buckets map[netip.Addr]*bucket
	order   []netip.Addr // ring of the table's keys, oldest at next
	next    int
}

type bucket struct {
	tokens float64
	last   time.Duration
}

func newREQLimiter(rate float64, burst, sources int) *reqLimiter {
	if rate < 0 {
		return nil
	}
	if rate == 0 {
		rate = DefaultREQRate
	}
	if burst <= 0 {
		burst = DefaultREQBurst
	}
	if sources <= 0 {
		sources = DefaultREQSources
	}
	return &reqLimiter{rate: rate, burst: float64(burst), buckets: make(map[netip.Addr]*bucket, sources),
		order: make([]netip.Addr, 0, sources)}
}

// allow takes a token from src's bucket, reporting false if it is empty.
func (l *reqLimiter) allow(src netip.Addr, now time.Duration) bool {
	if l == nil {
		return true
	}
	b := l.buckets[src]
	if b == nil {
		if len(l.order) == cap(l.order) {
			delete(l.buckets, l.order[l.next])
			l.order[l.next] = src
			l.next = (l.next + 1) % len(l.order)
		} else {
			l.order = append(l.order, src)
		}
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[src] = b
	}
	b.tokens = min(l.burst, b.tokens+(now-b.last).Seconds()*l.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
