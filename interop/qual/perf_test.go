// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"testing"

	"github.com/goroce/goroce/tools/perftest"
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
		cases = append(cases, PerfVerbs(mtu, 16384, 200, 100)...)
	}
	cases = append(cases, PerfCase{Verb: perftest.Write, MTU: 2048, Size: 65536, Iters: 100, Gbits: true})
	// -R: the exchange and the test QP over rdma_cm.
	cases = append(cases,
		PerfCase{Verb: perftest.Write, MTU: 1024, Size: 16384, Iters: 200, RDMACM: true},
		PerfCase{Verb: perftest.Send, Latency: true, MTU: 1024, Iters: 100, RDMACM: true},
		PerfCase{Verb: perftest.Send, MTU: 1024, Size: 16384, Iters: 200, RDMACM: true},
		PerfCase{Verb: perftest.Read, MTU: 2048, Size: 16384, Iters: 200, RDMACM: true})
	PerfBothRoles(t, e, cases)
}
