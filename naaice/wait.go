package naaice

import (
	"context"
	"runtime"

	"github.com/goroce/goroce/roce"
)

// spinRounds bounds the polling before waitCQ parks: enough to catch a
// reply that is already on its way without burning a core while a routine
// runs.
const spinRounds = 64

// waitCQ blocks until cq holds a completion, ctx ends, or done closes (the
// connection ended). It is the only place that waits on a CQ, so that a
// change of how roce parks a waiter touches nothing else.
func waitCQ(ctx context.Context, cq *roce.CQ, done <-chan struct{}) error {
	for i := 0; i < spinRounds; i++ {
		if cq.Len() > 0 {
			return nil
		}
		runtime.Gosched()
	}
	for cq.Len() == 0 {
		select {
		case <-cq.Ready():
		case <-done:
			if cq.Len() > 0 {
				return nil
			}
			return ErrConnectionEnded
		case <-ctx.Done():
			if cq.Len() > 0 {
				return nil
			}
			return ctx.Err()
		}
	}
	return nil
}
