// Package qptest connects two qp engines through deterministic faultnet pipes
// under a fake clock, for tests of the transport under loss, reordering,
// duplication and corruption.
//
// A Net owns the clock: Run alternates "both engines transmit", "deliver every
// packet due now" and "jump the clock to the next event" until a condition
// holds, so a test that would take minutes of retransmit timeouts in real time
// runs in milliseconds and gives the same result for the same seeds.
package qptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link/faultnet"
)

// Clock is a manually advanced clock.
type Clock struct{ T time.Duration }

// Now returns the current fake time.
func (c *Clock) Now() time.Duration { return c.T }

// Side is one end of a Net.
type Side struct {
	E   *qp.Engine
	GID ib.GID
	out *faultnet.Pipe // packets this side sends
	src qp.Source      // what the peer sees as the source of this side's packets
	hdr [40]byte
}

// Net is two engines joined by a pipe in each direction.
type Net struct {
	Clock *Clock
	A, B  *Side

	slots []qp.TxPacket
	pkt   ib.Packet
	// Tap, if set, sees every packet an engine transmits (before impairment),
	// with from = "A" or "B".
	Tap func(from string, b []byte)
	// Drop, if set, sees every packet an engine transmits after Tap and
	// loses those it returns true for, before the pipe's own impairments:
	// a test chooses exactly which packet goes missing.
	Drop func(from string, b []byte) bool
	// Received counts packets handed to the engines.
	Received uint64
	// RxErrors counts Receive results by error.
	RxErrors map[error]int
}

// Options configures NewNet.
type Options struct {
	AtoB, BtoA faultnet.Config
	PortMTU    ib.MTU
	// AddrA and AddrB are the sides' IP addresses (default 10.0.0.1 and
	// 10.0.0.2); both must be of one family.
	AddrA, AddrB netip.Addr
}

const slotSize = 4096 + 192 // headroom 64 + MTU + 64, and 8 more for DC

// NewNet creates two engines sharing one fake clock.
func NewNet(o Options) (*Net, error) {
	n := &Net{Clock: &Clock{}, RxErrors: map[error]int{}}
	if !o.AddrA.IsValid() {
		o.AddrA = netip.MustParseAddr("10.0.0.1")
	}
	if !o.AddrB.IsValid() {
		o.AddrB = netip.MustParseAddr("10.0.0.2")
	}
	mk := func(a netip.Addr, out faultnet.Config) (*Side, error) {
		e, err := qp.New(qp.Config{Clock: n.Clock, PortMTU: o.PortMTU})
		if err != nil {
			return nil, err
		}
		s := &Side{E: e, GID: ib.GIDFromAddr(a), out: faultnet.New(out)}
		// A plausible IP header for the UD GRH area.
		h := s.hdr[:20]
		if a.Is4() {
			s.hdr[0] = 0x45
			s.hdr[8] = 64
			s.hdr[9] = 17
			copy(s.hdr[12:16], a.AsSlice())
		} else {
			h = s.hdr[:40]
			s.hdr[0] = 0x60
			s.hdr[6] = 17
			s.hdr[7] = 64
			copy(s.hdr[8:24], a.AsSlice())
		}
		s.src = qp.Source{SGID: s.GID, NetworkHeader: h}
		return s, nil
	}
	var err error
	if n.A, err = mk(o.AddrA, o.AtoB); err != nil {
		return nil, err
	}
	if n.B, err = mk(o.AddrB, o.BtoA); err != nil {
		return nil, err
	}
	n.slots = make([]qp.TxPacket, 32)
	for i := range n.slots {
		n.slots[i].Buf = make([]byte, slotSize)
		n.slots[i].Headroom = 64
	}
	return n, nil
}

// Pipes returns the A→B and B→A pipes.
func (n *Net) Pipes() (ab, ba *faultnet.Pipe) { return n.A.out, n.B.out }

// transmit moves everything s wants to send into its pipe.
func (n *Net) transmit(s *Side, name string) int {
	total := 0
	for {
		k := s.E.Transmit(n.slots)
		for i := 0; i < k; i++ {
			b := n.slots[i].Payload()
			if n.Tap != nil {
				n.Tap(name, b)
			}
			if n.Drop != nil && n.Drop(name, b) {
				continue
			}
			// Stand in for the device's ICRC: seal here, verify on delivery, so
			// corrupted packets are dropped as a NIC would drop them.
			binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.ChecksumIEEE(b[:len(b)-4]))
			s.out.Push(n.Clock.T, b)
		}
		total += k
		if k < len(n.slots) {
			return total
		}
	}
}

func (n *Net) deliver(from, to *Side) int {
	return from.out.Pop(n.Clock.T, func(b []byte) {
		n.Received++
		if len(b) < 4 || binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.ChecksumIEEE(b[:len(b)-4]) {
			n.RxErrors[errICRC]++
			return
		}
		if err := ib.ParseDCIB(b, &n.pkt); err != nil {
			n.RxErrors[errParse]++
			return
		}
		src := from.src
		src.DGID = to.GID
		if err := to.E.Receive(&n.pkt, &src); err != nil {
			n.RxErrors[err]++
		}
	})
}

var (
	errParse = errors.New("parse error")
	errICRC  = errors.New("bad ICRC")
)

// Step runs the engines and delivers due packets once; it reports whether
// anything moved.
func (n *Net) Step() bool {
	moved := n.transmit(n.A, "A")+n.transmit(n.B, "B") > 0
	if n.deliver(n.A, n.B)+n.deliver(n.B, n.A) > 0 {
		moved = true
	}
	return moved
}

// ErrStuck is returned by Run when nothing can happen any more and the
// condition still does not hold.
var ErrStuck = errors.New("qptest: no packets in flight and no timers pending")

// Run steps the network until done returns true. When nothing moves, the clock
// jumps to the next packet delivery or engine timer. It gives up after the
// fake clock passed limit.
func (n *Net) Run(done func() bool, limit time.Duration) error {
	start := n.Clock.T
	steps := 0
	for !done() {
		if n.Step() {
			steps++
			if steps > 50_000_000 {
				return fmt.Errorf("qptest: no quiescence after %d steps at %v", steps, n.Clock.T)
			}
			continue
		}
		next, ok := n.nextEvent()
		if !ok {
			if done() {
				return nil
			}
			return ErrStuck
		}
		if next > n.Clock.T {
			n.Clock.T = next
		}
		n.A.E.Advance(n.Clock.T)
		n.B.E.Advance(n.Clock.T)
		if n.Clock.T-start > limit {
			return fmt.Errorf("qptest: condition not met after %v of fake time", limit)
		}
	}
	return nil
}

func (n *Net) nextEvent() (time.Duration, bool) {
	var best time.Duration
	ok := false
	consider := func(t time.Duration, has bool) {
		if has && (!ok || t < best) {
			best, ok = t, true
		}
	}
	consider(n.A.out.NextDue())
	consider(n.B.out.NextDue())
	consider(n.A.E.NextDeadline())
	consider(n.B.E.NextDeadline())
	return best, ok
}

// RCParams are the connection attributes ConnectRC applies to both QPs.
type RCParams struct {
	MTU                ib.MTU
	PSNA, PSNB         uint32 // initial send PSN of A and of B
	Timeout            uint8
	RetryCnt, RNRRetry uint8
	MinRNRTimer        uint8
	RdAtomic           uint8 // both max_rd_atomic and max_dest_rd_atomic
	Access             qp.Access
}

// DefaultRC is rc_pingpong-like: 1024 MTU, timeout 14, retries 7/7, RNR timer 12.
var DefaultRC = RCParams{MTU: ib.MTU1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, RdAtomic: 16,
	Access: qp.AccessRemoteWrite | qp.AccessRemoteRead | qp.AccessRemoteAtomic | qp.AccessLocalWrite}

// Connect brings a (on side A) and b (on side B) to RTS connected to each other.
// RC and UC use p; UD QPs get Q_Key 0x11111111.
func (n *Net) Connect(a, b *qp.QP, p RCParams) error {
	if err := BringUp(a, b.QPN(), p, p.PSNA, p.PSNB, n.A.GID, n.B.GID); err != nil {
		return fmt.Errorf("QP A: %w", err)
	}
	if err := BringUp(b, a.QPN(), p, p.PSNB, p.PSNA, n.B.GID, n.A.GID); err != nil {
		return fmt.Errorf("QP B: %w", err)
	}
	return nil
}

// UDQKey is the Q_Key Connect gives UD QPs.
const UDQKey = 0x11111111

// BringUp moves q from RESET to RTS, connected (RC/UC) to peerQPN at dgid.
func BringUp(q *qp.QP, peerQPN uint32, p RCParams, sq, rq uint32, sgid, dgid ib.GID) error {
	var a qp.QPAttr
	a.State = qp.StateInit
	a.Port = 1
	mask := qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort
	if q.Type() == qp.UD || q.Type() == qp.GSI {
		a.QKey = UDQKey
		mask |= qp.AttrQKey
	} else {
		a.AccessFlags = p.Access
		mask |= qp.AttrAccessFlags
	}
	if err := q.Modify(&a, mask); err != nil {
		return err
	}
	a = qp.QPAttr{State: qp.StateRTR}
	mask = qp.AttrState
	if q.Type() == qp.RC || q.Type() == qp.UC {
		a.AV = qp.AddressVector{DGID: dgid, SGID: sgid, HopLimit: 64}
		a.PathMTU = p.MTU
		a.DestQPN = peerQPN
		a.RQPSN = rq
		mask |= qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
		if q.Type() == qp.RC {
			a.MaxDestRdAtomic = p.RdAtomic
			a.MinRNRTimer = p.MinRNRTimer
			mask |= qp.AttrMaxDestRdAtomic | qp.AttrMinRNRTimer
		}
	}
	if err := q.Modify(&a, mask); err != nil {
		return err
	}
	a = qp.QPAttr{State: qp.StateRTS, SQPSN: sq}
	mask = qp.AttrState | qp.AttrSQPSN
	if q.Type() == qp.RC {
		a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic = p.Timeout, p.RetryCnt, p.RNRRetry, p.RdAtomic
		mask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRdAtomic
	}
	return q.Modify(&a, mask)
}

// Endpoint bundles the verbs objects of one QP for tests.
type Endpoint struct {
	PD       *qp.PD
	SCQ, RCQ *qp.CQ
	QP       *qp.QP
}

// NewEndpoint creates a PD, two CQs and a QP of type t on e.
func NewEndpoint(e *qp.Engine, t qp.QPType, depth int) (*Endpoint, error) {
	pd, err := e.AllocPD()
	if err != nil {
		return nil, err
	}
	scq, err := e.CreateCQ(4 * depth)
	if err != nil {
		return nil, err
	}
	rcq, err := e.CreateCQ(4 * depth)
	if err != nil {
		return nil, err
	}
	q, err := pd.CreateQP(&qp.QPInitAttr{Type: t, SendCQ: scq, RecvCQ: rcq,
		Cap: qp.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 256}})
	if err != nil {
		return nil, err
	}
	return &Endpoint{PD: pd, SCQ: scq, RCQ: rcq, QP: q}, nil
}
