package main

import "github.com/goroce/goroce/internal/perftest/perfrun"

func init() {
	register("perf", command{
		summary: "perftest compatible tests (send|write|read|atomic)-(bw|lat), either role, or --loopback",
		run:     perfrun.RunPerf,
	})
}
