// Package xdplink moves Ethernet frames through an AF_XDP socket: the
// steering program (package bpf) redirects RoCEv2 traffic of one receive
// queue into the socket, everything else goes on to the kernel stack.
//
// Options.Queues takes over several receive queues, a socket each, where
// the NIC's flow steering (RSS over the UDP source port, which a device
// varies per QP) spreads the flows. RxQueues gives a view of each socket
// (link.MultiQueue), so that a device reads every queue from a goroutine
// of its own. Each view also sends on its own socket (TxQueues,
// link.TxQueues), with the socket's TX ring, completion ring and TX chunks
// under a lock of its own, so goroutines sending through different views
// never wait for each other; a device sends each transmit shard through
// one. The link's own WriteBatch sends on the first queue's socket. Stats
// counts the frames each socket sent.
//
// Received frames are handed out as views into the UMEM, valid only during
// the ReadBatch callback; a frame that arrived in several chunks
// (multi-buffer) is assembled into link-owned memory first. Transmitted
// frames are copied into the UMEM before WriteBatch returns.
package xdplink
