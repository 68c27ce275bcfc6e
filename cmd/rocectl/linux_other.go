//go:build !linux

package main

import (
	"fmt"
	"io"
	"runtime"
)

// The commands that work on the kernel's side of an interface (its XDP
// program, its packet sockets) are Linux's; elsewhere they say so.
func init() {
	register("link", command{
		summary: "attach, detach and show the XDP steering program (Linux only)",
		run:     notSupported("link", "the XDP steering program needs Linux (eBPF, AF_XDP)"),
	})
	register("capture", command{
		summary: "capture RoCEv2 frames of an interface to a pcap file (Linux only)",
		run:     notSupported("capture", "capturing needs Linux (AF_PACKET sockets)"),
	})
}

// notSupported is the run function of a command this system lacks: one
// line naming what it needs, and exit status 1.
func notSupported(name, need string) func([]string, io.Writer, io.Writer) int {
	return func(_ []string, _, stderr io.Writer) int {
		fmt.Fprintf(stderr, "rocectl %s: not supported on %s: %s\n", name, runtime.GOOS, need)
		return 1
	}
}
