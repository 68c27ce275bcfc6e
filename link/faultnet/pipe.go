package faultnet

import (
	"time"
)

// Config describes the impairments of one direction of a path. The zero
// value is a perfect, instantaneous FIFO.
type Config struct {
	// Seed selects the pseudo-random sequence; equal seeds give equal runs.
	Seed uint64

	// Loss is the probability that a pushed packet is silently dropped.
	Loss float64
	// Duplicate is the probability that a delivered packet is delivered
	// twice (the copy follows the original immediately).
	Duplicate float64
	// Reorder is the probability that a packet is held back and delivered
	// after the next ReorderDepth packets pushed behind it.
	Reorder float64
	// Corrupt is the probability that one byte of a packet copy is flipped
	// (XORed with a random non-zero value).
	Corrupt float64

	// Delay is the one-way latency added to every packet.
	Delay time.Duration
	// Jitter adds a uniform offset in [-Jitter, +Jitter] to Delay. Jitter
	// alone never reorders: a packet is never due before the one pushed
	// before it (as with a real FIFO queue); use Reorder for reordering.
	Jitter time.Duration

	// ReorderDepth is how many later packets overtake a reordered one
	// (default 1).
	ReorderDepth int
	// ReorderTimeout bounds how long a reordered packet waits for
	// ReorderDepth successors before it is released anyway (default 10ms),
	// so that the tail of a burst is never held forever.
	ReorderTimeout time.Duration

	// Bandwidth, in bits per second, adds serialization delay: packets
	// leave one after another at this rate before Delay applies. Zero means
	// unlimited.
	Bandwidth int64
	// QueueLimit caps the number of packets in flight; pushes beyond it are
	// tail-dropped (counted in Stats.Overflowed). Zero means unlimited.
	QueueLimit int
}

// Stats counts what a Pipe did. Delivered includes duplicates.
type Stats struct {
	Pushed     uint64 // packets given to Push
	Delivered  uint64 // packets handed out by Pop/PopBatch
	Dropped    uint64 // packets lost at random (Loss)
	Overflowed uint64 // packets tail-dropped by QueueLimit
	Duplicated uint64 // extra copies created (Duplicate)
	Reordered  uint64 // packets held back behind later ones (Reorder)
	Corrupted  uint64 // packet copies with a flipped byte (Corrupt)
}

type entry struct {
	due time.Duration
	seq uint64
	buf []byte
}

type held struct {
	entry
	remaining int
	deadline  time.Duration
}

// Pipe is one direction of an impaired path. It is not safe for concurrent
// use; callers serialize Push and Pop (the memory link holds a mutex).
type Pipe struct {
	cfg   Config
	rng   rng
	seq   uint64
	queue []entry // min-heap on (due, seq)
	held  []held  // reordered packets waiting for successors, in push order
	pool  pool
	batch [][]byte
	bufs  [][]byte

	lastDue time.Duration // due time of the last in-order packet
	txFree  time.Duration // when the serializer is next idle (Bandwidth)
	stats   Stats
}

const (
	defaultReorderDepth   = 1
	defaultReorderTimeout = 10 * time.Millisecond
)

// New returns a Pipe with the given impairments.
func New(cfg Config) *Pipe {
	if cfg.ReorderDepth <= 0 {
		cfg.ReorderDepth = defaultReorderDepth
	}
	if cfg.ReorderTimeout <= 0 {
		cfg.ReorderTimeout = defaultReorderTimeout
	}
	return &Pipe{cfg: cfg, rng: newRNG(cfg.Seed)}
}

// Config returns the configuration in effect (with defaults filled in).
func (p *Pipe) Config() Config { return p.cfg }

// Stats returns the counters so far.
func (p *Pipe) Stats() Stats { return p.stats }

// Len returns the number of packets in flight.
func (p *Pipe) Len() int { return len(p.queue) + len(p.held) }

// Push offers pkt to the pipe at time now. The bytes are copied into a
// pooled buffer, so the caller may reuse pkt at once.
func (p *Pipe) Push(now time.Duration, pkt []byte) {
	p.stats.Pushed++
	if p.rng.chance(p.cfg.Loss) {
		p.stats.Dropped++
		return
	}
	dup := p.rng.chance(p.cfg.Duplicate)
	reorder := p.rng.chance(p.cfg.Reorder)
	copies := 1
	if dup {
		copies = 2
	}
	if p.cfg.QueueLimit > 0 && p.Len()+copies > p.cfg.QueueLimit {
		p.stats.Overflowed++
		return
	}

	due := p.schedule(now, len(pkt))
	for c := 0; c < copies; c++ {
		buf := p.pool.get(len(pkt))
		copy(buf, pkt)
		if len(buf) > 0 && p.rng.chance(p.cfg.Corrupt) {
			i := p.rng.intn(uint64(len(buf)))
			buf[i] ^= byte(1 + p.rng.intn(255))
			p.stats.Corrupted++
		}
		p.seq++
		e := entry{due: due, seq: p.seq, buf: buf}
		if c == 0 && reorder {
			p.stats.Reordered++
			p.held = append(p.held, held{entry: e, remaining: p.cfg.ReorderDepth, deadline: due + p.cfg.ReorderTimeout})
			continue
		}
		if c == 1 {
			p.stats.Duplicated++
		}
		p.heapPush(e)
		p.overtake(e)
	}
}

// schedule returns the due time of a packet of n bytes pushed at now.
func (p *Pipe) schedule(now time.Duration, n int) time.Duration {
	start := now
	if p.cfg.Bandwidth > 0 {
		if p.txFree > start {
			start = p.txFree
		}
		start += time.Duration(int64(n) * 8 * int64(time.Second) / p.cfg.Bandwidth)
		p.txFree = start
	}
	due := start + p.cfg.Delay
	if j := p.cfg.Jitter; j > 0 {
		due += time.Duration(p.rng.intn(uint64(2*j)+1)) - j
	}
	if due < now {
		due = now
	}
	if due < p.lastDue {
		due = p.lastDue
	}
	p.lastDue = due
	return due
}

// overtake records that e has been scheduled behind every held packet,
// releasing those that have now been overtaken ReorderDepth times.
func (p *Pipe) overtake(e entry) {
	if len(p.held) == 0 {
		return
	}
	kept := p.held[:0]
	for _, h := range p.held {
		h.remaining--
		if h.remaining > 0 {
			kept = append(kept, h)
			continue
		}
		h.due = max(h.due, e.due)
		p.seq++
		h.seq = p.seq
		p.heapPush(h.entry)
	}
	clear(p.held[len(kept):])
	p.held = kept
}

// releaseExpired moves held packets whose timeout passed into the queue.
func (p *Pipe) releaseExpired(now time.Duration) {
	if len(p.held) == 0 {
		return
	}
	kept := p.held[:0]
	for _, h := range p.held {
		if h.deadline > now {
			kept = append(kept, h)
			continue
		}
		h.due = h.deadline
		p.seq++
		h.seq = p.seq
		p.heapPush(h.entry)
	}
	clear(p.held[len(kept):])
	p.held = kept
}

// NextDue reports when the next packet becomes deliverable, if any is in
// flight.
func (p *Pipe) NextDue() (time.Duration, bool) {
	var next time.Duration
	ok := false
	if len(p.queue) > 0 {
		next, ok = p.queue[0].due, true
	}
	for _, h := range p.held {
		if !ok || h.deadline < next {
			next, ok = h.deadline, true
		}
	}
	return next, ok
}

// Pop calls fn for every packet due at or before now, in delivery order,
// and returns how many it delivered. pkt is valid only during fn. fn may
// call Push; a packet it pushes that is already due is delivered by the
// same call.
func (p *Pipe) Pop(now time.Duration, fn func(pkt []byte)) int {
	p.releaseExpired(now)
	n := 0
	for len(p.queue) > 0 && p.queue[0].due <= now {
		e := p.heapPop()
		p.stats.Delivered++
		n++
		fn(e.buf)
		p.pool.put(e.buf)
	}
	return n
}

// PopBatch hands up to limit packets due at or before now to fn in one
// call, in delivery order, and returns how many. The slices are valid only
// during fn. limit <= 0 means no limit. fn may call Push.
func (p *Pipe) PopBatch(now time.Duration, limit int, fn func(pkts [][]byte)) int {
	p.releaseExpired(now)
	batch := p.batch[:0]
	for len(p.queue) > 0 && p.queue[0].due <= now && (limit <= 0 || len(batch) < limit) {
		batch = append(batch, p.heapPop().buf)
	}
	n := len(batch)
	if n == 0 {
		return 0
	}
	p.stats.Delivered += uint64(n)
	// Detach the batch while fn runs so that a nested PopBatch is safe.
	p.batch = nil
	fn(batch)
	for i, b := range batch {
		p.pool.put(b)
		batch[i] = nil
	}
	p.batch = batch[:0]
	return n
}

// Take moves up to limit packets due at or before now out of the pipe,
// appending them to dst in delivery order, and returns the extended slice.
// The buffers belong to the caller until it hands them back with Release;
// this lets a caller deliver them without holding its lock on the pipe.
// limit <= 0 means no limit.
func (p *Pipe) Take(now time.Duration, limit int, dst [][]byte) [][]byte {
	p.releaseExpired(now)
	n := 0
	for len(p.queue) > 0 && p.queue[0].due <= now && (limit <= 0 || n < limit) {
		dst = append(dst, p.heapPop().buf)
		n++
	}
	p.stats.Delivered += uint64(n)
	return dst
}

// Release returns buffers obtained from Take to the pool and clears bufs.
func (p *Pipe) Release(bufs [][]byte) {
	for i, b := range bufs {
		p.pool.put(b)
		bufs[i] = nil
	}
}

func less(a, b entry) bool {
	if a.due != b.due {
		return a.due < b.due
	}
	return a.seq < b.seq
}

func (p *Pipe) heapPush(e entry) {
	p.queue = append(p.queue, e)
	q := p.queue
	i := len(q) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !less(q[i], q[parent]) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (p *Pipe) heapPop() entry {
	q := p.queue
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = entry{}
	q = q[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		m := l
		if r := l + 1; r < len(q) && less(q[r], q[l]) {
			m = r
		}
		if !less(q[m], q[i]) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	p.queue = q
	return top
}
