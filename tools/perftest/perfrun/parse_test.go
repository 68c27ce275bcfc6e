// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"io"
	"strings"
	"testing"

	"github.com/goroce/goroce/internal/cliflag"
)

// FuzzParse drives perf's and pingpong's parsing and validation (the first
// byte picks the command, the rest are its arguments, one per line): no
// input panics, and what passes holds no value that would size a buffer or
// a queue beyond the limits.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"\x00write-bw\n--loopback\n-s\n99999999999",
		"\x00send-lat\n192.0.2.1\n-t\n-1\n-Q\n5",
		"\x00read-bw\n-R\n-p\n99999\nhost",
		"\x01rc\n-s\n-1\n192.0.2.1",
		"\x01ud\n-n\n0\n-r\n100000",
		"\x01rc\n--\n-d",
		"\x00write-bw\n--loopback\n-q\n99999",
		"\x00send-bw\n--qp=0\n192.0.2.1",
		"\x00write-bw\n-D\n-1\n--run_infinitely",
		"\x00send-bw\n--run_infinitely\n--loopback",
		"\x00read-bw\n-I\n64\n-b",
		"\x00write-bw\n--inline_size=9999\n--post_list=0",
		"\x00write-bw\n-l\n7\n-n\n1000",
		"\x00write-lat\n-N\n-q\n2",
		"\x00write-bw\n-u\n32\n-T\n256",
		"\x00write-bw\n--size=8388608\n--qp=1024",
		"\x00write-bw\n--duration=99999999999\n--metrics\n:x",
		"\x01rc\n--metrics\nnoport",
		"\x00write-bw\n-a\n-q\n1024",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		args := strings.Split(string(in[1:]), "\n")
		if in[0]%2 == 0 {
			if p, _ := parsePerf(args, io.Discard, io.Discard); p != nil {
				c := p.cfg
				if c.Size < 0 || c.Size > cliflag.RegistrationLimit || c.Iters < 0 || c.TxDepth < 0 ||
					c.TxDepth > 1<<14 || c.RxDepth < 0 || c.RxDepth > 1<<14 || c.CQMod < 0 || len(p.pos) > 1 ||
					c.NumQPs < 1 || c.NumQPs > cliflag.MaxPerfQPs || uint64(c.Size)*uint64(c.NumQPs) > cliflag.RegistrationLimit ||
					c.Duration < 0 || c.Inline < 0 || c.Inline > MaxInline || c.PostList < 1 || c.PostList > 1<<14 ||
					c.QPTimeout < -1 || c.QPTimeout > 31 || c.TOS < 0 || c.TOS > 255 ||
					c.RunAll && c.NumQPs > 1 && uint64(c.NumQPs)*2*maxRunAllSize > cliflag.RegistrationLimit {
					t.Fatalf("%q passed as %+v", args, c)
				}
			}
			return
		}
		if p, _ := parsePingpong(args, io.Discard, io.Discard); p != nil {
			c := p.cfg
			if c.Size < 0 || c.Size > cliflag.RegistrationLimit || c.Iters < 1 || c.RxDepth < 1 ||
				c.RxDepth > 1<<14 || p.port < 1 || p.port > 65535 || len(p.pos) > 1 {
				t.Fatalf("%q passed as %+v", args, c)
			}
		}
	})
}
