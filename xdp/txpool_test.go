package xdp

import "testing"

func TestTxPool(t *testing.T) {
	p := newTxPool(1<<20, 4096, 130)
	if p.free != 130 {
		t.Fatal(p.free)
	}
	var got []uint64
	for {
		a, ok := p.get(2)
		if !ok {
			break
		}
		if (a-1<<20)%8192 != 0 && (a-1<<20)>>12%64 == 63 {
			t.Fatalf("span at %#x crosses a word", a)
		}
		got = append(got, a)
	}
	// 64+64 chunks give 32+32 pairs; the last 2 chunks one more.
	if len(got) != 65 || p.free != 0 {
		t.Fatalf("%d pairs, %d left", len(got), p.free)
	}
	p.put(got[3] + 4096 + 100) // the second chunk of a pair, by an inner address
	if _, ok := p.get(2); ok {
		t.Fatal("pair from one free chunk")
	}
	if a, ok := p.get(1); !ok || a != got[3]+4096 {
		t.Fatalf("get(1) = %#x, %v", a, ok)
	}
	p.put(got[5])
	p.put(got[5]) // twice: ignored
	p.put(0)      // outside: ignored
	p.put(1<<20 + 130*4096)
	if p.free != 1 {
		t.Fatalf("%d free", p.free)
	}
	if !p.taken(got[6]) || p.taken(got[5]) {
		t.Fatal("taken")
	}
}
