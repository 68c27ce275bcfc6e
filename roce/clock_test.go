package roce

import (
	"testing"
	"time"
)

// The engine's clock reads the time once per receive batch, and afresh
// outside one.
func TestMonoClockHold(t *testing.T) {
	c := monoClock{start: time.Now().Add(-time.Second)}
	a := c.Now()
	c.hold = true
	b := c.Now()
	time.Sleep(2 * time.Millisecond)
	if c.Now() != b || b < a {
		t.Fatalf("held clock moved: %v, then %v", b, c.Now())
	}
	c.hold, c.have = false, false
	if d := c.Now(); d < b+2*time.Millisecond {
		t.Fatalf("released clock reads %v, %v after the held %v", d, d-b, b)
	}
	c.hold = true
	if d := c.Now(); d < b+2*time.Millisecond {
		t.Fatalf("a new batch reads the old time %v", d)
	}
}
