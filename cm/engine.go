package cm

import (
	"container/heap"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/errtimeout"
)

// Defaults matching the Linux rdma_cm on RoCE (cma.c) and rxe (rxe_param.h).
const (
	DefaultCMResponseTimeout = 20 // CMA_CM_RESPONSE_TIMEOUT
	DefaultMaxCMRetries      = 15 // CMA_MAX_CM_RETRIES
	DefaultPacketLifeTime    = 18 // CMA_IBOE_PACKET_LIFETIME (16 in the newest kernels)
	DefaultCAACKDelay        = 15 // RXE_LOCAL_CA_ACK_DELAY
	DefaultMRAServiceTimeout = 24 // CMA_CM_MRA_SETTING of older kernels
	DefaultHopLimit          = 64
	DefaultPKey              = 0xFFFF
	// DefaultMaxPeerCMTimeout caps the timeout exponents a peer imposes on
	// us (its REQ's Local CM Response Timeout, which paces our REP and DREQ
	// retries, its ACK timeout, which sets timewait, and an MRA's Service
	// Timeout): 2^(24-8) ms ≈ 65.5 s a try, where 31 would mean 2.3 h. It
	// is the largest value rdma_cm sends (its MRA), so no real peer is
	// affected.
	DefaultMaxPeerCMTimeout = 24
)

// Errors returned by the engine and reported in events. A rejection by the
// peer is a *mad.RejectError (errors.Is(err, mad.ErrRejected)).
var (
	// ErrTimeout reports a request (REQ, REP, DREQ, SIDR_REQ) that got no
	// answer after Max CM Retries retransmissions (rdma_cm: UNREACHABLE).
	// It is a net.Error whose Timeout() is true.
	ErrTimeout = errtimeout.New("cm: no response from the peer")
	// ErrState reports an operation not allowed in the connection's state,
	// on a communication ID the engine does not hold (never created, or
	// already gone), or a second answer to a Request; the message says which.
	ErrState = errors.New("cm: operation not allowed in this state")
	// ErrInvalid reports bad parameters from the caller.
	ErrInvalid = errors.New("cm: invalid argument")
	// ErrListening reports a second listener on the same service ID.
	ErrListening = errors.New("cm: service ID already has a listener")

	// errUnknownID: an operation on a communication ID the engine does not
	// hold.
	errUnknownID = stateError("unknown communication ID")
)

// stateError is an ErrState naming what was refused.
type stateError string

func (e stateError) Error() string        { return "cm: " + string(e) }
func (e stateError) Is(target error) bool { return target == ErrState }

// ConvertToDuration is cm_convert_to_ms: 4.096 µs × 2^t rounded the kernel's
// way, 2^max(t−8, 0) ms.
func ConvertToDuration(t uint8) time.Duration {
	if t > 8 {
		return time.Duration(1<<min(t-8, 31)) * time.Millisecond
	}
	return time.Millisecond
}

// ACKTimeout is cm_ack_timeout: the local ACK timeout exponent for a path
// with packet life time plt to a CA with ACK delay caACKDelay.
func ACKTimeout(caACKDelay, plt uint8) uint8 {
	t := int(plt) + 1
	d := int(caACKDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		t = d
		if int(plt)+1 >= d-1 {
			t++
		}
	}
	return uint8(min(31, t))
}

// State is the state of a communication ID (ib_cm.h: enum ib_cm_state).
type State uint8

// Connection states.
const (
	StateIdle State = iota
	StateREQSent
	StateREQRcvd
	StateMRAREQSent
	StateMRAREQRcvd
	StateREPSent
	StateREPRcvd
	StateMRAREPRcvd
	StateEstablished
	StateDREQSent
	StateTimewait
	StateSIDRREQSent
	StateSIDRREQRcvd
)

var stateNames = [...]string{"IDLE", "REQ_SENT", "REQ_RCVD", "MRA_REQ_SENT", "MRA_REQ_RCVD",
	"REP_SENT", "REP_RCVD", "MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "TIMEWAIT",
	"SIDR_REQ_SENT", "SIDR_REQ_RCVD"}

// String returns the kernel-style state name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Path is the addressing of CM MADs and of the connection's QP: IP addresses
// (the GIDs) seen from this side, and the IP header fields.
type Path struct {
	Local, Remote netip.Addr
	TrafficClass  uint8
	HopLimit      uint8
	FlowLabel     uint32
}

// Outbound is one MAD for the GSI QP to send to Path.Remote's QP1.
type Outbound struct {
	Path Path
	MAD  [mad.Size]byte
}

// EventType says what an Event reports.
type EventType uint8

// Event types.
const (
	// EventRequest: a REQ for a listened service ID created connection ID;
	// answer with Accept or Reject. Event.REQ holds the request.
	EventRequest EventType = iota + 1
	// EventReply: our REQ was answered by a REP (Event.REP). Move the QP
	// to RTR/RTS with QPAttr, then call RTU (or Reject).
	EventReply
	// EventEstablished: the RTU for our REP arrived.
	EventEstablished
	// EventRejected: the peer sent a REJ; Event.Err is a *mad.RejectError.
	// The ID is gone (or in timewait).
	EventRejected
	// EventTimeout: retries exhausted for REQ or REP; Event.Err is ErrTimeout.
	EventTimeout
	// EventDisconnected: the peer sent a DREQ; the DREP has been sent.
	EventDisconnected
	// EventDisconnectDone: our DREQ was answered (or timed out: Err is ErrTimeout).
	EventDisconnectDone
	// EventSIDRRequest: a SIDR_REQ for a listened service ID; answer with SIDRReply.
	EventSIDRRequest
	// EventSIDRReply: our SIDR_REQ was answered (Event.SIDRREP), timed out or
	// refused (Event.Err).
	EventSIDRReply
	// EventExit: the ID left timewait (or was otherwise released) and is
	// forgotten by the engine.
	EventExit
)

var eventNames = [...]string{"", "REQUEST", "REPLY", "ESTABLISHED", "REJECTED", "TIMEOUT",
	"DISCONNECTED", "DISCONNECT_DONE", "SIDR_REQUEST", "SIDR_REPLY", "EXIT"}

// String returns the event name.
func (t EventType) String() string {
	if int(t) < len(eventNames) && t != 0 {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Event reports a state change of one communication ID.
type Event struct {
	Type        EventType
	ID          uint32 // local communication ID (the SIDR request ID for SIDR events)
	ServiceID   uint64
	Path        Path
	REQ         *mad.REQFields     // EventRequest
	REP         *mad.REPFields     // EventReply
	SIDRREQ     *mad.SIDRREQFields // EventSIDRRequest
	SIDRREP     *mad.SIDRREPFields // EventSIDRReply
	PrivateData []byte             // of the message that caused the event
	Err         error
}

// Clock gives the engine the current time as a monotonic offset; the
// engine of package roce's queue pairs reads its time the same way.
type Clock interface {
	Now() time.Duration
}

// Config configures an Engine.
type Config struct {
	Clock Clock // required
	// Rand returns random 32-bit values for communication IDs; required.
	Rand func() uint32
	// LocalCAGUID is our node GUID (rxe: EUI-64 of the MAC).
	LocalCAGUID uint64
	// CAACKDelay is our CA ACK delay (default 15, rxe).
	CAACKDelay uint8
	// HiTID is the high word of our transaction IDs (the MAD agent's).
	HiTID uint32
	// HopLimit for replies (default 64).
	HopLimit uint8
	// MRAServiceTimeout, when not zero, makes the engine answer a REQ
	// repeated before the consumer answered with an MRA of that service
	// timeout (older rdma_cm: 24 ≈ 67 s, DefaultMRAServiceTimeout). Zero, the
	// default, ignores such duplicates as current kernels do: an MRA makes the
	// peer wait that long for a lost REP.
	MRAServiceTimeout uint8
	// MaxPeerCMTimeout caps the timeout exponents the peer sets for us
	// (0: DefaultMaxPeerCMTimeout; at most 31). The Linux CM takes them
	// unclamped but retransmits asynchronously. (A listener bounds its
	// half-open handshakes further: AcceptParams.REPLifetime.)
	MaxPeerCMTimeout uint8
	// REQRate limits the REQs that create a connection ID, per source
	// address, to REQRate a second with bursts of REQBurst (0:
	// DefaultREQRate, DefaultREQBurst; a negative REQRate disables the
	// limit). REQSources bounds the sources remembered (0:
	// DefaultREQSources). A REQ over the limit is dropped without an
	// answer, as a SYN past a full queue is: a real peer retransmits it,
	// and a REJ would only reflect the flood to the address it claims.
	REQRate    float64
	REQBurst   int
	REQSources int
}

// Stats counts what the engine dropped or answered on its own.
type Stats struct {
	Malformed     uint64 // MADs failing mad.ParseCM
	Unmatched     uint64 // messages for unknown or mismatching IDs, or unexpected in the ID's state, dropped
	Duplicates    uint64 // repeated REQ/REP/DREQ/SIDR_REQ handled as duplicates
	Retransmits   uint64 // MADs sent again by the retry timer
	RejectsIssued uint64 // REJs sent without a local ID (no listener, stale)
	Clamped       uint64 // peer timeouts lowered to Config.MaxPeerCMTimeout
	RateLimited   uint64 // REQs dropped by the per-source rate limit (Config.REQRate)
	// Unresolved counts MADs a Manager did not send because their
	// destination's neighbour was not known yet; it is resolved in the
	// background, and the retry timer (or the peer's) sends again. A
	// flood spoofed from addresses that answer nothing shows here.
	Unresolved uint64
}

// Engine is the Communication Manager of one port: MAD transaction layer,
// connection state machines on both sides, SIDR, and the negotiation of QP
// attributes. It does no I/O and starts no goroutines: feed it received MADs
// with Receive, drain MADs to send with PollOutbound and events with
// PollEvent, and drive timers with NextDeadline and Advance. Not safe for
// concurrent use.
type Engine struct {
	cfg       Config
	conns     map[uint32]*conn
	byRemote  map[remoteKey]uint32 // remote comm ID + CA GUID → local ID (duplicate REQs)
	byQPN     map[qpnKey]uint32    // remote QPN + CA GUID → local ID (stale connections)
	sidrIn    map[sidrKey]uint32   // passive SIDR requests awaiting a reply
	listeners map[uint64]struct{}
	timers    timerHeap // the conns whose timer runs, earliest deadline first
	expired   []*conn   // scratch for Advance
	out       []Outbound
	events    []Event
	stats     Stats
	reqLimit  *reqLimiter // nil: no limit
}

type remoteKey struct {
	commID uint32
	guid   uint64
}

type qpnKey struct {
	qpn  uint32
	guid uint64
}

type sidrKey struct {
	reqID  uint32
	remote netip.Addr
}

// conn is one communication ID.
type conn struct {
	id, remoteID uint32
	state        State
	active       bool
	serviceID    uint64
	tid          uint64
	path         Path
	remoteGUID   uint64

	// negotiated connection parameters
	transport            mad.TransportType
	localQPN, remoteQPN  uint32
	localPSN, remotePSN  uint32 // the Starting PSNs we and the peer announced
	respRes, initDepth   uint8  // our own (responder resources, initiator depth)
	pathMTU              ib.MTU
	retryCount           uint8
	rnrRetry             uint8 // the RNR retry count our QP uses (chosen by the peer)
	ackTimeout           uint8 // AV timeout (local ACK timeout exponent)
	localCMTimeout       uint8 // the response timeout we promised (REQ: local; REP side: peer's)
	maxCMRetries         uint8
	flowControl, srq     bool
	pkey                 uint16
	qkey                 uint32 // SIDR / UD
	indexedRemote, byQPN bool
	plt                  uint8         // packet life time (active side)
	timeout              time.Duration // cm_id timeout_ms: REQ/REP/DREQ retry interval
	dreqTID              uint64
	sidr                 *sidrKey      // passive SIDR index entry
	repCap               time.Duration // AcceptParams.REPLifetime: also bounds an MRA's wait

	// transaction layer: the MAD awaiting an answer
	msg        [mad.Size]byte
	waiting    bool
	theap      int // position in Engine.timers plus one; 0 while waiting is false
	retries    int // retransmissions left
	interval   time.Duration
	deadline   time.Duration
	lastReply  [mad.Size]byte // last RTU/DREP/MRA, re-sent on duplicates
	replyValid bool
}

// NewEngine returns an engine.
func NewEngine(cfg Config) (*Engine, error) {
	if cfg.Clock == nil || cfg.Rand == nil {
		return nil, fmt.Errorf("%w: Config.Clock and Config.Rand are required", ErrInvalid)
	}
	if cfg.CAACKDelay == 0 {
		cfg.CAACKDelay = DefaultCAACKDelay
	}
	if cfg.HopLimit == 0 {
		cfg.HopLimit = DefaultHopLimit
	}
	if cfg.MaxPeerCMTimeout == 0 || cfg.MaxPeerCMTimeout > 31 {
		cfg.MaxPeerCMTimeout = DefaultMaxPeerCMTimeout
	}
	return &Engine{
		cfg:       cfg,
		conns:     map[uint32]*conn{},
		byRemote:  map[remoteKey]uint32{},
		byQPN:     map[qpnKey]uint32{},
		sidrIn:    map[sidrKey]uint32{},
		listeners: map[uint64]struct{}{},
		reqLimit:  newREQLimiter(cfg.REQRate, cfg.REQBurst, cfg.REQSources),
	}, nil
}

// Stats returns the engine counters.
func (e *Engine) Stats() Stats { return e.stats }

// Len returns the number of communication IDs the engine holds (in any
// state, including timewait) and the number of listeners.
func (e *Engine) Len() (ids, listeners int) { return len(e.conns), len(e.listeners) }

// tablesEmpty reports whether every lookup table is empty (tests).
func (e *Engine) tablesEmpty() bool {
	return len(e.conns) == 0 && len(e.byRemote) == 0 && len(e.byQPN) == 0 && len(e.sidrIn) == 0 && len(e.timers) == 0
}

// State returns the state of id.
func (e *Engine) State(id uint32) (State, error) {
	c, ok := e.conns[id]
	if !ok {
		return StateIdle, errUnknownID
	}
	return c.state, nil
}

// PollOutbound returns the next MAD to send.
func (e *Engine) PollOutbound() (Outbound, bool) {
	if len(e.out) == 0 {
		return Outbound{}, false
	}
	o := e.out[0]
	e.out = e.out[1:]
	if len(e.out) == 0 {
		e.out = e.out[:0:0]
	}
	return o, true
}

// PollEvent returns the next event.
func (e *Engine) PollEvent() (Event, bool) {
	if len(e.events) == 0 {
		return Event{}, false
	}
	ev := e.events[0]
	e.events = e.events[1:]
	if len(e.events) == 0 {
		e.events = nil
	}
	return ev, true
}

func (e *Engine) emit(ev Event) { e.events = append(e.events, ev) }

// Listen makes REQs and SIDR_REQs for serviceID create IDs (EventRequest,
// EventSIDRRequest) instead of being rejected.
func (e *Engine) Listen(serviceID uint64) error {
	if _, dup := e.listeners[serviceID]; dup {
		return ErrListening
	}
	e.listeners[serviceID] = struct{}{}
	return nil
}

// Unlisten removes the listener; IDs already created stay.
func (e *Engine) Unlisten(serviceID uint64) { delete(e.listeners, serviceID) }

// newID allocates a nonzero communication ID not in use.
func (e *Engine) newID() uint32 {
	for {
		id := e.cfg.Rand()
		if _, used := e.conns[id]; id != 0 && !used {
			return id
		}
	}
}

// formTID is cm_form_tid: the kernel puts the ID in host (little-endian)
// order into the low word, so on the wire it appears byte-swapped.
func (e *Engine) formTID(id uint32) uint64 {
	return uint64(e.cfg.HiTID)<<32 | uint64(bits.ReverseBytes32(id))
}

// queue appends a MAD for path; fill writes the message body.
func (e *Engine) queue(p Path, a mad.AttrID, tid uint64, fill func(m mad.MAD)) *Outbound {
	e.out = append(e.out, Outbound{Path: p})
	o := &e.out[len(e.out)-1]
	m := mad.MAD(o.MAD[:])
	h := mad.CMHeader(a, tid)
	m.Encode(&h)
	fill(m)
	return o
}

// withdrawREP removes connection id's REP from the queue if it has not
// been polled yet.
func (e *Engine) withdrawREP(tid uint64, id uint32) {
	for i := range e.out {
		m := mad.MAD(e.out[i].MAD[:])
		if m.AttrID() == mad.AttrREP && m.TID() == tid && m.REP().LocalCommID() == id {
			e.out = slices.Delete(e.out, i, i+1)
			return
		}
	}
}

// send queues a request MAD and arms the retry timer of c.
func (e *Engine) send(c *conn, a mad.AttrID, tid uint64, interval time.Duration, retries uint8, fill func(m mad.MAD)) {
	o := e.queue(c.path, a, tid, fill)
	c.msg = o.MAD
	c.retries = int(retries)
	c.interval = interval
	e.arm(c, e.cfg.Clock.Now()+interval)
}

// reply queues a response MAD and remembers it for duplicates.
func (e *Engine) reply(c *conn, a mad.AttrID, tid uint64, fill func(m mad.MAD)) {
	o := e.queue(c.path, a, tid, fill)
	c.lastReply = o.MAD
	c.replyValid = true
}

// arm (re)starts the timer of c.
func (e *Engine) arm(c *conn, deadline time.Duration) {
	c.waiting = true
	c.deadline = deadline
	if c.theap > 0 {
		heap.Fix(&e.timers, c.theap-1)
	} else {
		heap.Push(&e.timers, c)
	}
}

// stopTimer stops the timer of c, if it runs.
func (e *Engine) stopTimer(c *conn) {
	c.waiting = false
	if c.theap > 0 {
		heap.Remove(&e.timers, c.theap-1)
	}
}

// timerHeap orders running timers by deadline so that NextDeadline and
// Advance cost O(log n) in the number of IDs, which with rdma_cm's 2 s
// timewait reach thousands on a busy listener.
type timerHeap []*conn

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].theap, h[j].theap = i+1, j+1
}
func (h *timerHeap) Push(x any) {
	c := x.(*conn)
	c.theap = len(*h) + 1
	*h = append(*h, c)
}
func (h *timerHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	c.theap = 0
	return c
}

// remove forgets c and its index entries.
func (e *Engine) remove(c *conn) {
	delete(e.conns, c.id)
	if c.indexedRemote {
		if e.byRemote[remoteKey{c.remoteID, c.remoteGUID}] == c.id {
			delete(e.byRemote, remoteKey{c.remoteID, c.remoteGUID})
		}
		c.indexedRemote = false
	}
	if c.byQPN {
		if e.byQPN[qpnKey{c.remoteQPN, c.remoteGUID}] == c.id {
			delete(e.byQPN, qpnKey{c.remoteQPN, c.remoteGUID})
		}
		c.byQPN = false
	}
	if c.sidr != nil {
		delete(e.sidrIn, *c.sidr)
		c.sidr = nil
	}
	c.state = StateIdle
	e.stopTimer(c)
}

func (e *Engine) indexRemote(c *conn) {
	k := remoteKey{c.remoteID, c.remoteGUID}
	e.byRemote[k] = c.id
	c.indexedRemote = true
}

func (e *Engine) indexQPN(c *conn) {
	if c.transport == mad.TransportRC || c.transport == mad.TransportUC {
		e.byQPN[qpnKey{c.remoteQPN, c.remoteGUID}] = c.id
		c.byQPN = true
	}
}

// enterTimewait keeps c for ConvertToDuration(ack timeout) so that late
// duplicates are recognised (cm_enter_timewait), then releases it.
func (e *Engine) enterTimewait(c *conn) {
	// cm_cleanup_timewait: the peer's QP is free again at once, so that a
	// new connection of a restarted peer that got the same QPN is not
	// refused as stale while this one waits out its timewait.
	if c.byQPN {
		if e.byQPN[qpnKey{c.remoteQPN, c.remoteGUID}] == c.id {
			delete(e.byQPN, qpnKey{c.remoteQPN, c.remoteGUID})
		}
		c.byQPN = false
	}
	c.state = StateTimewait
	c.retries = 0
	c.interval = 0
	e.arm(c, e.cfg.Clock.Now()+ConvertToDuration(c.ackTimeout))
}

// NextDeadline returns the earliest pending timer.
func (e *Engine) NextDeadline() (time.Duration, bool) {
	if len(e.timers) == 0 {
		return 0, false
	}
	return e.timers[0].deadline, true
}

// Advance runs every timer that expired by the clock's current time, each
// once (a retransmission re-arms its timer for a later call).
func (e *Engine) Advance() {
	now := e.cfg.Clock.Now()
	due := e.expired[:0]
	for len(e.timers) > 0 && e.timers[0].deadline <= now {
		due = append(due, heap.Pop(&e.timers).(*conn))
	}
	for i, c := range due {
		// Off the heap but still waiting: expire re-arms or stops it.
		e.expire(c, now)
		due[i] = nil
	}
	e.expired = due[:0]
}

func (e *Engine) expire(c *conn, now time.Duration) {
	if c.state == StateTimewait {
		e.remove(c)
		e.emit(Event{Type: EventExit, ID: c.id})
		return
	}
	if c.retries > 0 {
		c.retries--
		e.arm(c, now+c.interval)
		e.out = append(e.out, Outbound{Path: c.path, MAD: c.msg})
		e.stats.Retransmits++
		return
	}
	e.stopTimer(c)
	switch c.state {
	case StateREQSent, StateMRAREQRcvd:
		e.remove(c)
		e.emit(Event{Type: EventTimeout, ID: c.id, ServiceID: c.serviceID, Err: ErrTimeout})
	case StateREPSent, StateMRAREPRcvd:
		e.remove(c)
		e.emit(Event{Type: EventTimeout, ID: c.id, ServiceID: c.serviceID, Err: ErrTimeout})
	case StateDREQSent:
		e.enterTimewait(c)
		e.emit(Event{Type: EventDisconnectDone, ID: c.id, Err: ErrTimeout})
	case StateSIDRREQSent:
		e.remove(c)
		e.emit(Event{Type: EventSIDRReply, ID: c.id, ServiceID: c.serviceID, Err: ErrTimeout})
	default:
		// No MAD outstanding in other states; nothing to do.
	}
}
