package xdplink_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/link/xdplink"
)

// TestDuplex runs both directions at once, a reader and a writer goroutine
// per end, with a window smaller than the receive chunks so that nothing is
// dropped; every frame is checked byte for byte.
func TestDuplex(t *testing.T) {
	a, b := pair(t, 1500, xdplink.Options{FrameSize: 2048})
	const (
		total  = 20000
		batch  = 32
		window = 512
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	var recvd [2]atomic.Int64
	start := time.Now()
	for dir, ends := range [][2]*end{{a, b}, {b, a}} {
		from, to := ends[0], ends[1]
		got := &recvd[dir]
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			bufs := make([][]byte, batch)
			for i := range bufs {
				bufs[i] = make([]byte, 1514)
			}
			for sent := 0; sent < total; sent += batch {
				for int64(sent)-got.Load() > window {
					if ctx.Err() != nil {
						errs <- fmt.Errorf("dir %d: writer stalled at %d, peer has %d", dir, sent, got.Load())
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
				for i := range bufs {
					l := 64 + (sent+i)*97%1450
					bufs[i] = bufs[i][:l]
					udpFrame(bufs[i], to.mac, from.mac, uint32(sent+i))
				}
				if n, err := from.l.WriteBatch(bufs); n != batch || err != nil {
					errs <- fmt.Errorf("dir %d: WriteBatch %d, %v", dir, n, err)
					return
				}
			}
		}()
		go func() { // reader
			defer wg.Done()
			want := make([]byte, 1514)
			next := uint32(0)
			var bad error
			check := func(frames [][]byte) {
				for _, f := range frames {
					if !isOurs(f) || bad != nil {
						continue
					}
					seq := binary.BigEndian.Uint32(f[42:46])
					w := want[:len(f)]
					udpFrame(w, f[0:6], from.mac, seq)
					if seq != next || string(w) != string(f) {
						bad = fmt.Errorf("dir %d: frame %d (%d bytes) arrived, want frame %d intact", dir, seq, len(f), next)
					}
					next++
				}
				got.Store(int64(next))
			}
			for int(next) < total && bad == nil {
				if _, err := to.l.ReadBatch(ctx, check); err != nil {
					st, _ := to.l.Socket().Stats()
					errs <- fmt.Errorf("dir %d: ReadBatch after %d frames: %v (stats %+v)", dir, next, err, st)
					return
				}
			}
			if bad != nil {
				errs <- bad
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	d := time.Since(start)
	t.Logf("%d frames each way at once, byte-exact, in %v (%.0f frames/s total)", total, d.Round(time.Millisecond), 2*total/d.Seconds())
}
