// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"testing"

	"github.com/goroce/goroce/internal/perftest"
)

// TestPerftest runs every perftest test (send, write, read, atomic; BW and
// latency) in the guest against rocectl perf on goroce, each side as server
// and as client, at path MTU 1024 and 2048. Where one side prints the other's
// numbers (the server of a write, read or atomic BW test prints the client's
// report), the row must be the same bytes on both ends; each side's remote
// address line must be the other's local one. A few tests run again in
// perftest's -R mode, connected with rdma_cm.
func TestPerftest(t *testing.T) {
	e := Setup(t)
	var cases []PerfCase
	for _, mtu := range []int{1024, 2048} {
		for v := perftest.Send; v <= perftest.Atomic; v++ {
			size := 0
			if v != perftest.Atomic {
				size = 16384
			}
			cases = append(cases, PerfCase{Verb: v, MTU: mtu, Size: size, Iters: 200})
			cases = append(cases, PerfCase{Verb: v, Latency: true, MTU: mtu, Iters: 100})
		}
	}
	cases = append(cases, PerfCase{Verb: perftest.Write, MTU: 2048, Size: 65536, Iters: 100, Gbits: true})
	// -R: the exchange and the test QP over rdma_cm.
	cases = append(cases,
		PerfCase{Verb: perftest.Write, MTU: 1024, Size: 16384, Iters: 200, RDMACM: true},
		PerfCase{Verb: perftest.Send, Latency: true, MTU: 1024, Iters: 100, RDMACM: true},
		PerfCase{Verb: perftest.Send, MTU: 1024, Size: 16384, Iters: 200, RDMACM: true},
		PerfCase{Verb: perftest.Read, MTU: 2048, Size: 16384, Iters: 200, RDMACM: true})
	for _, c := range cases {
		t.Run("goroce-server/"+c.Name(), func(t *testing.T) { PerfGoroceServer(t, e, c) })
		t.Run("goroce-client/"+c.Name(), func(t *testing.T) { PerfGoroceClient(t, e, c) })
	}
}
