package qp

import "testing"

// TestQPStateTableShape checks the invariants of qpStateTable that the
// kernel's table has too: every state may go to RESET and ERR with nothing
// else, a required attribute is never also listed as optional, AttrState is
// implied rather than listed, and a type without the move has no masks.
func TestQPStateTableShape(t *testing.T) {
	for from := StateReset; from <= StateErr; from++ {
		for _, to := range []QPState{StateReset, StateErr} {
			for _, ty := range []QPType{RC, UC, UD} {
				if tr := transitionFor(ty, from, to); tr != (transition{true, AttrState, 0}) {
					t.Errorf("%v %v→%v: %+v, want valid with nothing but the state", ty, from, to, tr)
				}
			}
		}
		for to := StateReset; to <= StateErr; to++ {
			m := qpStateTable[from][to]
			for _, ty := range []QPType{RC, UC, UD} {
				req, opt := m.req[ty], m.opt[ty]
				if req&opt != 0 || (req|opt)&AttrState != 0 {
					t.Errorf("%v %v→%v: req %v opt %v overlap or list the state", ty, from, to, req, opt)
				}
				if m.types&(1<<ty) == 0 && req|opt != 0 {
					t.Errorf("%v %v→%v: masks for a move the type may not make", ty, from, to)
				}
			}
		}
	}
	if transitionFor(RC, StateSQE, StateRTS).valid || !transitionFor(UC, StateSQE, StateRTS).valid {
		t.Error("SQE→RTS is for UC and UD only")
	}
	if transitionFor(RC, StateReset, StateRTS).valid || transitionFor(UD, StateErr, StateRTS).valid {
		t.Error("skipping states is not allowed")
	}
}
