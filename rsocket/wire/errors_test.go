package wire

import (
	"errors"
	"testing"
)

// Every error value matches its own category and no other, and carries a
// reason token and its detail.
func TestErrorCategories(t *testing.T) {
	kinds := []error{ErrMalformed, ErrProtocol, ErrBlocked, ErrInvalid, ErrClosed}
	all := []*Error{errShort, errVersion, errReservedFlags, errReservedBytes, errSGLLength,
		errZeroLength, errWrap, errOverlap, errReservedOp, errBadCtrl, errZeroData,
		errIOMapReserved, errLength, errHeader,
		errNoCredit, errPastBuffer, errOutOfOrder, errCrossesSGE, errSlotBusy, errBadSlot, errOverConsume,
		errNoSendQueue, errNoSendBuffer, errNoCredits, errNoTarget, errNoCtrlSlot,
		errBadConfig, errZeroWrite, errIOMapIndex, errCtrlValue}
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
		if got := ReasonOf(&ProtoWrap{e}); got != e.Reason {
			t.Errorf("ReasonOf(wrapped %v) = %q", e, got)
		}
	}
	if ReasonOf(ErrClosed) != "" || ReasonOf(nil) != "" {
		t.Error("ReasonOf of a non-*Error is not empty")
	}
}

type ProtoWrap struct{ err error }

func (w *ProtoWrap) Error() string { return "wrapped: " + w.err.Error() }
func (w *ProtoWrap) Unwrap() error { return w.err }

func TestCtrlValueInvalid(t *testing.T) {
	a, _ := newPair(t, false, false, 8192, 16, 0)
	if _, err := a.conn.Recv.Ctrl(CtrlShutdown + 1); err != errCtrlValue || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Ctrl(3) = %v, want %v", err, errCtrlValue)
	}
}
