// Package udplink is the kernel UDP link: RoCEv2 over an ordinary UDP
// socket, with no root, no XDP and no special NIC, on loopback as between
// hosts. It is the default link of an embedded device.
//
// The transport above speaks whole Ethernet frames (see package link); this
// link strips them to the UDP payload (BTH ... ICRC) on send and, on
// receive, synthesizes an Ethernet + IP + UDP header in front of each
// datagram from what recvmsg reports (source from the sender address,
// destination and TOS/traffic class from IP_PKTINFO/IP_RECVTOS and their
// IPv6 equivalents; IPv4 ID 0, DF, TTL 64; real ports). Datagrams move in
// batches with sendmmsg(2)/recvmmsg(2). One goroutine reads at a time;
// WriteBatch has several send states, so goroutines that write at once
// (the transmit shards of a device) make their sendmmsg calls at once,
// each call's datagrams in order.
//
// With UDP segmentation offload (UDP_SEGMENT, Linux 4.18) a run of
// consecutive frames of one WriteBatch to one destination, all of one
// size but the last, which may be shorter, leaves as one sendmmsg entry
// whose iovecs are the frames' payloads; the kernel cuts it exactly at
// the datagrams, so the ICRC the transport computed over each still
// holds. IPv4 runs go only to local destinations: the kernel gives the
// segments of a cut run IPv4 IDs 0, 1, 2, ..., which a peer checking the
// ICRC over the wire header would refuse. With UDP_GRO (Linux 5.0) the
// kernel hands over a run it kept whole (loopback, veth) or coalesced as
// one buffer, which the link splits into one frame per datagram, each
// with its own synthesized header. Both are probed when the link opens
// and are off on kernels without them; Options.DisableGSO and DisableGRO
// turn them off, and a run the kernel refuses at send time is resent one
// datagram at a time and GSO turned off (Stats counts all of it).
//
// Receive queues (Options.Queues, Linux): several sockets of one
// SO_REUSEPORT group on the link's address and port, among which a classic
// BPF program steers each datagram by the destination QPN of its BTH, so
// that a device reads every queue from a goroutine of its own
// (link.MultiQueue) and each QP's packets stay on one queue, in order. A
// GSO run never joins two QPs' datagrams, and such a link leaves GRO off:
// either would put one QP's datagrams on another's queue.
//
// ECN: a frame's TOS or traffic class leaves as an IP_TOS / IPV6_TCLASS
// control message unless it is the socket's own, which a device with
// congestion control on sets to ECT(0) once (SetDefaultTOS), so its data
// packets cost nothing more. A received datagram's TOS, CE marks
// included, comes from IP_RECVTOS / IPV6_RECVTCLASS into the synthesized
// header, where the device's notification point reads it as in an AF_XDP
// frame. One coalesced GRO buffer has one TOS message, which is right for
// all its datagrams: GRO coalesces only datagrams whose IP headers agree
// in everything but length and checksum, TOS and traffic class included
// (Linux's inet_gro_flush and ipv6_gro_flush, which
// udp_gro_receive_segment calls; older kernels check the same in
// inet_gro_receive and ipv6_gro_receive), so a CE-marked datagram ends the
// run it would have joined, as the DCQCN test over veth with GRO on
// (internal/ecnmark) shows; and a
// run a local sender kept whole left with one TOS for all its segments,
// which a marking hop marks or leaves whole too.
//
// The kernel, not the transport, builds the outgoing headers, which is why
// Info reports FixedSourcePort (every datagram leaves from the bound port)
// and IPIDZero (the socket is unconnected and sets DF, so Linux sends
// IPv4 ID 0): the transport must compute the ICRC with those values for a
// hardware or rxe peer to accept it.
//
// Off Linux, Link is PlainLink: the same frames over net.UDPConn, one
// datagram per system call, no GSO/GRO, and the destination of a datagram
// on a wildcard address from golang.org/x/net's control messages (not on
// windows, where the link must be bound to a specific address). On Linux,
// ListenPlain opens one, so that it is tested here too.
package udplink
