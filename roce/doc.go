// Package roce is the goroce RoCEv2 device: one port over one link, with a
// verbs-shaped API (Device → PD → MR, CQ, QP, AH, SRQ) on top of the transport
// engine (internal/qp). This package is goroce's one verbs API: the engine is
// internal, and every type, constant and error of it a caller needs has a
// name here.
//
// # Opening a device
//
// A device runs over the link.Link it is given: OpenLink takes an open link
// and owns it from then on, as gVisor's stack takes its link endpoints and
// wireguard-go's device its tun.Device and conn.Bind. Package memlink gives
// an in-memory pair for tests and simulations; package netdev opens a device
// on a network interface by name (AF_XDP, falling back to a kernel UDP
// socket). This package imports no link implementation, so it builds on any
// system and a program that brings its own link does not link eBPF code.
//
// Options.Host ties a device to a network interface: its addresses make the
// GID table, its MTU and carrier the port, and its neighbour table resolves
// MAC addresses. The device asks no operating system itself: package netdev
// implements Host over rtnetlink and passes it in (netdev.Open,
// netdev.OpenLink), as wireguard-go's tun.Device reports its events to the
// device. Without a Host the GID table is Options.Addrs and MAC addresses
// come from Options.Neighbours.
//
// The GID table is built like the kernel's for rxe: index 0 is the default
// GID fe80::EUI-64(MAC), followed by one RoCEv2 GID per interface address
// (IPv4 as ::ffff:a.b.c.d, then IPv6). The Host's address reports keep it
// current; an address that stays keeps its index, a new one takes the lowest
// free index. The port's active MTU is rxe's (the largest IB MTU not above
// the netdev MTU − 80) and follows MTU changes of the interface, as the port
// state follows its operational state. QP.Modify refuses a path MTU whose
// packets the link cannot carry (ErrMTU). Received frames must be addressed to
// a GID in the table (rxe_chk_dgid); frames to the device's own GIDs are
// delivered internally without touching the link (rxe_loopback).
//
// Destination MAC addresses come from Options.Neighbours, else from the
// Host (netdev's: the kernel's neighbour table, which it asks to resolve a
// missing entry with RTM_NEWNEIGH and NTF_USE, or a throwaway datagram). The
// device waits for a resolution bounded by the caller's context: in QP.Modify with an address vector, PD.CreateAH and
// Device.ResolveNeighbour. The data path only looks the result up, so a send
// to an unresolved destination is dropped and counted (no_neighbour) rather
// than blocking. The Host's neighbour reports move cached entries when the
// host learns a new MAC for a next hop in use. Devices without an interface
// (OpenLink with a memory link) use Options.Neighbours.
//
// # Goroutines and locking
//
// A device runs three goroutines (plus its Host's: netdev's runs one per
// netlink subscription, addresses, link, neighbours), and one more per
// extra receive queue of its link: the deferred-ACK goroutine,
// which sends a transmit pass a poller or a corked post left to its caller
// if the caller does not come back within 20 µs (see below), and these two:
//
//   - the receive goroutine, one per receive queue of a link.MultiQueue
//     (the kernel UDP link with udplink.Options.Queues, the AF_XDP link
//     with several queues), which the link fills so that a QP's packets
//     always arrive on one queue, in order; a waiter that polls the link
//     polls every queue. Each: link.ReadBatch → ib's header walk
//     (ib.EncapParser: Ethernet, IPv4/IPv6, UDP) → ib.ParseDCIB of the IB
//     headers → ICRC check (skipped
//     where the link cannot know every header field it covers,
//     Info.UncheckedICRC: the kernel UDP link over IPv4) → destination GID
//     check → Engine.Receive for the whole batch under one lock acquisition,
//     then a transmit pass;
//   - the timer goroutine: Engine.Advance with the real monotonic clock at the
//     engine's next deadline, then a transmit pass. It sleeps until that
//     deadline, with no periodic tick; a receive or transmit that arms an
//     earlier timer kicks it (Engine.TakeArmed, O(1)), and with nothing
//     unacknowledged it does not wake at all.
//
// A transmit pass also follows every PostSend and Modify. It runs in the
// calling goroutine: Engine.Transmit into pooled slots with headroom, the
// Ethernet/IP/UDP headers prepended in place, the ICRC computed, then one
// link.WriteBatch per batch. On a link that lends its transmit buffers
// (link.TxLender: the UMEM of the AF_XDP link) the slots are those
// buffers, so a payload is copied once, from the MR to where the frame is
// sent from. Only one goroutine transmits for a shard at a time; a caller
// that finds a pass under way leaves a note and the running pass goes round
// again, so no work is stranded and no caller waits for another's I/O. A
// device has one transmit shard unless Options.Shards asks for more: QP n
// belongs to shard n mod Shards, the engine queues the QPs with packets to
// send per shard, and each shard has its own pass, lock and buffers, so
// QPs of different shards build and send their frames on different CPUs at
// once (the kernel UDP link keeps several send states for that; the AF_XDP
// link with several queues has a socket per queue, each with its own TX
// ring and lock, and shard k sends through queue k mod their number,
// link.TxQueues). A QP's packets come from its shard's pass alone and
// leave in order, by one queue. A goroutine that finds several shards
// with packets and none of them busy sends them in one pass and one link
// write, if they send through the same queue. A
// poller that reads the packet completing its caller's wait leaves the
// pass (typically the ACK of that packet) to the caller's next verb, so the
// ACK and the caller's reply leave in one batch; a timer sends it if the
// caller does not come back within 20 µs, and QP.Modify, QP.Close and
// Device.Close send it first. A post corks the same way when a pass ended
// less than Options.TxCork (2 µs) before it: a stream of posts from one
// goroutine then leaves at its next poll or wait in a few link writes,
// while a post after a pause, as a latency test makes, transmits at once.
//
// All engine state (QPs, SRQs, MRs, the CQs' bookkeeping) is behind one
// mutex, so every method of every object is safe for concurrent use. The
// passes hold it only while the engine runs: the frame headers, the ICRC
// and the link's system calls run outside it. A CQ's ring has a lock of its
// own, which CQ.Poll takes instead of the device's, so a consumer taking
// completions does not wait for a receive batch or another QP's post, and
// so has a QP's receive queue, which QP.PostRecv takes instead (a QP in
// the error state, whose receives complete at once, still takes the
// device lock). So has its send queue: QP.PostSend and PostSendBatch post
// a simple work request (RC or UC, in RTS, no memory window or local
// invalidation) under it and queue the QP for its shard's next transmit
// pass without the device lock; the engine takes the posts when the pass
// reaches the QP, and a state change takes them first, so each is sent or
// flushed. Anything else, or a queue that looks full, takes the device
// lock. The completions of QPs of every shard go into one CQ in the order
// the engine made them. The GID table and the neighbour cache are copy-on-write
// snapshots read without a lock. The data path allocates nothing per
// packet.
//
// # Completions and waiting
//
// Completion queues are filled by those goroutines. CQ.Poll takes
// completions without blocking. CQ.Wait (bounded by a context) and
// CQ.WaitDeadline (bounded by a time, for net.Conn-style deadlines) block
// until the CQ holds a completion; any number of goroutines may Poll and
// Wait on one CQ, and on the many CQs of one device, at once. A waiter
// queues itself on its CQ's FIFO of parked goroutines and then looks at the
// completion count; the completion path raises the count and then wakes the
// longest waiting entry, one per completion. So no wake-up is lost, and as
// many goroutines wake as there are completions, not all of them. A waiter
// whose completion another goroutine took parks again. Before it parks, a
// waiter busy-polls for Options.BusyPoll (see below); further waiters park
// at once rather than spin on shared CPUs. Parked
// waiters are recycled entries with their own channel and timer, so waiting
// allocates nothing. CQ.Ready is a one-value channel for select loops over
// several CQs: a value goes to one receiver, which polls the CQ empty.
//
// Every blocking wait of the device goes through one function,
// Device.park: "wait for progress on this object, bounded by a context or
// a deadline".
//
// # Run to completion
//
// On a link that can be read without blocking (link.Poller: the AF_XDP,
// kernel UDP and memory links), the goroutine that waits does the device's
// work: CQ.Wait and WaitDeadline first take the device's poller role and,
// for the busy-poll window (Options.BusyPoll, default 50µs), read the link
// without blocking, run the engine on what arrived and transmit what that
// produced, until their CQ holds a completion; CQ.Poll on an empty CQ does
// one such round. A reply that arrives within the window thus costs no
// goroutine wake-up, which is what ping-pong latency is made of. One
// goroutine polls a device at a time; other waiters park at once, and the
// poller's engine runs wake them, one per completion, as before. When the
// window passes, the waiter hands the link back to the receive goroutine
// and parks. The receive goroutine remains for progress nobody waits on: it
// stands by while waiters poll and for a short linger after a poll that
// found work, and otherwise sleeps until the link is readable. Busy polling
// happens only while a goroutine waits, and only for the window, so an idle
// device uses no CPU. Callers of Wait, WaitDeadline and the protocol calls
// built on them do not change.
//
// # Asynchronous events
//
// The device raises the asynchronous events of ibv_get_async_event under
// its lock on the data path, so raising one never blocks and never
// allocates: QP_FATAL (or QP_REQ_ERR, QP_ACCESS_ERR) when the device moves a
// QP to the error state (retry or RNR retry exhaustion, a NAK, a local
// protection error, a lost completion), LAST_WQE_REACHED for SRQ-attached
// QPs, SRQ_LIMIT_REACHED (SRQ.ArmLimit), CQ_ERR, and PORT_ACTIVE/PORT_ERR
// when the interface's operational state changes. Each QP records its
// failure: QP.Err returns a *QPError with the failing completion's status,
// and QP.Failed is a channel closed at that moment, so a connection's owner
// can select on it. Device.SubscribeEvents (or Device.Events) serves any
// number of subscribers, each with its own buffer; a full buffer loses the
// event and EventSub.Lost counts it.
//
// # Memory
//
// Memory regions are registered over caller []byte, and the engine reads and
// writes them directly, so RDMA READ and WRITE land in the caller's buffers
// and receives are zero-copy. RecvSlab keeps a slab of fixed-size receive
// buffers posted and hands completed ones back in place: Repost and
// RepostBatch return buffers from any goroutine, and RecvSlab.Frame claims
// a received buffer as a Frame, a small value that another goroutine reads
// and Releases exactly once (a second release is ErrFrameReleased).
//
// # Options
//
// One rule holds for every constructor of the module that takes settings
// (OpenLink, netdev.Open, memlink.PairWithOptions, udplink.ListenOptions,
// xdplink.Open, cm.Dial, cm.Listen, cm.NewManager, Request.Accept,
// qptest.NewNet, ...): the settings are an Options (or Config) struct
// passed by value, and its zero value, like each zero field, means the
// default. So cm.Dial(ctx, dev, addr, cm.DialOptions{}) dials with the
// defaults; there is no nil case. Verb attributes that mirror ibverbs
// structs the caller fills in (QPInitAttr, QPAttr, ConnectAttr) are
// arguments, not options, and go by pointer as in libibverbs.
//
// # Closing
//
// One rule holds for every closeable object of the module (Device, PD, MR,
// CQ, SRQ, AH, QP, RecvSlab, EventSub; the links; cm's Manager, Listener
// and Conn): Close releases it, a second Close returns ErrClosed, and
// every other call on a closed object (or on an object of a closed
// device) fails with ErrClosed, as with an os.File or a net.Conn. Each
// package has its own ErrClosed with its own message (roce.ErrClosed,
// qp.ErrClosed, link.ErrClosed, cm.ErrClosed, ...), and they are one
// error under errors.Is: each matches all the others and net.ErrClosed.
// So a caller tests against whichever it knows, or net.ErrClosed as for
// a socket, whatever layer the error came from. Methods of this package
// report a closed engine object as roce.ErrClosed. Closing what holds
// nothing of the device's (a cm.Manager whose device closed) succeeds.
//
// # Wire details
//
// Each QP sends from rxe's UDP source port (0xC000 | hash of the QPN) unless
// its address vector names one or the link fixes it (kernel UDP link). The
// address vector's traffic class becomes the IPv4 TOS / IPv6 traffic class
// byte (DSCP<<2 | ECN) and its hop limit the TTL (0 means 64).
//
// Options.Capture writes a classic pcap stream of every frame sent and
// received. Device.Counters reports rxe's hw_counters plus the device's own;
// package rocemetrics exports them to Prometheus.
package roce
