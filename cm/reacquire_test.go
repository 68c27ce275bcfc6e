package cm

import (
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// An agent that left the registry still holds QP1 until its goroutine ends;
// acquire waits for it instead of failing with ErrBusy ("QP1 in use"), which
// a client reconnecting at once after its last connection closed would see.
func TestAcquireWaitsForDyingAgent(t *testing.T) {
	da, _ := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	dying := &agent{dev: da, done: make(chan struct{})}
	registry.Lock()
	if registry.m == nil {
		registry.m = map[*roce.Device]*agent{}
		registry.dying = map[*roce.Device]*agent{}
	}
	registry.dying[da] = dying
	registry.Unlock()

	got := make(chan error, 1)
	var a *agent
	go func() {
		var err error
		a, err = acquire(da)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("acquire returned (%v) while the old agent still held QP1", err)
	case <-time.After(50 * time.Millisecond):
	}
	dying.leftRegistry()
	close(dying.done)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("acquire did not proceed once the old agent ended")
	}
	a.release()
}
