package wire

import (
	"errors"
	"testing"
)

// Every error value matches its own category and no other, and keeps a
// reason token and its text.
func TestErrorCategories(t *testing.T) {
	kinds := []error{ErrInvalid, ErrFrame}
	all := []*Error{errQPN, errPSN, errPMTU, errRNRTimer, errRetry, errConfig, errSlabTooLarge,
		errSlotRange, errFlushed, errStatus, errOpcode, errZeroLength, errTooLong}
	for _, e := range all {
		if e.Reason == "" || e.Detail == "" {
			t.Errorf("%v: empty reason or detail", e)
		}
		n := 0
		for _, k := range kinds {
			if errors.Is(e, k) {
				n++
				if k != e.Kind {
					t.Errorf("%v matches %v, kind %v", e, k, e.Kind)
				}
			}
		}
		if n != 1 {
			t.Errorf("%v matches %d categories", e, n)
		}
		if got := ReasonOf(errors.Join(errors.New("x"), e)); got != e.Reason {
			t.Errorf("ReasonOf(joined %v) = %q", e, got)
		}
	}
}
