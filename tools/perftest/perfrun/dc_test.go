// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// Every perftest test over DC, both ends in this process: a DCI on each
// side reaching the other side's DCT; the received data is checked.
func TestLoopbackDC(t *testing.T) {
	for name, tc := range PerfTests {
		t.Run(name, func(t *testing.T) {
			if raceEnabled && name == "write-lat" {
				t.Skip("write latency polls memory written by the device")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := PerfConfig{Verb: tc.Verb, Latency: tc.Latency, Iters: 50, GIDIndex: -1, DC: true}
			if !tc.Latency && name != "atomic-bw" {
				cfg.Size = 8192
			}
			var out bytes.Buffer
			client, server, err := Loopback(ctx, cfg, &out, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if len(client) != 1 || client[0].DataErrors != 0 {
				t.Fatalf("client results %+v", client)
			}
			for _, r := range server {
				if r.DataErrors != 0 {
					t.Fatalf("server data errors %+v", r)
				}
			}
			if !strings.Contains(out.String(), "Connection type : DC") {
				t.Errorf("header does not say DC:\n%s", out.String())
			}
		})
	}
}

func TestPerfConnectionFlag(t *testing.T) {
	var o, e bytes.Buffer
	if code := RunPerf([]string{"write-bw", "--connection", "XRC", "--loopback"}, &o, &e); code != 2 {
		t.Fatalf("exit %d: %s", code, e.String())
	}
}
