// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package jumbo

import (
	"fmt"
	"os"
	"testing"

	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
)

func TestMain(m *testing.M) {
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 9000,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	qual.Shared.Close()
	os.Exit(code)
}

// TestPingpong4096 runs both pingpong tools, both roles, with 4096-byte
// packets.
func TestPingpong4096(t *testing.T) {
	e := qual.Setup(t)
	cases := []qual.PingpongCase{
		{Type: roce.RC, Size: 4096, MTU: 4096, Iters: 50},
		{Type: roce.RC, Size: 20000, MTU: 4096, Iters: 50},
		{Type: roce.UD, Size: 4096, Iters: 50},
	}
	qual.PingpongBothRoles(t, e, cases)
}

// TestPerftest4096 runs the perftest BW and latency tests at path MTU 4096.
func TestPerftest4096(t *testing.T) {
	e := qual.Setup(t)
	qual.PerfBothRoles(t, e, qual.PerfVerbs(4096, 65536, 100, 100))
}
