package main

import (
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/goroce/goroce/internal/cliflag"
)

// FuzzArgs drives the parsing and validation of every command: the first
// byte picks the command, the rest are its arguments, one per line. With
// cliflag.ParseOnly each command stops after validating its flags, so no
// device opens and nothing is sized by what passed; what is fuzzed is that
// no input panics, whatever flags, values and operands it mixes.
func FuzzArgs(f *testing.F) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	index := map[string]byte{}
	for i, n := range names {
		index[n] = byte(i)
	}
	for _, tc := range badInputs {
		fields := splitArgs(tc.args)
		if len(fields) == 0 || index[fields[0]] == 0 && fields[0] != names[0] {
			continue
		}
		f.Add(append([]byte{index[fields[0]]}, strings.Join(fields[1:], "\n")...))
	}
	f.Add(append([]byte{index["perf"]}, "write-bw\n192.0.2.1\n-s\n65536\n--\n-x"...))
	cliflag.ParseOnly = true
	f.Cleanup(func() { cliflag.ParseOnly = false })
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		args := []string{names[int(in[0])%len(names)]}
		if len(in) > 1 {
			args = append(args, strings.Split(string(in[1:]), "\n")...)
		}
		if code := run(args, io.Discard, io.Discard); code < 0 || code > 2 {
			t.Errorf("%q: exit %d", args, code)
		}
	})
}
