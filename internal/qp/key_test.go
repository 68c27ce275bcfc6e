package qp

import (
	"testing"
	"time"
)

type fixedClock struct{}

func (fixedClock) Now() time.Duration { return 0 }

// TestKeysNeverRepeat registers and deregisters MRs many times over: a key,
// once deregistered, must never be issued again (a late packet carrying it
// would otherwise reach the new region).
func TestKeysNeverRepeat(t *testing.T) {
	e, _ := New(Config{Clock: fixedClock{}})
	pd, _ := e.AllocPD()
	seen := map[uint32]bool{}
	live := []*MR{}
	buf := make([]byte, 8)
	for i := 0; i < 400_000; i++ {
		mr, err := pd.RegMR(buf, 0, AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if seen[mr.LKey()] {
			t.Fatalf("key %#x issued twice (registration %d)", mr.LKey(), i)
		}
		seen[mr.LKey()] = true
		if mr.LKey() == 0 || mr.LKey()>>8 == 0 {
			t.Fatalf("key %#x uses index 0", mr.LKey())
		}
		live = append(live, mr)
		// Keep a few alive, release the rest in a mixed order.
		if len(live) > 3 {
			j := i % len(live)
			live[j].Dereg()
			live = append(live[:j], live[j+1:]...)
		}
	}
	for _, mr := range live {
		if e.keys.lookup(mr.LKey()) != mr {
			t.Fatal("live MR not found by its key")
		}
	}
	if n := len(e.keys.mrs); n > 4000 {
		t.Fatalf("key table grew to %d slots for 4 live regions", n)
	}
}
