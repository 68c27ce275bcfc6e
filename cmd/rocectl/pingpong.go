package main

import "github.com/goroce/goroce/internal/perftest/perfrun"

func init() {
	register("pingpong", command{
		summary: "ibv_rc_pingpong / ibv_ud_pingpong compatible test (rc|ud), either role",
		run:     perfrun.RunPingpong,
	})
}
