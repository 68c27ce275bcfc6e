// Package bench measures raw frame throughput of the packet links between
// two network namespaces joined by a veth pair: the AF_XDP link (xdplink)
// and the kernel UDP link (udplink), at 64 B, 1 KiB, 2 KiB and 4 KiB
// Ethernet frames.
//
// The receiver always runs in its own process (the test binary re-executed
// inside the receiving namespace), so sender and receiver each have a CPU.
// The table runner also runs the sender as a separate process; the Go
// benchmarks send from the benchmark goroutine. See README.md for the
// commands. Everything needs root (namespaces, veth, XDP).
package bench
