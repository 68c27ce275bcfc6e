package main

import "github.com/goroce/goroce/cmd/rocectl/fpgacmd"

func init() {
	register("fpga", command{
		summary: "Rogue RoCEv2: receive server (recv) or FPGA emulator (send)",
		run:     fpgacmd.Run,
	})
}
