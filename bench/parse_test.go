//go:build linux

package bench

import (
	"testing"
)

// sockperfSample is the summary sockperf 3.7 prints for a ping-pong run
// (with its terminal colour escapes).
const sockperfSample = "sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=24307; ReceivedMessages=24306\n" +
	"sockperf: ========= Printing statistics for Server No: 0\n" +
	"sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=18457; ReceivedMessages=18457\n" +
	"sockperf: \x1b[2;35m====> avg-latency=41.938 (std-dev=209.118)\x1b[0m\n" +
	"sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0\n" +
	"sockperf: Summary: Latency is 41.938 usec\n" +
	"sockperf: \x1b[2;35mTotal 18457 observations\x1b[0m; each percentile contains 184.57 observations\n" +
	"sockperf: ---> <MAX> observation = 14318.568\n" +
	"sockperf: ---> percentile 99.999 = 14318.568\n" +
	"sockperf: ---> percentile 99.000 =  873.111\n" +
	"sockperf: ---> percentile 50.000 =   10.769\n" +
	"sockperf: ---> <MIN> observation =    7.343\n"

func TestParseSockperf(t *testing.T) {
	r, err := parseSockperf([]byte(sockperfSample))
	if err != nil {
		t.Fatal(err)
	}
	want := sockperfResult{Avg: 41.938, Median: 10.769, P99: 873.111, Min: 7.343, Observations: 18457}
	if r != want {
		t.Fatalf("got %+v, want %+v", r, want)
	}
	for _, bad := range []string{"", "sockperf: error: no server\n", "avg-latency=x\npercentile 50.000 = 1\n", "avg-latency=1.0\n"} {
		if r, err := parseSockperf([]byte(bad)); err == nil {
			t.Errorf("%q: parsed as %+v, want an error", bad, r)
		}
	}
}

func TestLastJSONLine(t *testing.T) {
	var v struct{ A int }
	if err := lastJSONLine([]byte("text\n{\"A\":1}\n{\"A\":2}\ntrailer\n"), &v); err != nil || v.A != 2 {
		t.Fatalf("got %+v, %v; want A=2", v, err)
	}
	for _, bad := range []string{"", "no json\n", "{broken\n"} {
		if err := lastJSONLine([]byte(bad), &v); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestFigMedian(t *testing.T) {
	for _, c := range []struct {
		s    []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		f := &fig{samples: c.s}
		if v, ok := f.median(); !ok || v != c.want {
			t.Errorf("median(%v) = %v, %v; want %v", c.s, v, ok, c.want)
		}
	}
	for _, f := range []*fig{nil, {}, {samples: []float64{1}, skip: "x"}} {
		if _, ok := f.median(); ok {
			t.Errorf("median of %+v reported", f)
		}
	}
	if got := ratio(&fig{samples: []float64{2}}, &fig{samples: []float64{4}}); got != "0.50" {
		t.Errorf("ratio = %s, want 0.50", got)
	}
	if got := ratio(&fig{samples: []float64{2}}, &fig{}); got != "-" {
		t.Errorf("ratio without a baseline = %s, want -", got)
	}
}

// FuzzParseSockperf: any tool output gives a result or an error, never a
// panic.
func FuzzParseSockperf(f *testing.F) {
	f.Add([]byte(sockperfSample))
	f.Add([]byte("Total observations\navg-latency=(\npercentile 50.000 =\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		parseSockperf(b)
	})
}
