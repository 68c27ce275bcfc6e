package mrsp

import (
	"errors"
	"testing"
)

// Every error value matches its own category and no other, and keeps a
// reason token and its text.
func TestErrorCategories(t *testing.T) {
	kinds := []error{ErrMalformed, ErrRefused, ErrProtocol, ErrAborted, ErrNoWrites}
	all := []*Error{errShort, errLength, errBadType, errPadding, errNoRegions, errZeroCode, errFlags,
		errTooManyRegions, errZeroSize, errRegionTooLarge, errTotalTooLarge, errOutOfMemory,
		errInvalidAddress, errUnaligned, errOverlap, errWrap, errCountMismatch, errRegionTooSmall,
		errFnCode, errNoStart, errHostAbort, errOutOfOrder}
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
	}
	te := &TransitionError{Role: NAA, State: Calculating, Event: EvRecvAAR}
	if !errors.Is(te, ErrProtocol) || ReasonOf(te) != "order" {
		t.Errorf("TransitionError: Is ErrProtocol %v, reason %q", errors.Is(te, ErrProtocol), ReasonOf(te))
	}
	if ReasonOf(ErrNoWrites) != "" {
		t.Error("ReasonOf(ErrNoWrites) not empty")
	}
}
