// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package cliflag

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestReorder(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Bool("json", false, "")
	fs.Int("s", 0, "")
	for _, tc := range []struct{ in, want string }{
		{"f.pcap --json", "--json -- f.pcap"},
		{"a -s 5 b", "-s 5 -- a b"},
		{"-s=5 a", "-s=5 -- a"},
		{"a -- -s 5", "-- a -s 5"},
		{"-json", "-json"},
		{"-s", "-s"},
		{"-unknown a", "-unknown -- a"},
	} {
		if got := strings.Join(Reorder(fs, strings.Fields(tc.in)), " "); got != tc.want {
			t.Errorf("Reorder(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		set, args, want string
	}{
		{"perf", "-s 99999999999", "rocectl perf: -s 99999999999: must be at most 4294901760 (the registration limit)"},
		{"perf", "-p 99999", "rocectl perf: -p 99999: must be at most 65535"},
		{"perf", "-t -1", "rocectl perf: -t -1: must not be negative"},
		{"perf", "-timeout -1s", "rocectl perf: -timeout -1s: must not be negative"},
		{"rstream", "-S all", ""},
		{"rstream", "-S 0", "rocectl rstream: -S 0: must be at least 1"},
		{"rstream", "-p http", ""},
		{"perf", "-s 0 -p 1", ""},
		{"rping", "-metrics 127.0.0.1:0", ""},
		{"rping", "-metrics :9100", ""},
		{"rping", "-metrics [::1]:http", ""},
		{"rping", "-metrics 9100", `rocectl rping: -metrics 9100: not host:port ("127.0.0.1:9100", ":9100")`},
		{"rping", "-metrics 127.0.0.1:70000", "rocectl rping: -metrics 127.0.0.1:70000: must be at most 65535"},
		{"rping", "-metrics 127.0.0.1:", "rocectl rping: -metrics 127.0.0.1:: no port"},
	} {
		fs := flag.NewFlagSet(tc.set, flag.ContinueOnError)
		var out bytes.Buffer
		fs.SetOutput(&out)
		fs.Int("s", 0, "")
		fs.Int("p", 1, "")
		fs.Int("t", 0, "")
		fs.String("S", "", "")
		fs.Duration("timeout", 0, "")
		fs.String("metrics", "", "")
		if tc.set == "rstream" {
			fs = flag.NewFlagSet(tc.set, flag.ContinueOnError)
			fs.SetOutput(&out)
			fs.String("S", "", "")
			fs.String("p", "", "")
		}
		err := Parse(fs, strings.Fields(tc.args))
		if got := strings.TrimSpace(out.String()); got != tc.want || (err == nil) != (tc.want == "") {
			t.Errorf("%s %s: error %v, printed %q, want %q", tc.set, tc.args, err, got, tc.want)
		}
	}
}

// perf's perftest flags are checked under their short and long names
// alike, and -s × -q against memory.
func TestPerfLimits(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{"-q 2 --qp=1024 -D 5 -I 400 -l 16 -u 31 -T 255", ""},
		{"--qp=1025", "rocectl perf: -qp 1025: must be at most 1024 (each QP has its own buffer, CQs and goroutine)"},
		{"-q 0", "rocectl perf: -q 0: must be at least 1"},
		{"--duration=0", "rocectl perf: -duration 0: must be at least 1"},
		{"-I 401", "rocectl perf: -I 401: must be at most 400 (the largest inline payload of a goroce QP)"},
		{"--inline_size=-1", "rocectl perf: -inline_size -1: must not be negative"},
		{"--post_list=0", "rocectl perf: -post_list 0: must be at least 1"},
		{"-u 32", "rocectl perf: -u 32: must be at most 31 (5-bit exponent)"},
		{"--tos=256", "rocectl perf: -tos 256: must be at most 255 (8-bit)"},
		{"--size=8388608 --qp=1024", "rocectl perf: -s 8388608 × -q 1024: must be at most 4294901760 (the registration limit)"},
		{"--shards=64", ""},
		{"--shards=65", "rocectl perf: -shards 65: must be at most 64 (a device's transmit shards; 0: the default)"},
		{"--shards=-1", "rocectl perf: -shards -1: must not be negative"},
		{"--queues=64", ""},
		{"--queues=65", "rocectl perf: -queues 65: must be at most 64 (the UDP link's receive queues; 0: one)"},
		{"--queues=-1", "rocectl perf: -queues -1: must not be negative"},
	} {
		fs := flag.NewFlagSet("perf", flag.ContinueOnError)
		var out bytes.Buffer
		fs.SetOutput(&out)
		for _, f := range []struct{ short, long string }{{"s", "size"}, {"q", "qp"}, {"D", "duration"}, {"I", "inline_size"},
			{"l", "post_list"}, {"u", "qp-timeout"}, {"T", "tos"}} {
			v := fs.Int(f.short, 0, "")
			fs.IntVar(v, f.long, 0, "")
		}
		fs.Int("shards", 0, "")
		fs.Int("queues", 0, "")
		err := Parse(fs, strings.Fields(tc.args))
		if got := strings.TrimSpace(out.String()); got != tc.want || (err == nil) != (tc.want == "") {
			t.Errorf("perf %s: error %v, printed %q, want %q", tc.args, err, got, tc.want)
		}
	}
}
