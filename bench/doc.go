// Package bench measures the stack between two network namespaces joined
// by a veth pair.
//
// TestLinkTable measures raw frame throughput of the packet links: the
// AF_XDP link (xdplink) and the kernel UDP link (udplink), at 64 B, 1 KiB,
// 2 KiB and 4 KiB Ethernet frames. The receiver always runs in its own
// process (the test binary re-executed inside the receiving namespace), so
// sender and receiver each have a CPU; the table runner also runs the
// sender as a separate process, the Go benchmarks send from the benchmark
// goroutine.
//
// TestTransportTable measures goroce against goroce: rocectl perf
// write-bw (64 KiB) and send-lat (8 B), each end a separate process in its
// namespace, over the AF_XDP and the kernel UDP link, and prints them in
// one table beside figures taken in the same run on the same kind of
// veth: the raw link ceiling at the size of a full-MTU RoCE packet, kernel
// TCP and UDP throughput (iperf3) and kernel UDP latency (sockperf). An RC
// ping-pong of 64 KiB messages checks the bytes that cross.
//
// TestLoopbackTable measures the main job, rocectl perf --loopback, beside
// iperf3 TCP and sockperf on loopback.
//
// TestScaleTable measures the scale-out over QPs and CPUs on loopback:
// send-bw 64 B over 8 QPs at GOMAXPROCS 1 and 2, write-bw over 2 QPs
// against iperf3 TCP, and send-lat over one QP.
//
// TestGoalsTable measures every performance goal in one run by taking the
// cases of the tables above and of the loss benchmarks in turns, adds the
// allocations, CPU time per packet and idle cost measured in its own
// process, and prints goal, figure, baseline, ratio, target and met.
//
// See README.md for the commands. Everything needs root (namespaces, veth,
// XDP).
package bench
