package rsocket

import (
	"runtime"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// TestPeerKilled: the peer's device disappears mid-stream. The writer gets
// an error (retries exhausted), not a hang, and Close releases the QP,
// CQ, MRs, PD and goroutines.
func TestPeerKilled(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	base := runtime.NumGoroutine()
	c, s, l := connPair(t, da, db, nil, nil)
	_ = s
	before := da.Resources()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	l.Close()
	db.Close() // the peer host dies: no DISCONNECT, no DREQ
	select {
	case err := <-done:
		t.Logf("writer: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("Write still blocked a minute after the peer died; QP %v attr %+v counters %+v", c.qp.State(), c.qp.Attr(), da.Counters())
	}
	if err := c.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	after := da.Resources()
	if after.QP != before.QP-1 || after.MR != before.MR-3 || after.CQ != before.CQ-1 || after.PD != before.PD-1 {
		t.Fatalf("resources with the connection %+v, after Close %+v", before, after)
	}
	// The connection's goroutines end (the CM's may linger a little).
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+8 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+8 {
		t.Errorf("%d goroutines, %d before the connection", n, base)
	}
}
