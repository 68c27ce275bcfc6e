//go:build linux

package fpga_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// The receive path allocates nothing per frame: a frame sent by the
// emulator, completed, handed to a consumer and released (its slot posted
// again), end to end over memlink, both devices included.
func TestAllocsPerFrame(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 64, emulator.Config{}, 1)
	var got atomic.Uint64
	arrived := make(chan struct{}, 1)
	go s.Serve(context.Background(), func(f fpga.Frame) {
		got.Add(1)
		select {
		case arrived <- struct{}{}:
		default:
		}
	})
	ctx := context.Background()
	buf := make([]byte, 4096)
	one := func() {
		want := got.Load() + 1
		if err := e.Send(ctx, 1, buf); err != nil {
			t.Fatal(err)
		}
		for got.Load() < want {
			<-arrived
		}
	}
	for i := 0; i < 200; i++ { // warm up pools and queues
		one()
	}
	// The device's timers and a parked CQ waiter can allocate now and
	// then (a timer reset, a goroutine wake-up); per frame it must be 0.
	a := testing.AllocsPerRun(2000, one)
	t.Logf("%.4f allocations per frame", a)
	if a >= 0.05 {
		t.Fatalf("%.3f allocations per frame", a)
	}
}

// BenchmarkServer: 4 KiB frames from the emulator into the server (one op
// is one frame; the consumer releases at once; the emulator streams them
// with SendBatch, as an FPGA does), over memlink and, as root, over AF_XDP
// and the kernel UDP link on a veth pair at MTU 9000.
func BenchmarkServer(b *testing.B) {
	b.Run("memlink", func(b *testing.B) {
		host, fdev := memDevices(b, faultnet.Config{}, faultnet.Config{})
		benchServer(b, host, fdev, fpgaAddr)
	})
	for _, kind := range []netdev.LinkKind{netdev.LinkXDP, netdev.LinkUDP} {
		b.Run(kind.String(), func(b *testing.B) {
			host, fdev, fv := netnsDevices(b, kind)
			benchServer(b, host, fdev, fv.Addr.Addr())
		})
	}
}

func benchServer(b *testing.B, host, fdev *roce.Device, fpgaIP netip.Addr) {
	s, e := bringUpAt(b, host, fdev, fpgaIP, 4096, 256, emulator.Config{RingSlots: 128, RetryCnt: 7}, 1)
	var got atomic.Uint64
	done := make(chan struct{})
	var want atomic.Uint64
	go s.Serve(context.Background(), func(f fpga.Frame) {
		if got.Add(1) == want.Load() {
			close(done)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	buf := make([]byte, 4096)
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = buf
	}
	want.Store(uint64(b.N))
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += len(frames) {
		if _, err := e.SendBatch(ctx, 1, frames[:min(len(frames), b.N-i)]); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		b.Fatalf("%d of %d frames", got.Load(), b.N)
	}
	el := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/el, "frames/s")
	b.ReportMetric(float64(b.N)*4096*8/el/1e9, "Gb/s")
	b.ReportMetric(float64(e.Stats().RNRNAKs)/float64(b.N), "rnr/frame")
}
