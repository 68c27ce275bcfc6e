// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"fmt"
	"os"
	"testing"

	"github.com/goroce/goroce/interop/rxelab"
)

// labMTU gives rxe an active MTU of 2048 (3000 − 80 rounded down to an IB
// MTU) while a frame still fits one 4096-byte UMEM chunk; path MTU 1024 is
// asked for with -m.
const labMTU = 3000

func TestMain(m *testing.M) {
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: labMTU,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	Shared.Close()
	os.Exit(code)
}
