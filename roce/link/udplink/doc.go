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
// batches with sendmmsg(2)/recvmmsg(2).
//
// The kernel, not the transport, builds the outgoing headers, which is why
// Info reports FixedSourcePort (every datagram leaves from the bound port)
// and IPIDZero (the socket is unconnected and sets DF, so Linux sends
// IPv4 ID 0): the transport must compute the ICRC with those values for a
// hardware or rxe peer to accept it.
package udplink
