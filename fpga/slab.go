package fpga

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/goroce/goroce/roce"
)

// rxSlab is every use the server makes of its receive slab and completion
// queue, kept in this one file so that it can move to the device's
// zero-copy receive API (RecvSlab frame views with concurrent Repost,
// RepostBatch and a many-waiter CQ.Wait) without touching the rest of the
// package.
//
// Today it posts its own receives instead of using roce.RecvSlab for two
// reasons: the gen-1 data path needs the slab registered for remote write
// (RecvSlab registers local write only), and consumers release frames from
// any goroutine (RecvSlab.Repost is not safe for concurrent use). The work
// request ID of a receive is its slot number, as in Rogue.
type rxSlab struct {
	cq    *roce.CQ
	mr    *roce.MR
	qp    *roce.QP
	buf   []byte
	size  int
	count int

	mu     sync.Mutex // serialises reposts (scratch WRs) against close
	closed bool
	wr     roce.RecvWR
	sge    [1]roce.SGE
	wrs    []roce.RecvWR // repostBatch's, one per slot
	sges   []roce.SGE

	// posted holds per slot whether its receive is on the queue: set
	// (under mu) before the slot is posted, cleared by take when its
	// completion arrives. A slot is posted only when it is not, and taken
	// only when it is, so each completion gives the slot back at most once
	// and a batch never holds more than count slots, whatever the
	// completions and releases were.
	posted []atomic.Bool
	// badRepost counts reposts of a slot already posted, ignored.
	badRepost atomic.Uint64
}

// slabAlign is the slab's alignment, as Rogue's aligned_alloc.
const slabAlign = 4096

// newRxSlab allocates count slots of size bytes (4096-aligned), registers
// them for local and remote access and creates the completion queue the
// QP's both queues use.
func newRxSlab(dev *roce.Device, pd *roce.PD, count, size int) (*rxSlab, error) {
	if uint64(count)*uint64(size) >= 1<<32 {
		// The FPGA's MR length field is 32 bits wide.
		return nil, fmt.Errorf("fpga: slab of %d × %d bytes does not fit the FPGA's 32-bit MR length: %w", count, size, ErrInvalidSetting)
	}
	raw := make([]byte, count*size+slabAlign)
	off := 0
	if r := int(uintptrOf(raw) % slabAlign); r != 0 {
		off = slabAlign - r
	}
	buf := raw[off : off+count*size : off+count*size]
	mr, err := pd.RegisterMR(buf, roce.AccessLocalWrite|roce.AccessRemoteWrite|roce.AccessRemoteRead)
	if err != nil {
		return nil, err
	}
	cq, err := dev.CreateCQ(count + 1)
	if err != nil {
		mr.Close()
		return nil, err
	}
	return &rxSlab{cq: cq, mr: mr, buf: buf, size: size, count: count,
		wrs: make([]roce.RecvWR, count), sges: make([]roce.SGE, count), posted: make([]atomic.Bool, count)}, nil
}

// attach names the QP the slab's receives are posted on.
func (s *rxSlab) attach(q *roce.QP) { s.qp = q }

// postAll posts every slot (before RTR, as Rogue does).
func (s *rxSlab) postAll() error {
	for i := 0; i < s.count; i++ {
		if err := s.repost(i); err != nil {
			return err
		}
	}
	return nil
}

// take claims slot i for its completion: it reports whether the slot's
// receive was posted. A second completion of a slot not posted again since
// gets false.
func (s *rxSlab) take(i int) bool {
	return i >= 0 && i < s.count && s.posted[i].CompareAndSwap(true, false)
}

// give marks slot i posted; false (counted) if it is out of range or
// posted already. The caller holds mu.
func (s *rxSlab) give(i int) bool {
	if i < 0 || i >= s.count || !s.posted[i].CompareAndSwap(false, true) {
		s.badRepost.Add(1)
		return false
	}
	return true
}

// repost gives slot i back to the receive queue. It is safe from any
// goroutine; after close it does nothing, and so does a repost of a slot
// already posted (counted in badRepost).
func (s *rxSlab) repost(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return roce.ErrClosed
	}
	if !s.give(i) {
		return nil
	}
	s.sge[0] = s.mr.SGE(i*s.size, s.size)
	s.wr = roce.RecvWR{ID: uint64(i), SGL: s.sge[:]}
	return s.qp.PostRecv(&s.wr)
}

// repostBatch gives the slots back to the receive queue in order, under one
// device lock: the receive goroutine's reposts of a completion batch cost
// one lock round instead of one per frame. A slot already posted, or
// listed twice, is counted (badRepost) and skipped, so the batch holds at
// most count work requests however long slots is.
func (s *rxSlab) repostBatch(slots []int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return roce.ErrClosed
	}
	k := 0
	for _, i := range slots {
		if !s.give(int(i)) {
			continue
		}
		// give accepts each slot once until it is taken again: k < count.
		s.sges[k] = s.mr.SGE(int(i)*s.size, s.size)
		s.wrs[k] = roce.RecvWR{ID: uint64(i), SGL: s.sges[k : k+1 : k+1]}
		k++
	}
	if k == 0 {
		return nil
	}
	_, err := s.qp.PostRecvBatch(s.wrs[:k])
	return err
}

// bytes returns n bytes of slot i in place.
func (s *rxSlab) bytes(i, n int) []byte {
	return s.buf[i*s.size : i*s.size+n : (i+1)*s.size]
}

// poll moves completions into wc; when there are none it waits until there
// are, or ctx ends (its error is returned).
func (s *rxSlab) poll(ctx context.Context, wc []roce.WorkCompletion) (int, error) {
	for {
		if n := s.cq.Poll(wc); n > 0 {
			return n, nil
		}
		if err := s.cq.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// close stops reposting and frees the region and CQ; the QP must be
// destroyed first. Frames still held keep their bytes readable (the memory
// is ordinary Go memory), but their release does nothing.
func (s *rxSlab) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.mr.Close()
	s.cq.Close()
}
