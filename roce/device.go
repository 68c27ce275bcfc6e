package roce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
)

// Options configure a Device. Every field has a working zero value; package
// netdev fills in Interface and Fallback when it opens a device on a network
// interface.
type Options struct {
	// Port is the UDP destination port of every sent packet (default
	// 4791); package netdev also binds the kernel UDP link to it. Only
	// tests and private deployments change it.
	Port uint16

	// Interface names the network interface the device runs on, for
	// DeviceInfo.Name and logs (package netdev sets it).
	Interface string
	// Host, if set, follows that interface: its addresses make the GID
	// table (after Addrs), its MTU and carrier the port, and it resolves
	// neighbours missing from Neighbours. Package netdev sets it; the
	// device owns it once OpenLink succeeds. Without Host, the GID table is
	// Addrs and neighbours come from Neighbours only.
	Host Host
	// Addrs are static IP addresses for the GID table, until Host reports
	// the interface's.
	Addrs []netip.Addr
	// Neighbours are static IP → MAC entries consulted before Host.
	Neighbours map[netip.Addr]net.HardwareAddr

	// Capture, if set, receives a classic pcap stream (Ethernet link type)
	// of every frame the device sends and receives. Writes happen on the
	// data path under a lock: use a buffered writer.
	Capture io.Writer
	// Logger receives device events (fallback, address changes, link
	// errors). Default slog.Default().
	Logger *slog.Logger
	// TxBatch is the number of packets built per link write (default 32).
	TxBatch int
	// BusyPoll is how long a goroutine waiting for a completion (CQ.Wait,
	// WaitDeadline, and the protocol calls built on them) polls before it
	// parks (default 50µs; negative: park at once). On a link that can be
	// read without blocking (link.Poller: the AF_XDP, kernel UDP and memory
	// links) the waiter reads the link itself, runs the engine and
	// transmits during the window, so a reply that comes within it costs
	// no goroutine wake-up; one waiter per device polls, the others park.
	// On other links the first waiter of a CQ watches its CQ.
	BusyPoll time.Duration
	// AckWithReply lets the ACK of a message that a waiter's poll read,
	// and that completed its wait, leave with whatever the waiter posts
	// next (one link write, on AF_XDP one sendto, for both; at most 20 µs
	// later). Off by default: a hardware responder acknowledges at once,
	// and a peer that expects the completion of its request before that
	// of the reply fails otherwise. rxe's completer and responder run
	// apart, so an ACK and a reply that arrive together can complete in
	// either order, which the NAAICE C host takes as an error.
	AckWithReply bool
	// TxCork lets a post that comes within TxCork of the end of the
	// device's last transmit pass leave its packets to the poster's next
	// CQ poll or wait (at most 20 µs later, if it does neither), as Linux
	// TCP corks a socket whose previous segment is still on its way: a
	// stream of posts then goes in a few link writes (GSO sends on the
	// kernel UDP link) instead of one per post, while a post after a
	// pause, as in a latency test, transmits at once. Default 2 µs
	// (64-byte send-bw, 8 QPs, loopback: 3.3× the message rate, latency
	// unchanged; bench/README.md); negative: every post transmits at once.
	TxCork time.Duration
	// RxSleep makes the receive goroutine wait for the kernel UDP link in
	// a system call that blocks its thread (ppoll) rather than in the
	// runtime's network poller, and look at the link again for the
	// busy-poll window after frames came before it does. A goroutine
	// parked in the network poller is woken only when a thread polls the
	// network, which no P does while every P has goroutines to run (CQ
	// pollers that spin and yield), leaving sysmon's 10 ms poll: a
	// device nobody waits on (the target of RDMA WRITEs) then answers late
	// and its peer probes. Off by default: on a loaded 2-CPU host it
	// halved the mean latency tail and cut resends of two-QP streams by a
	// third, but one-QP streams lost bandwidth (see bench/README.md).
	RxSleep bool
	// CQSpin is the former name of BusyPoll, used when BusyPoll is 0.
	//
	// Deprecated: use BusyPoll.
	CQSpin time.Duration
	// CC turns on congestion control (DCQCN: ECN marking, CNPs, per-QP
	// rate limits; see CCConfig). Off by default.
	CC CCConfig
	// Shards is the number of transmit shards (default 1, at most 64). A
	// QP belongs to shard QPN mod Shards, and each shard runs its own
	// transmit pass, with its own buffers, so that QPs of different
	// shards build and send their packets on different CPUs at once, the
	// link's system calls included; a QP's packets still leave in order,
	// from its shard's pass. One shard is one transmit pass for the
	// device: a goroutine that finds it running leaves its packets to it,
	// which then go in one link write (one GSO send on the kernel UDP
	// link). That batching beat parallel passes on a loaded 2-CPU host
	// (bench/README.md, "Two CPUs for one device"), so more shards are for links
	// and hosts where the system call, not its count, is the cost. On a
	// link whose queues send apart (link.TxQueues: the AF_XDP link with
	// several queues), shard k sends through queue k mod their number, so
	// with as many shards as queues each shard has a socket to itself.
	Shards int
	// DSCP (0..63) is the DSCP of packets whose QP or address handle
	// gives none (a traffic class below 4, as ConnectAttr's zero value):
	// RoCE data usually travels in a class of its own, such as 26 (AF31)
	// on lossless fabrics. 0 leaves them best effort. A QP's own DSCP
	// wins, and CNPs take DCQCNParams.CNPDSCP.
	DSCP uint8
	// Fallback, if set, says why the link is not the one the caller asked
	// for first (package netdev: why AF_XDP was not used). The device only
	// reports it, in Info().Fallback.
	Fallback string
}

// DeviceInfo describes an open device.
type DeviceInfo struct {
	Name         string // Options.Interface, or the link's name
	Link         link.Info
	HardwareAddr net.HardwareAddr
	NodeGUID     uint64 // EUI-64 of the MAC, as rxe
	NetdevMTU    int    // IP MTU of the link
	// Fallback is Options.Fallback: why AF_XDP was not used when
	// netdev.Open fell back to the kernel UDP link ("" otherwise).
	Fallback string
	// LastSendError is a recent reason the link refused a frame (recorded
	// when send_err reaches a power of two), or "".
	LastSendError string
}

// PortState is the state of the device's single port (ibv_port_state).
type PortState uint8

// Port states.
const (
	PortDown   PortState = 1
	PortActive PortState = 4
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "DOWN"
	case PortActive:
		return "ACTIVE"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// PortAttr are the attributes of port 1 (struct ibv_port_attr, the fields
// that mean something on RoCE).
type PortAttr struct {
	State        PortState
	MaxMTU       ib.MTU // 4096, as rxe
	ActiveMTU    ib.MTU // largest IB MTU ≤ netdev MTU − 80
	GIDTableLen  int
	PKeyTableLen int
	MaxMsgSize   uint32
	NetdevMTU    int
	LinkLayer    string // "Ethernet"
}

// Device is a RoCEv2 device: one port over one link, with the verbs objects
// of one transport engine. All methods are safe for concurrent use.
type Device struct {
	link   link.Link
	linfo  link.Info
	opts   Options
	log    *slog.Logger
	mac    [6]byte
	info   DeviceInfo
	start  time.Time
	port   uint16       // UDP destination port
	dscp   uint8        // Options.DSCP<<2, for packets whose traffic class has none
	netMTU atomic.Int64 // IP MTU of the link (follows the interface)
	portUp atomic.Bool  // interface operationally up (or no interface)

	// mu guards the engine and every engine object but the CQs' rings
	// (qp.CQ has a lock of its own, which CQ.Poll takes instead) and the
	// posts of simple work requests, which take the QP's queue's lock
	// instead (qp.QP.PostSendConcurrent, PostRecvConcurrent).
	mu sync.Mutex
	// polled is raised by CQ.Poll when it takes completions and read by
	// the receive and transmit passes under mu before the engine touches
	// memory regions: the edge in the memory model that orders a
	// consumer's accesses before a completion was taken before the
	// device's later accesses to the same memory, which CQ.Poll gave when
	// it took mu (MR.Sync). It never waits, unlike mu. A post that does
	// not take mu has its own edge: the engine reads a work request, and
	// the memory it names, after loading the tail the poster published.
	polled atomic.Uint64
	eng    *qp.Engine
	clock  monoClock // the engine's; guarded by mu

	gids  atomic.Pointer[gidTable]
	neigh *neighbours
	ctr   counters
	res   Resources // live verbs objects, guarded by mu
	tap   atomic.Pointer[pcapTap]

	// Transmit: one pass per shard (Options.Shards), each with its own
	// buffers.
	shards    []txShard
	wakeAt    atomic.Int64 // when the timer goroutine will next wake
	timer     *wakeTimer   // the timer goroutine's; set by rearm
	timerMu   sync.Mutex   // serialises rearm's system calls on timer
	lastTxErr atomic.Pointer[string]
	deferred  atomic.Bool  // a poller left a transmit pass to its caller (txdefer.go)
	deferT    *time.Timer  // flushes what was deferred if the caller does not
	lastTx    atomic.Int64 // when a transmit pass last ended (nowNs)
	corkNs    int64        // Options.TxCork (ns); 0: a post transmits at once

	// Receive: a goroutine per receive queue of the link (one, unless the
	// link is a link.MultiQueue).
	rxq []*rxQueue

	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	closed  atomic.Bool
	closeMu sync.Mutex
	extra   []io.Closer // Options.Host, owned by the device
	ev      events      // asynchronous event subscriptions, guarded by mu

	// Run to completion (poll.go).
	rxPoll         link.Poller   // the link, if it can be read without blocking (every queue can)
	rxSleep        sleepWaiter   // the link, if it can be waited on in a system call (every queue can)
	busyPollWindow time.Duration // Options.BusyPoll; ≤ 0: no busy poll
	ackWithReply   atomic.Bool   // Options.AckWithReply
	window         atomic.Int64  // the current busy-poll window (adapts; ns)
	rxAt           atomic.Int64  // when the receive goroutine last read frames (nowNs)
	rxLinger       time.Duration // stand-by of the receive goroutine after a poll that found work
	polling        atomic.Bool   // the poller role
	pollAt         atomic.Int64  // when a poll last found work (nowNs)
	parked         atomic.Int32  // goroutines in park
	pollPkt        rxState
	pollFn         func(frames [][]byte)
	pollEmpty      atomic.Uint32 // pollOnce calls that found nothing: when to yield
}

// txShard is one shard's transmit pass: mu owns its buffers, and pending
// asks the holder to go again.
type txShard struct {
	mu      sync.Mutex
	pending atomic.Bool
	slots   []qp.TxPacket
	frames  [][]byte
	ipID    uint16
	lend    txLend // frames built in the link's buffers (txlend.go)
	// link is what the shard sends through: the device's link, or on a
	// link.TxQueues one of its queues, shared by the shards in peers.
	link  link.Link
	peers uint64
	// Loopback: frames to one of our own GIDs never reach the link (as
	// rxe_loopback); the transmit pass delivers them.
	loop    [][]byte
	loopPkt rxState
	// looped says the last pass delivered frames locally, whose answers
	// may be queued on other shards.
	looped bool
	turn   uint     // the shard a pass of several starts at
	_      [64]byte // the next shard's lock on another cache line
}

// Headroom budget: Ethernet + VLAN + IPv6 + UDP, rounded up.
const (
	txHeadroom = 128
	txSlotSize = txHeadroom + 4096 + 256
)

// never is the timer goroutine's wake-up time when no timer is pending.
const never = time.Duration(1<<62 - 1)

// monoClock is the engine's clock: time since the device opened. While
// hold is set (under the engine lock, for one receive batch) it reads the
// time once and gives that to every packet of the batch: they all arrived
// before the batch was read, and a clock read per response packet was a
// measurable share of receiving.
type monoClock struct {
	start      time.Time
	hold, have bool
	held       time.Duration
}

func (c *monoClock) Now() time.Duration {
	if !c.hold {
		return time.Since(c.start)
	}
	if !c.have {
		c.held, c.have = time.Since(c.start), true
	}
	return c.held
}

// OpenLink opens a device over an open link: the in-memory pair of package
// memlink, an AF_XDP socket or a kernel UDP socket (netdev.Open picks one
// for an interface and calls OpenLink), or any other link.Link. The device
// owns the link, and opts.Host if set, and closes them; if OpenLink fails,
// the caller still owns both.
func OpenLink(l link.Link, opts Options) (*Device, error) {
	if l == nil {
		return nil, ErrInvalidConfig
	}
	return newDevice(l, opts)
}

func newDevice(l link.Link, opts Options) (*Device, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DSCP > 63 {
		return nil, fmt.Errorf("roce: Options.DSCP %d: not in 0..63: %w", opts.DSCP, qp.ErrInvalidArgument)
	}
	if opts.TxBatch <= 0 {
		opts.TxBatch = 32
	}
	if opts.Shards == 0 {
		opts.Shards = 1
	}
	if opts.Shards < 0 || opts.Shards > qp.MaxShards {
		return nil, fmt.Errorf("roce: Options.Shards %d: not in 1..%d: %w", opts.Shards, qp.MaxShards, qp.ErrInvalidArgument)
	}
	if opts.BusyPoll == 0 {
		opts.BusyPoll = opts.CQSpin
	}
	if opts.TxCork == 0 {
		opts.TxCork = defaultTxCork
	}
	if opts.BusyPoll == 0 {
		opts.BusyPoll = defaultBusyPoll
	}
	d := &Device{
		link:  l,
		linfo: l.Info(),
		opts:  opts,
		log:   opts.Logger,
		start: time.Now(),
		port:  opts.Port,
		dscp:  opts.DSCP << 2,

		busyPollWindow: opts.BusyPoll,
		corkNs:         int64(opts.TxCork),
		rxLinger:       min(max(4*opts.BusyPoll, minRxLinger), maxRxLinger),
	}
	d.initRxQueues(l, opts)
	d.pollAt.Store(-int64(d.rxLinger)) // no poll yet: nothing to stand by for
	d.window.Store(int64(opts.BusyPoll))
	d.ackWithReply.Store(opts.AckWithReply)
	d.deferT = time.NewTimer(time.Hour)
	d.deferT.Stop()
	if d.port == 0 {
		d.port = ib.RoCEv2Port
	}
	copy(d.mac[:], l.HardwareAddr())
	mtu := l.MTU()
	if mtu <= 0 {
		mtu = 1500
	}
	d.netMTU.Store(int64(mtu))
	d.portUp.Store(true)
	d.clock.start = d.start
	eng, err := qp.New(qp.Config{Clock: &d.clock, PortMTU: ib.ActiveMTU(mtu), CC: opts.CC, Shards: opts.Shards})
	if err != nil {
		return nil, err
	}
	d.eng = eng
	d.setDefaultTOS()
	d.initEvents()
	d.info = DeviceInfo{
		Name:         d.linfo.Name,
		Link:         d.linfo,
		HardwareAddr: append(net.HardwareAddr(nil), d.mac[:]...),
		NodeGUID:     eui64(d.mac),
		NetdevMTU:    mtu,
		Fallback:     opts.Fallback,
	}
	if opts.Interface != "" {
		d.info.Name = opts.Interface
	}
	d.neigh = newNeighbours(opts.Neighbours, opts.Host, d.linfo.Synthetic)
	if err := d.setGIDTable(buildGIDTable(nil, d.mac, d.servedAddrs(opts.Addrs))); err != nil {
		return nil, err
	}
	if opts.Capture != nil {
		tap, err := newPcapTap(opts.Capture)
		if err != nil {
			return nil, err
		}
		d.tap.Store(tap)
	}
	d.shards = make([]txShard, opts.Shards)
	txq := txQueues(l)
	for k := range d.shards {
		s := &d.shards[k]
		s.link = txq[k%len(txq)]
		for j := k % len(txq); j < len(d.shards); j += len(txq) {
			s.peers |= 1 << j
		}
		s.slots = make([]qp.TxPacket, opts.TxBatch)
		s.frames = make([][]byte, opts.TxBatch)
		s.loop = make([][]byte, 0, opts.TxBatch)
		// IP IDs only tell fragments apart, and every frame leaves with
		// DF set: the shards count apart from spread starting points.
		s.ipID = uint16(k * (1 << 16) / opts.Shards)
		slab := make([]byte, opts.TxBatch*txSlotSize)
		for i := range s.slots {
			s.slots[i].Buf = slab[i*txSlotSize : (i+1)*txSlotSize : (i+1)*txSlotSize]
			s.slots[i].Headroom = txHeadroom
		}
		s.lend.init(s.link, opts.TxBatch)
	}
	d.pollFn = func(frames [][]byte) {
		d.ctr.polledPkts.Add(uint64(len(frames)))
		d.receiveBatch(frames, &d.pollPkt)
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if opts.Host != nil {
		if err := opts.Host.Follow(d.ctx, hostEvents{d}); err != nil {
			d.cancel()
			return nil, err
		}
		d.extra = append(d.extra, opts.Host)
	}
	d.timer = newWakeTimer(d.ctx)
	d.wakeAt.Store(int64(never))
	d.wg.Add(2 + len(d.rxq))
	for _, q := range d.rxq {
		go d.receiveLoop(q)
	}
	go d.timerLoop()
	go d.deferLoop()
	return d, nil
}

// txQueues returns the links the transmit shards send through: the queues
// of a link.TxQueues, each sending on its own (shard k on queue k mod
// their number, so that with as many shards as queues no two shards share
// a queue's lock or ring), else l alone.
func txQueues(l link.Link) []link.Link {
	if tq, ok := l.(link.TxQueues); ok {
		if qs := tq.TxQueues(); len(qs) > 1 {
			return qs
		}
	}
	return []link.Link{l}
}

// eui64 returns the EUI-64 of a MAC (the universal/local bit flipped), as a
// big-endian number.
func eui64(mac [6]byte) uint64 {
	b := [8]byte{mac[0] ^ 2, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]}
	var v uint64
	for _, x := range b {
		v = v<<8 | uint64(x)
	}
	return v
}

// Info describes the device.
func (d *Device) Info() DeviceInfo {
	i := d.info
	i.NetdevMTU = int(d.netMTU.Load())
	if e := d.lastTxErr.Load(); e != nil {
		i.LastSendError = *e
	}
	i.HardwareAddr = append(net.HardwareAddr(nil), i.HardwareAddr...)
	return i
}

// Link returns the link the device runs over.
func (d *Device) Link() link.Link { return d.link }

// QueryPort returns the attributes of port 1.
func (d *Device) QueryPort() PortAttr {
	st := PortActive
	if d.closed.Load() || !d.portUp.Load() {
		st = PortDown
	}
	return PortAttr{
		State:        st,
		MaxMTU:       ib.MTU4096,
		ActiveMTU:    d.activeMTU(),
		GIDTableLen:  gidTableLen,
		PKeyTableLen: 1,
		MaxMsgSize:   qp.MaxMsgSize,
		NetdevMTU:    int(d.netMTU.Load()),
		LinkLayer:    "Ethernet",
	}
}

// Close stops the device's goroutines and closes the link. Objects still
// open become unusable (their methods return ErrClosed).
func (d *Device) Close() error {
	// An ACK a poller left to its caller (txdefer.go) leaves first.
	d.flushDeferred()
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed.Swap(true) {
		return ErrClosed
	}
	d.cancel()
	err := d.link.Close()
	d.wg.Wait()
	d.closeEvents()
	for _, c := range d.extra {
		c.Close()
	}
	if tap := d.tap.Load(); tap != nil {
		tap.flush()
	}
	return err
}

// lock takes the engine lock unless the device is closed.
func (d *Device) lock() error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// rxQueue is one receive queue of the link and its goroutine's state.
type rxQueue struct {
	link  link.Link
	poll  link.Poller // the queue, if the device polls (d.rxPoll set)
	sleep sleepWaiter // the queue, if the device sleeps in a system call (d.rxSleep set)
	pkt   rxState
	fn    func(frames [][]byte)
	kick  chan struct{} // the goroutine must read the queue
	timer *time.Timer   // its stand-by timer
}

// initRxQueues sets up the receive queues of l: every queue of a
// link.MultiQueue, else l. The device polls (run to completion) only if
// every queue can be polled, and sleeps in a system call only if every
// queue can.
func (d *Device) initRxQueues(l link.Link, opts Options) {
	links := []link.Link{l}
	if mq, ok := l.(link.MultiQueue); ok {
		if qs := mq.RxQueues(); len(qs) > 0 {
			links = qs
		}
	}
	polls, sleeps := opts.BusyPoll > 0, opts.RxSleep
	for _, ql := range links {
		q := &rxQueue{link: ql, kick: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
		q.timer.Stop()
		q.poll, _ = ql.(link.Poller)
		q.sleep, _ = ql.(sleepWaiter)
		polls = polls && q.poll != nil
		sleeps = sleeps && q.sleep != nil
		q.fn = func(frames [][]byte) { d.receiveBatch(frames, &q.pkt) }
		d.rxq = append(d.rxq, q)
	}
	for _, q := range d.rxq {
		if !polls {
			q.poll = nil
		}
		if !polls || !sleeps {
			q.sleep = nil
		}
	}
	if polls {
		d.rxPoll = d.rxq[0].poll
		if sleeps {
			d.rxSleep = d.rxq[0].sleep
		}
	}
}

// pollQueues is a poller's non-blocking read of every receive queue, each
// batch handed to the engine through d.pollFn. It returns how many frames
// it read and the first error.
func (d *Device) pollQueues() (int, error) {
	if len(d.rxq) == 1 {
		return d.rxPoll.PollBatch(d.pollFn)
	}
	total := 0
	var first error
	for _, q := range d.rxq {
		n, err := q.poll.PollBatch(d.pollFn)
		total += n
		if err != nil && first == nil {
			first = err
		}
	}
	return total, first
}

// receiveLoop is the receive goroutine of queue q.
func (d *Device) receiveLoop(q *rxQueue) {
	defer d.wg.Done()
	for {
		var err error
		if q.poll != nil {
			// Run to completion (poll.go): stay out of the way of
			// waiters that poll the link, and never hold the link
			// while asleep.
			if !d.rxStandBy(q) {
				return
			}
			var n int
			if n, err = q.poll.PollBatch(q.fn); n > 0 {
				d.rxAt.Store(d.nowNs())
				// Let a goroutine those frames woke run first: it sits
				// in this P's run queue, and the transmit pass and the
				// WaitReadable below are system calls that keep the P,
				// so it would wait for them, or for sysmon to retake
				// the P (up to milliseconds on an idle process). What
				// it posts then leaves with the ACKs in one pass.
				runtime.Gosched()
				d.flush()
				continue
			}
			if err == nil && q.sleep != nil && d.nowNs()-d.rxAt.Load() < int64(d.busyPollWindow) {
				// Frames came a moment ago and more are likely on the
				// way: look again after the others had the CPU rather
				// than sleep, as a waiter's busy poll does. A round trip
				// that nobody waits on (a WRITE's target spinning on
				// memory) then costs no thread wake-up.
				runtime.Gosched()
				continue
			}
			if err == nil {
				err = q.waitReadable()
				if err == nil {
					continue
				}
			}
		} else {
			// Background, not d.ctx: a cancellable context costs the
			// links an allocation per blocking read
			// (context.AfterFunc); Close unblocks the read by closing
			// the link instead.
			var n int
			if n, err = q.link.ReadBatch(context.Background(), q.fn); n > 0 {
				runtime.Gosched() // as above
			}
		}
		if err != nil {
			if d.ctx.Err() != nil || errors.Is(err, link.ErrClosed) {
				return
			}
			d.ctr.linkErr.Add(1)
			d.log.Warn("roce: link read failed", "err", err)
			select {
			case <-d.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		d.flush()
	}
}

// rxState is what one receiving context (the receive goroutine, a polling
// waiter, the loopback pass of a transmit) keeps from frame to frame.
type rxState struct {
	pkt   ib.Packet
	frame ib.EncapParser
	// src is the source of the frame the parser last walked whole; frames
	// that repeat its headers share it. dgidOK is whether its DGID was in
	// gids, the table it was looked up in.
	src    qp.Source
	gids   *gidTable
	dgidOK bool
}

// receiveBatch handles one batch of received frames: parse, check, and feed
// the engine under one lock acquisition.
func (d *Device) receiveBatch(frames [][]byte, rx *rxState) {
	gt := d.gids.Load()
	tap := d.tap.Load()
	p := &rx.pkt
	src := &rx.src
	locked := false
	// Counted once per batch: the counters are shared with the goroutines
	// that transmit.
	d.ctr.rcvdPkts.Add(uint64(len(frames)))
	var requests uint64
	for _, f := range frames {
		if tap != nil {
			tap.write(f)
		}
		// ib's header walk, then the IB packet: this accepts any UDP port
		// (the link already filtered it), unlike ib.Parse.
		fr, same, err := rx.frame.Parse(f)
		if err == nil && (!same || rx.gids != gt) {
			// Another sender, or the first frame: its source, and
			// rxe_chk_dgid's verdict (only packets to one of our GIDs).
			*src = qp.Source{
				SGID:         ib.GIDFromAddr(fr.Src),
				DGID:         ib.GIDFromAddr(fr.Dst),
				SrcPort:      fr.SrcPort,
				TrafficClass: fr.TOS,
				HopLimit:     fr.TTL,
				FlowLabel:    fr.FlowLabel,
			}
			rx.gids, rx.dgidOK = gt, gt.has(src.DGID)
		}
		if err != nil || fr.End-fr.Payload < ib.BTHSize+ib.ICRCSize {
			d.ctr.badFrame.Add(1)
			continue
		}
		if err := ib.ParseDCIB(f[fr.Payload:fr.End], p); err != nil {
			d.ctr.badFrame.Add(1)
			continue
		}
		if !d.linfo.UncheckedICRC {
			crc := ib.ICRC(f[fr.IPOffset:fr.UDPOffset], f[fr.UDPOffset:fr.End-ib.ICRCSize])
			if crc != ib.GetICRC(f[fr.End-ib.ICRCSize:fr.End]) {
				d.ctr.icrcErr.Add(1)
				continue
			}
		}
		if !rx.dgidOK {
			d.ctr.badDGID.Add(1)
			continue
		}
		src.NetworkHeader = f[fr.IPOffset:fr.UDPOffset]
		if p.BTH.Opcode().Transport() == ib.TransportDC {
			d.learnDCPeer(f, fr.Src)
		}
		if !locked {
			d.mu.Lock()
			d.polled.Load() // see polled
			locked = true
			d.clock.hold = true
		}
		err = d.eng.Receive(p, src)
		src.NetworkHeader = nil // the frame is the link's once the batch ends
		if err != nil {
			d.countDrop(err)
			continue
		}
		if p.Info.IsRequest {
			requests++
		}
	}
	if requests > 0 {
		d.ctr.rdmaRecvs.Add(requests)
	}
	if locked {
		d.clock.hold, d.clock.have = false, false
		// A received NAK may have armed a timer (RNR) without anything
		// to transmit.
		moved := d.noteDeadline()
		d.mu.Unlock()
		if moved {
			d.rearm()
		}
	}
}

// noteDeadline moves the timer goroutine's wake-up earlier if a timer
// armed since it last looked is due before it. Called with d.mu held after
// engine calls that may arm timers. O(1): the engine keeps the earliest
// newly armed deadline, so the timer goroutine sleeps until the next
// deadline instead of polling with a tick, and a device with nothing
// unacknowledged does not wake at all. The runtime timer is reset from
// here rather than by waking the goroutine to reset it: each message of
// a ping-pong arms a probe while the device's wake-up is unset, and a
// goroutine wake-up (a context switch on a loaded host) per message was
// most of the device's wake-ups. It reports whether it moved the wake-up:
// the caller then calls rearm once it has released d.mu, so that the
// timer's system calls (timerfd_settime) are not made under the device
// lock.
func (d *Device) noteDeadline() bool {
	at, ok := d.eng.TakeArmed()
	if !ok || int64(at) >= d.wakeAt.Load() {
		return false
	}
	d.wakeAt.Store(int64(at))
	return true
}

// rearm sets the timer goroutine's timer to wakeAt as it is now. Every
// goroutine that moves wakeAt calls it afterwards, and each call reads
// the latest value under timerMu, so the last one sets the timer to the
// last wakeAt, whatever order the calls come in.
func (d *Device) rearm() {
	d.timerMu.Lock()
	if at := time.Duration(d.wakeAt.Load()); at == never {
		d.timer.disarm()
	} else {
		d.timer.reset(timerWait(at - time.Since(d.start)))
	}
	d.timerMu.Unlock()
}

// timerWait is how long the timer goroutine sleeps for a deadline wait
// away: not less than a short floor, so a deadline already due does not
// spin it.
func timerWait(wait time.Duration) time.Duration {
	return max(wait, 10*time.Microsecond)
}

func (d *Device) countDrop(err error) {
	switch err {
	case qp.ErrUnknownQP:
		d.ctr.unknownQP.Add(1)
	case qp.ErrBadPKey, qp.ErrBadQKey:
		d.ctr.badKey.Add(1)
	case qp.ErrBadAddress:
		// Counted by the engine (bad_addr).
	default:
		d.ctr.rxDropped.Add(1)
	}
}

// timerLoop is the single timer goroutine: it runs the engine's retransmit
// and RNR timers against the real clock. It sleeps on d.timer, which
// rearm resets after noteDeadline saw a timer armed earlier than the
// planned wake-up.
func (d *Device) timerLoop() {
	defer d.wg.Done()
	defer func() {
		d.timerMu.Lock()
		d.timer.close()
		d.timerMu.Unlock()
	}()
	for {
		d.ctr.timerWakes.Add(1)
		d.mu.Lock()
		d.eng.Advance(time.Since(d.start))
		d.mu.Unlock()
		d.flush()
		// Read the deadline and publish it under the lock, so that a
		// timer armed by another goroutine either is seen here or moves
		// wakeAt after this, and rearms after it.
		d.mu.Lock()
		next, ok := d.eng.NextDeadline()
		if !ok {
			next = never
		}
		d.eng.TakeArmed() // included in next
		d.wakeAt.Store(int64(next))
		d.mu.Unlock()
		d.rearm()
		if !d.timer.wait(d.ctx) {
			return
		}
	}
}

// flush transmits everything the engine has to send: it runs the pass of
// every shard the engine has packets queued on (qp.Engine.ReadyShards).
// Whoever holds a shard's lock sends for it; a caller that finds it busy
// leaves a note so the holder goes again. A caller that takes several
// shards sends their packets in one pass, in one link write, as a device
// of one shard does: a goroutine alone sends no more system calls than
// with one shard, and goroutines at once send apart.
func (d *Device) flush() {
	d.undefer()
	for {
		m := d.eng.ReadyShards()
		if m == 0 || !d.flushShards(m) {
			return
		}
		// Frames delivered locally may have queued answers on shards
		// another goroutine held.
	}
}

// flushShards runs the passes of the shards in m that no other goroutine
// runs, and reports whether they delivered frames locally. Shards join in
// one pass only if they send through the same link (txShard.peers).
func (d *Device) flushShards(m uint64) (looped bool) {
	var held uint64
	for ; m != 0; m &= m - 1 {
		i := bits.TrailingZeros64(m)
		s := &d.shards[i]
		s.pending.Store(true)
		if s.mu.TryLock() {
			held |= 1 << i
		}
	}
	for held != 0 {
		lead := &d.shards[bits.TrailingZeros64(held)]
		// Shards that send through different queues of the link go in
		// passes of their own: a QP's frames always leave by one queue,
		// in order.
		run := held & lead.peers
		for h := run; h != 0; h &= h - 1 {
			d.shards[bits.TrailingZeros64(h)].pending.Store(false)
		}
		d.transmit(lead, run)
		looped = looped || lead.looped
		for h := run; h != 0; h &= h - 1 {
			d.shards[bits.TrailingZeros64(h)].mu.Unlock()
		}
		again := held &^ run
		for h := run; h != 0; h &= h - 1 {
			i := bits.TrailingZeros64(h)
			if s := &d.shards[i]; s.pending.Load() && s.mu.TryLock() {
				again |= 1 << i
			}
		}
		held = again
	}
	return looped
}

// flushAll transmits everything the engine has queued, waiting for
// transmit passes that are under way instead of leaving the work to them.
func (d *Device) flushAll() {
	d.undefer()
	for i := range d.shards {
		s := &d.shards[i]
		s.mu.Lock()
		s.pending.Store(false)
		d.transmit(s, 1<<i)
		s.mu.Unlock()
	}
	// What a shard's local delivery queued on an earlier one.
	d.flush()
}

// shardOf returns the transmit shard of the QP numbered qpn.
func (d *Device) shardOf(qpn uint32) *txShard { return &d.shards[d.eng.ShardOf(qpn)] }

// transmitShards fills slots from the engine's queues of the shards in
// held, starting at a different one each pass. Called with d.mu held.
func (d *Device) transmitShards(s *txShard, held uint64, slots []qp.TxPacket) int {
	if held&(held-1) == 0 {
		return d.eng.TransmitShard(bits.TrailingZeros64(held), slots)
	}
	s.turn++
	n := 0
	rot := s.turn % uint(len(d.shards))
	for h := bits.RotateLeft64(held, -int(rot)); h != 0 && n < len(slots); h &= h - 1 {
		i := (bits.TrailingZeros64(h) + int(rot)) % 64
		n += d.eng.TransmitShard(i, slots[n:])
	}
	return n
}

// transmit runs the pass of the shards in held, whose locks the caller
// holds, in the buffers of s, one of them.
func (d *Device) transmit(s *txShard, held uint64) {
	s.looped = false
	for {
		// The engine writes into buffers the link lends, where frames are
		// sent from, or else into the shard's slots (txlend.go).
		slots := s.lend.take(d, s.slots)
		lent := s.lend.lent()
		d.mu.Lock()
		if d.closed.Load() {
			d.mu.Unlock()
			s.lend.giveBack()
			return
		}
		var short uint64
		if lent {
			short = d.eng.Stats().ShortTxBuffer
		}
		d.polled.Load() // see polled
		n := d.transmitShards(s, held, slots)
		if lent && d.eng.Stats().ShortTxBuffer != short {
			s.lend.short = true
		}
		moved := n > 0 && d.noteDeadline()
		d.mu.Unlock()
		if moved {
			d.rearm()
		}
		s.lend.produced(n)
		if n == 0 {
			s.lend.giveBack()
			if s.lend.short {
				continue
			}
			return
		}
		k := 0
		s.loop = s.loop[:0]
		for i := 0; i < n; i++ {
			f, local, ok := d.buildFrame(&slots[i], s)
			switch {
			case !ok:
			case local:
				s.loop = append(s.loop, f)
			default:
				s.frames[k] = f
				if lent {
					s.lend.send(i, k)
				}
				k++
			}
		}
		if lent {
			d.writeLent(&s.lend, s.frames[:k])
		} else {
			d.write(s.link, s.frames[:k])
		}
		clear(s.frames[:k])
		if len(s.loop) > 0 {
			if tap := d.tap.Load(); tap != nil {
				for _, f := range s.loop {
					tap.write(f)
				}
			}
			d.ctr.sentPkts.Add(uint64(len(s.loop)))
			d.receiveBatch(s.loop, &s.loopPkt)
			clear(s.loop)
			s.lend.giveBack()
			s.looped = true
			// The receive may have produced responses: go round again.
			continue
		}
		s.lend.giveBack()
		if n < len(slots) && !s.lend.short {
			d.lastTx.Store(d.nowNs())
			return
		}
	}
}

// write hands frames to l (a shard's link), skipping any frame it
// refuses.
func (d *Device) write(l link.Link, frames [][]byte) {
	if tap := d.tap.Load(); tap != nil {
		for _, f := range frames {
			tap.write(f)
		}
	}
	for len(frames) > 0 {
		n, err := l.WriteBatch(frames)
		d.ctr.sentPkts.Add(uint64(n))
		if err == nil {
			return
		}
		if errors.Is(err, link.ErrClosed) {
			return
		}
		d.noteSendErr(err)
		// Skip the refused frame (RC recovers by retransmission) and
		// send the rest.
		skip := n
		var fe *link.FrameError
		if errors.As(err, &fe) && fe.Index >= n {
			skip = fe.Index
		}
		if skip >= len(frames) {
			return
		}
		frames = frames[skip+1:]
	}
}

// buildFrame puts the Ethernet/IP/UDP headers in front of the IB packet the
// engine wrote into t and seals it with the ICRC.
func (d *Device) buildFrame(t *qp.TxPacket, s *txShard) (frame []byte, local, ok bool) {
	av := &t.AV
	dst := av.DGID.Addr()
	src := av.SGID.Addr()
	if !src.IsValid() || src.IsUnspecified() {
		src = d.gids.Load().defaultSource(dst.Is4())
	}
	if !dst.IsValid() || !src.IsValid() || dst.Is4() != src.Is4() {
		d.ctr.noNeighbour.Add(1)
		return nil, false, false
	}
	var mac [6]byte
	local = d.gids.Load().has(av.DGID)
	if local {
		mac = d.mac
	} else if mac, ok = d.neigh.lookup(dst); !ok {
		d.ctr.noNeighbour.Add(1)
		return nil, false, false
	}
	pl := t.Payload()
	if len(pl) > d.ibLimit(dst.Is4()) {
		d.ctr.sendErr.Add(1)
		return nil, false, false
	}
	if opc := ib.BTH(pl).Opcode().Info(); opc.IsRequest {
		d.ctr.rdmaSends.Add(1)
	}
	h := link.Header{
		Dst: mac, Src: d.mac,
		SrcAddr: src, DstAddr: dst,
		SrcPort: av.SrcPort, DstPort: d.port,
		TOS: av.TrafficClass, TTL: av.HopLimit,
		FlowLabel: av.FlowLabel, DF: true,
	}
	if h.TOS < 4 {
		h.TOS |= d.dscp
	}
	if h.TTL == 0 {
		h.TTL = 64
	}
	if d.linfo.FixedSourcePort != 0 {
		h.SrcPort = d.linfo.FixedSourcePort
	}
	if !d.linfo.IPIDZero {
		s.ipID++
		h.IPID = s.ipID
	}
	hs := h.HeaderSize()
	start := t.Headroom - hs
	h.Put(t.Buf[start:t.Headroom], len(pl))
	frame = t.Buf[start : t.Headroom+t.Len]
	ipLen := ipHeaderSize(dst)
	ip := frame[link.EthernetSize : link.EthernetSize+ipLen]
	crc := ib.ICRC(ip, frame[link.EthernetSize+ipLen:len(frame)-ib.ICRCSize])
	ib.PutICRC(frame[len(frame)-ib.ICRCSize:], crc)
	return frame, local, true
}

// activeMTU is the engine's port MTU.
func (d *Device) activeMTU() ib.MTU {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.PortMTU()
}

// ibLimit is the largest IB packet (BTH … ICRC) that fits the link's IP MTU.
func (d *Device) ibLimit(v4 bool) int {
	ip := link.IPv6Size
	if v4 {
		ip = link.IPv4Size
	}
	return int(d.netMTU.Load()) - ip - link.UDPSize
}

// linkChanged follows the interface: a new MTU changes the active MTU (the
// UD limit) and the path MTU check; operational state is the port state.
func (d *Device) linkChanged(mtu int, up bool) {
	if d.portUp.Swap(up) != up {
		d.portChanged(up)
	}
	if mtu <= 0 || int64(mtu) == d.netMTU.Load() {
		return
	}
	d.netMTU.Store(int64(mtu))
	d.mu.Lock()
	err := d.eng.SetPortMTU(ib.ActiveMTU(mtu))
	d.mu.Unlock()
	d.log.Info("roce: interface MTU changed", "mtu", mtu, "active_mtu", ib.ActiveMTU(mtu), "err", err)
}

func ipHeaderSize(a netip.Addr) int {
	if a.Unmap().Is4() {
		return link.IPv4Size
	}
	return link.IPv6Size
}
