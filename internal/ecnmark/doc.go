// Package ecnmark is a congested switch port for tests: a tc BPF program
// at the egress of an interface that sets CE in the IP header of every
// Nth ECN-capable IPv4 or IPv6 packet to a UDP port (RoCEv2's, 4791, by
// default), mending the IPv4 header checksum with bpf_l3_csum_replace, and
// leaves Not-ECT packets alone, as an ECN-marking switch does. It counts
// what it saw, so a test can compare the marks it made with the CE-marked
// packets a receiver counted and the CNPs that came back.
//
// The program is attached with TCX (Linux 6.6) or, on older kernels, as
// a direct-action filter of a clsact qdisc (Linux 4.5). Only packets
// without IPv4 options or IPv6 extension headers are looked at; a GSO
// packet (a run of UDP datagrams the kernel has not cut yet) is one
// packet here, and all its datagrams carry the mark.
package ecnmark
