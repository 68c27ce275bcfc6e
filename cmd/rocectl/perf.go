package main

import "github.com/goroce/goroce/cmd/rocectl/perfcmd"

func init() {
	register("perf", command{
		summary: "perftest compatible tests (send|write|read|atomic)-(bw|lat), either role, or --loopback",
		run:     perfcmd.RunPerf,
	})
}
