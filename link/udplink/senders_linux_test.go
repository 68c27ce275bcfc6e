package udplink

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/link"
)

// Goroutines that write at once each get a send state of their own, and
// every frame of each arrives whole: per goroutine in the order it wrote
// them (one socket, one destination, so the kernel keeps each sender's
// order), none lost, none mixed with another goroutine's.
func TestConcurrentWriters(t *testing.T) {
	a, b := listen(t, "127.0.0.1"), listen(t, "127.0.0.1")
	const writers, batches, per = 6, 20, 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			frames := make([][]byte, per)
			for k := 0; k < batches; k++ {
				for i := range frames {
					p := payload(w<<16|k*per+i, 40+w)
					frames[i] = mkframe(a.LocalAddr(), b.LocalAddr(), 0, p)
				}
				if n, err := a.WriteBatch(frames); n != per || err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	got := collect(t, b, a.LocalAddr(), writers*batches*per, 10*time.Second)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("WriteBatch: %v", err)
	}
	next := make([]int, writers)
	for _, f := range got {
		pf, _ := link.ParseFrame(f)
		p := f[pf.Payload:pf.End]
		v := int(binary.BigEndian.Uint32(p))
		w, seq := v>>16, v&0xFFFF
		if w >= writers || string(p) != string(payload(v, 40+w)) {
			t.Fatalf("frame %x: not one a writer sent whole", p)
		}
		if seq != next[w] {
			t.Fatalf("writer %d: frame %d arrived, want %d", w, seq, next[w])
		}
		next[w]++
	}
	// Six goroutines at once on a busy host need not overlap, but the
	// states they took must be free again.
	for i, s := range a.senders {
		if !s.mu.TryLock() {
			t.Fatalf("send state %d still held", i)
		}
		s.mu.Unlock()
	}
}
