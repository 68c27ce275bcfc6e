package memlink

import (
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
)

// SwitchConfig describes one egress port of a switch: a FIFO shared by
// every sender, drained at Rate, holding at most Buffer bytes, marking
// ECN-capable frames with RED as DCQCN's switches do (Zhu et al.,
// SIGCOMM 2015, §3.1): a frame that arrives to a queue of q bytes is
// marked CE with probability 0 below Kmin, Pmax×(q-Kmin)/(Kmax-Kmin)
// between Kmin and Kmax, and 1 above Kmax.
type SwitchConfig struct {
	Rate   int64 // bits/s
	Buffer int   // bytes; a frame that does not fit is dropped
	Kmin   int   // bytes
	Kmax   int   // bytes
	Pmax   float64
	// NoECN turns marking off (the switch only queues and drops).
	NoECN bool
	// MarkAtDequeue judges a frame by the queue it leaves behind when it
	// leaves, rather than by the queue it joins: the mark then reaches
	// the receiver without waiting through the queue it reports.
	MarkAtDequeue bool
	// Seed makes the marking decisions reproducible.
	Seed uint64
}

// SwitchStats counts what the port did.
type SwitchStats struct {
	Frames, Bytes   uint64 // accepted
	Dropped         uint64 // frames that did not fit
	Marked          uint64 // frames marked CE
	Departed        uint64 // frames sent on
	DepartedBytes   uint64
	QueueP50        int // bytes in the queue at arrivals, 50th percentile
	QueueP99        int // and 99th
	QueueMax        int
	QueueSamples    int
	ArrivalsAtEmpty int
}

// Switch is the egress port of SwitchConfig. It is a pure model: the
// caller passes the time to every call (an injected clock), frames arrive
// and leave in call order, and nothing runs between calls, so a run is
// reproducible from its inputs and Seed. Frames are whole Ethernet frames
// (IPv4 or IPv6); Enqueue copies them. Not safe for concurrent use.
type Switch struct {
	cfg   SwitchConfig
	rng   *rand.Rand
	q     []entry // in departure order
	head  int
	bytes int           // queued and not departed at the last call
	free  time.Duration // when the port finishes the last queued frame
	bufs  [][]byte
	stats SwitchStats
	occ   []int
}

type entry struct {
	b      []byte
	depart time.Duration
}

// NewSwitch returns a port with cfg.
func NewSwitch(cfg SwitchConfig) (*Switch, error) {
	if cfg.Rate <= 0 || cfg.Buffer <= 0 || cfg.Kmin < 0 || cfg.Kmax < cfg.Kmin || cfg.Pmax < 0 || cfg.Pmax > 1 {
		return nil, errors.New("memlink: invalid switch configuration")
	}
	return &Switch{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9E3779B97F4A7C15))}, nil
}

// serial is how long the port takes to send n bytes (the frame plus the
// Ethernet preamble, FCS and gap: 24 bytes).
func (s *Switch) serial(n int) time.Duration {
	return time.Duration(int64(n+24) * 8 * int64(time.Second) / s.cfg.Rate)
}

// settle forgets frames that have left by now from the queue's size.
func (s *Switch) settle(now time.Duration) {
	s.bytes = 0
	for i := s.head; i < len(s.q); i++ {
		if s.q[i].depart > now {
			s.bytes += len(s.q[i].b)
		}
	}
}

// Enqueue offers frame to the port at now. It reports false for a frame
// dropped because the buffer is full.
func (s *Switch) Enqueue(now time.Duration, frame []byte) bool {
	s.settle(now)
	q := s.bytes
	s.occ = append(s.occ, q)
	if q == 0 {
		s.stats.ArrivalsAtEmpty++
	}
	if q+len(frame) > s.cfg.Buffer {
		s.stats.Dropped++
		return false
	}
	var b []byte
	if n := len(s.bufs); n > 0 {
		b, s.bufs = s.bufs[n-1][:0], s.bufs[:n-1]
	}
	b = append(b, frame...)
	if !s.cfg.NoECN && !s.cfg.MarkAtDequeue && s.mark(q) {
		if markCE(b) {
			s.stats.Marked++
		}
	}
	start := max(now, s.free)
	s.free = start + s.serial(len(b))
	s.q = append(s.q, entry{b: b, depart: s.free})
	s.stats.Frames++
	s.stats.Bytes += uint64(len(b))
	return true
}

// mark draws RED's decision for an arrival to a queue of q bytes.
func (s *Switch) mark(q int) bool {
	c := &s.cfg
	switch {
	case q <= c.Kmin:
		return false
	case q >= c.Kmax:
		return true
	}
	p := c.Pmax * float64(q-c.Kmin) / float64(c.Kmax-c.Kmin)
	return s.rng.Float64() < p
}

// markCE sets CE in an ECN-capable frame's IP header (and mends the IPv4
// checksum); a Not-ECT frame is left alone. It reports whether it marked.
func markCE(b []byte) bool {
	fr, err := link.ParseFrame(b)
	if err != nil || fr.TOS&3 == 0 {
		return false
	}
	// ECN is the low two bits of the TOS byte or traffic class; CE is 3.
	if fr.Version == 4 {
		ip := ib.IPv4(b[fr.IPOffset:])
		ip.SetTOS(ip.TOS() | ecnCE)
		ip.UpdateChecksum()
		return true
	}
	ip := ib.IPv6(b[fr.IPOffset:])
	ip.SetTrafficClass(ip.TrafficClass() | ecnCE)
	return true
}

// ecnCE is the ECN codepoint Congestion Experienced (RFC 3168).
const ecnCE = 3

// behind returns the bytes queued after the frame at s.head that leaves at
// t.
func (s *Switch) behind(t time.Duration) int {
	n := 0
	for i := s.head; i < len(s.q); i++ {
		if s.q[i].depart > t {
			n += len(s.q[i].b)
		}
	}
	return n
}

// Dequeue hands fn every frame that has left the port by now, in order;
// the frame is valid only during the call.
func (s *Switch) Dequeue(now time.Duration, fn func(frame []byte)) int {
	n := 0
	for s.head < len(s.q) && s.q[s.head].depart <= now {
		e := s.q[s.head]
		s.q[s.head] = entry{}
		s.head++
		s.stats.Departed++
		s.stats.DepartedBytes += uint64(len(e.b))
		if s.cfg.MarkAtDequeue && !s.cfg.NoECN && s.mark(s.behind(e.depart)) && markCE(e.b) {
			s.stats.Marked++
		}
		fn(e.b)
		s.bufs = append(s.bufs, e.b)
		n++
	}
	if s.head == len(s.q) {
		s.q, s.head = s.q[:0], 0
	}
	return n
}

// NextDeparture returns when the next queued frame leaves.
func (s *Switch) NextDeparture() (time.Duration, bool) {
	if s.head == len(s.q) {
		return 0, false
	}
	return s.q[s.head].depart, true
}

// Stats returns the counters and the queue's occupancy percentiles, as
// seen by arriving frames.
func (s *Switch) Stats() SwitchStats {
	st := s.stats
	if len(s.occ) > 0 {
		o := slices.Clone(s.occ)
		slices.Sort(o)
		st.QueueP50 = o[len(o)/2]
		st.QueueP99 = o[len(o)*99/100]
		st.QueueMax = o[len(o)-1]
		st.QueueSamples = len(o)
	}
	return st
}

// ResetStats starts the counters and occupancy samples afresh (after a
// warm-up).
func (s *Switch) ResetStats() {
	s.stats = SwitchStats{}
	s.occ = s.occ[:0]
}
