package main

import (
	"io"

	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest/perfrun"
)

func init() {
	register("perf", command{
		summary: "perftest compatible tests (send|write|read|atomic)-(bw|lat), either role, or --loopback; -q N QPs, -D, -b",
		run: func(args []string, stdout, stderr io.Writer) int {
			return perfrun.RunPerfStats(args, stdout, stderr, perfStats(stderr))
		},
	})
}

// perfStats publishes a perf or pingpong device for "rocectl stat" and
// --metrics, as the other long-running commands do.
func perfStats(stderr io.Writer) perfrun.StartStats {
	return func(dev *roce.Device, command, metrics string) (func(), error) {
		return devstat.Start(dev, devstat.Options{Command: command, Metrics: metrics}, stderr)
	}
}
