package memlink

import (
	"sync"
	"time"
)

// ManualClock is a clock that only moves when told to. Readers blocked on
// a pair using it wake when Advance or Set makes a frame due.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Duration
	waiters []chan struct{}
}

// Now returns the current time.
func (c *ManualClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now += d
	c.mu.Unlock()
	c.wake()
}

// Set moves the clock to t; it never moves backwards.
func (c *ManualClock) Set(t time.Duration) {
	c.mu.Lock()
	if t > c.now {
		c.now = t
	}
	c.mu.Unlock()
	c.wake()
}

func (c *ManualClock) subscribe(ch chan struct{}) {
	c.mu.Lock()
	c.waiters = append(c.waiters, ch)
	c.mu.Unlock()
}

func (c *ManualClock) wake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.waiters {
		notify(ch)
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// clock is real time since the pair was made, or a ManualClock.
type clock struct {
	start  time.Time
	manual *ManualClock
}

func (c clock) now() time.Duration {
	if c.manual != nil {
		return c.manual.Now()
	}
	return time.Since(c.start)
}
