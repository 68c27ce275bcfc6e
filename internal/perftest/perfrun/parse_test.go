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
					c.TxDepth > 1<<14 || c.RxDepth < 0 || c.RxDepth > 1<<14 || c.CQMod < 0 || len(p.pos) > 1 {
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
