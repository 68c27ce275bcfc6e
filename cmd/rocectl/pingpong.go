package main

import (
	"io"

	"github.com/goroce/goroce/tools/perftest/perfrun"
)

func init() {
	register("pingpong", command{
		summary: "ibv_rc_pingpong / ibv_ud_pingpong compatible test (rc|ud), either role",
		run: func(args []string, stdout, stderr io.Writer) int {
			return perfrun.RunPingpongStats(args, stdout, stderr, perfStats(stderr))
		},
	})
}
