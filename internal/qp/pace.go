package qp

import "time"

// pacer is a token bucket in bytes that holds a QP's requests to its
// DCQCN rate. A packet may leave while the bucket is not negative and is
// charged after it left, so a packet is never split or held for its own
// size; the bucket fills at the rate up to a burst of two packets or
// paceBurstTime at the rate, whichever is more, so that a software timer
// that wakes late does not cost the QP its rate.
type pacer struct {
	tokens float64 // bytes; negative after a packet the bucket did not cover
	at     time.Duration
}

// paceBurstTime is the rate's worth a bucket holds at most: about the
// wake-up slack of the device's timer goroutine.
const paceBurstTime = 50 * time.Microsecond

// reset empties the bucket's debt when the QP is not limited.
func (p *pacer) reset(now time.Duration) {
	p.tokens, p.at = 0, now
}

// ready refills the bucket to now at rate bits/s and reports whether a
// packet may leave; if not, at is when it may.
func (p *pacer) ready(now time.Duration, rate int64, mtu int) (ok bool, at time.Duration) {
	bps := float64(rate) / 8 // bytes per second
	if now > p.at {
		p.tokens += bps * (now - p.at).Seconds()
		p.at = now
	}
	burst := max(float64(2*mtu), bps*paceBurstTime.Seconds())
	p.tokens = min(p.tokens, burst)
	if p.tokens >= 0 {
		return true, now
	}
	wait := time.Duration(-p.tokens/bps*1e9) + 1
	return false, now + wait
}

// charge takes n bytes sent.
func (p *pacer) charge(n int) { p.tokens -= float64(n) }
