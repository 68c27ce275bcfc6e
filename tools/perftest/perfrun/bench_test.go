// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// BenchmarkLoopbackQPs runs "rocectl perf write-bw --loopback -q N" and
// "send-bw --loopback -s 64 -q N": what several posting goroutines gain.
// Run with -cpu 1,2 to see it with one and two Ps. The metrics are the
// client's report (MB/s, Mpps), not ns/op, which includes the setup;
// resends/run and probes/run are the client device's go-back-N restarts
// (completer_retry_err) and probes, which a loopback that loses nothing
// should hardly need.
func BenchmarkLoopbackQPs(b *testing.B) {
	for _, c := range []struct {
		name  string
		verb  perftest.Verb
		size  int
		iters int
		qps   []int
	}{
		{"write-bw", perftest.Write, 65536, 2000, []int{1, 2}},
		{"send-bw-64", perftest.Send, 64, 20000, []int{1, 8}},
	} {
		for _, q := range c.qps {
			b.Run(fmt.Sprintf("%s/q%d", c.name, q), func(b *testing.B) {
				var mbs, mpps, resends, probes float64
				// The client's counters, read as its device closes.
				stats := func(d *roce.Device, server bool) (func(), error) {
					if server {
						return func() {}, nil
					}
					return func() {
						c := d.Counters()
						resends += float64(c.CompleterRetryErr)
						probes += float64(c.Probes)
					}, nil
				}
				for b.Loop() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					cfg := PerfConfig{Verb: c.verb, Size: c.size, Iters: c.iters, NumQPs: q, GIDIndex: -1}
					client, _, err := loopback(ctx, cfg, io.Discard, false, stats)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
					mbs += client[0].BW.BWAvg
					mpps += client[0].BW.MsgRate
				}
				b.ReportMetric(mbs/float64(b.N), "MB/s")
				b.ReportMetric(mpps/float64(b.N), "Mpps")
				b.ReportMetric(resends/float64(b.N), "resends/run")
				b.ReportMetric(probes/float64(b.N), "probes/run")
			})
		}
	}
}

// The bandwidth loops allocate nothing per message, on several QPs, with
// post lists and inline sends: ten times the messages cost (almost) no
// more allocations.
func TestBWRunAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a loopback test several times")
	}
	run := func(iters int) func() {
		return func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := PerfConfig{Verb: perftest.Write, Size: 256, Iters: iters, NumQPs: 2, PostList: 4, Inline: 256, GIDIndex: -1}
			if _, _, err := Loopback(ctx, cfg, io.Discard, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	small, large := 400, 4000
	a := testing.AllocsPerRun(3, run(small))
	z := testing.AllocsPerRun(3, run(large))
	t.Logf("%v allocations for %d messages a QP, %v for %d", a, small, z, large)
	// Per message there would be at least large-small (×2 QPs) more.
	if extra := z - a; extra > float64(large-small)/10 {
		t.Errorf("%v allocations for %d messages a QP, %v for %d: %.2f per message", a, small, z, large, extra/float64(large-small))
	}
}
