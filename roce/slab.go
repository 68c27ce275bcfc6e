package roce

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/goroce/goroce/internal/qp"
)

// ErrFrameReleased is returned when a receive buffer is released or reposted
// twice, or by a completion older than its current posting.
var ErrFrameReleased = errors.New("roce: receive buffer already released or reposted")

// RecvSlab is a slab of equal receive buffers carved from one registered
// region and kept posted on a QP or SRQ: the pattern of receive servers that
// pre-post many receives and hand the received bytes on without copying.
//
// Each buffer's work request ID carries the slab's tag (bits 40-63), the
// buffer's posting generation (bits 32-39) and the buffer index (bits 0-31),
// so a completion can be routed back to its slab (Owns) and its bytes read
// in place (Bytes, or a Frame) until the buffer is posted again.
//
// Every method is safe for concurrent use: any goroutine may Repost, and
// Frame hands a received buffer to another goroutine, which Releases it.
// Each buffer moves posted → received → posted; its state word makes a
// second Release or Repost of the same reception fail with
// ErrFrameReleased instead of posting the buffer twice.
type RecvSlab struct {
	d     *Device
	mr    *MR
	post  func(*qp.RecvWR) error // the engine's post, called under d.mu
	size  int
	count int
	tag   uint64
	grh   bool
	// state[i] is 2×postings while buffer i is posted (or received and
	// not yet claimed), odd while a Frame holds it.
	state []atomic.Uint32
	sge   [1]SGE // scratch for posting, used under d.mu
	wr    qp.RecvWR
	// closed is set under d.mu when Close deregisters the memory.
	closed atomic.Bool
}

const (
	slabTagShift = 40
	slabGenShift = 32
)

var slabTags atomic.Uint32

// NewRecvSlab allocates count buffers of size bytes (plus the GRHSize area
// for a UD QP), registers them with local write access and posts them all on
// q. size is the largest message a buffer receives.
func (pd *PD) NewRecvSlab(q *QP, count, size int) (*RecvSlab, error) {
	if q == nil || q.d != pd.d {
		return nil, ErrWrongDevice
	}
	grh := q.typ == UD
	return pd.newSlab(q.q.PostRecv, grh, count, size)
}

// NewSRQSlab is NewRecvSlab for a shared receive queue. grh reserves the
// GRHSize area for UD QPs attached to the SRQ.
func (pd *PD) NewSRQSlab(s *SRQ, count, size int, grh bool) (*RecvSlab, error) {
	if s == nil || s.d != pd.d {
		return nil, ErrWrongDevice
	}
	return pd.newSlab(s.srq.PostRecv, grh, count, size)
}

func (pd *PD) newSlab(post func(*qp.RecvWR) error, grh bool, count, size int) (*RecvSlab, error) {
	if count <= 0 || size <= 0 || count > qp.MaxQPWR {
		return nil, fmt.Errorf("roce: receive slab of %d × %d bytes: %w", count, size, qp.ErrInvalidArgument)
	}
	if grh {
		size += GRHSize
	}
	mr, err := pd.RegisterMR(make([]byte, count*size), AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	s := &RecvSlab{d: pd.d, mr: mr, post: post, size: size, count: count, grh: grh,
		tag: uint64(slabTags.Add(1)&0xFFFFFF) << slabTagShift, state: make([]atomic.Uint32, count)}
	d := pd.d
	if err := d.lock(); err != nil {
		mr.Close()
		return nil, err
	}
	for i := 0; i < count; i++ {
		if err = s.postLocked(i, 0); err != nil {
			break
		}
	}
	d.mu.Unlock()
	if err != nil {
		mr.Close()
		return nil, fmt.Errorf("roce: post receive slab: %w", err)
	}
	return s, nil
}

// postLocked posts buffer i for its posting with state word st (even).
// Called with d.mu held; the engine copies the SGE list at post time, so one
// scratch list serves every post.
func (s *RecvSlab) postLocked(i int, st uint32) error {
	s.sge[0] = s.mr.SGE(i*s.size, s.size)
	s.wr = qp.RecvWR{ID: s.tag | uint64(uint8(st>>1))<<slabGenShift | uint64(i), SGL: s.sge[:]}
	err := s.post(&s.wr)
	s.wr.SGL = nil
	return err
}

// Owns reports whether the completion belongs to one of the slab's buffers.
func (s *RecvSlab) Owns(wc *WorkCompletion) bool {
	return wc.WRID>>slabTagShift == s.tag>>slabTagShift && int(wc.WRID&0xFFFFFFFF) < s.count
}

func (s *RecvSlab) index(wc *WorkCompletion) (int, uint8) {
	return int(wc.WRID & 0xFFFFFFFF), uint8(wc.WRID >> slabGenShift)
}

// Bytes returns the received message in place (for UD without the GRH area;
// see GRH). The slice stays valid until the buffer is reposted.
func (s *RecvSlab) Bytes(wc *WorkCompletion) []byte {
	if !s.Owns(wc) {
		return nil
	}
	i, _ := s.index(wc)
	return s.bytes(i, wc.ByteLen)
}

func (s *RecvSlab) bytes(i int, byteLen uint32) []byte {
	b := s.mr.buf[i*s.size : (i+1)*s.size]
	n := int(byteLen)
	if s.grh {
		b = b[GRHSize:]
		n -= GRHSize
	}
	if n < 0 {
		n = 0
	}
	if n > len(b) {
		n = len(b)
	}
	return b[:n]
}

// GRH returns the network-header area of a UD buffer (nil for other QPs).
func (s *RecvSlab) GRH(wc *WorkCompletion) []byte {
	if !s.grh || !s.Owns(wc) {
		return nil
	}
	i, _ := s.index(wc)
	return s.mr.buf[i*s.size : i*s.size+GRHSize]
}

// Repost gives the buffer of a completion back to the receive queue. A
// buffer already reposted (or released through its Frame) is
// ErrFrameReleased.
func (s *RecvSlab) Repost(wc *WorkCompletion) error {
	if err := s.d.lock(); err != nil {
		return err
	}
	err := s.repostLocked(wc)
	s.d.mu.Unlock()
	return err
}

// RepostBatch gives the buffers of several completions back under one
// acquisition of the device lock. It returns how many were reposted; on
// error wcs[n] failed and the rest were not tried.
func (s *RecvSlab) RepostBatch(wcs []WorkCompletion) (int, error) {
	if err := s.d.lock(); err != nil {
		return 0, err
	}
	defer s.d.mu.Unlock()
	for i := range wcs {
		if err := s.repostLocked(&wcs[i]); err != nil {
			return i, err
		}
	}
	return len(wcs), nil
}

func (s *RecvSlab) repostLocked(wc *WorkCompletion) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if !s.Owns(wc) {
		return fmt.Errorf("roce: completion %#x is not from this slab: %w", wc.WRID, qp.ErrInvalidArgument)
	}
	i, gen := s.index(wc)
	st := &s.state[i]
	old := st.Load()
	if uint8(old>>1) != gen {
		return fmt.Errorf("roce: repost of buffer %d: %w", i, ErrFrameReleased)
	}
	// Unclaimed (even): the next posting is old+2; claimed by a Frame
	// (odd): reposting releases the frame.
	next := old + 2
	if old&1 != 0 {
		next = old + 1
	}
	if !st.CompareAndSwap(old, next) {
		return fmt.Errorf("roce: repost of buffer %d: %w", i, ErrFrameReleased)
	}
	if err := s.postLocked(i, next); err != nil {
		st.Store(old)
		return err
	}
	return nil
}

// Frame claims the received buffer of a completion as a Frame: a zero-copy
// view that any goroutine may read and then Release exactly once, which
// posts the buffer again. A completion whose buffer was already claimed or
// reposted is ErrFrameReleased. Frame allocates nothing.
func (s *RecvSlab) Frame(wc *WorkCompletion) (Frame, error) {
	if s.closed.Load() {
		return Frame{}, ErrClosed
	}
	if !s.Owns(wc) {
		return Frame{}, fmt.Errorf("roce: completion %#x is not from this slab: %w", wc.WRID, qp.ErrInvalidArgument)
	}
	i, gen := s.index(wc)
	st := &s.state[i]
	old := st.Load()
	if old&1 != 0 || uint8(old>>1) != gen || !st.CompareAndSwap(old, old+1) {
		return Frame{}, fmt.Errorf("roce: frame of buffer %d: %w", i, ErrFrameReleased)
	}
	return Frame{s: s, idx: uint32(i), state: old + 1, n: wc.ByteLen, imm: wc.Imm, flags: wc.Flags,
		status: wc.Status, qpn: wc.QPN, srcQP: wc.SrcQP}, nil
}

// MR returns the slab's memory region.
func (s *RecvSlab) MR() *MR { return s.mr }

// Close deregisters the slab's memory. Destroy (or reset) the QP first: the
// buffers are still posted. Afterwards Repost, RepostBatch, Frame and
// Frame.Release return ErrClosed.
func (s *RecvSlab) Close() error {
	d := s.d
	if err := d.lock(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if err := d.res.released(&d.res.MR, s.mr.mr.Dereg()); err != nil {
		return err
	}
	s.closed.Store(true)
	return nil
}

// Frame is a received buffer of a RecvSlab, claimed by RecvSlab.Frame: the
// message in place, plus what its completion said. It is a small value:
// copy it to another goroutine freely, but Release it exactly once (a second
// Release is ErrFrameReleased); its bytes are not to be used after that.
type Frame struct {
	s      *RecvSlab
	idx    uint32
	state  uint32 // the buffer's state word while this frame holds it
	n      uint32
	imm    uint32
	flags  WCFlags
	status WCStatus
	qpn    uint32
	srcQP  uint32
}

// Bytes returns the received message in place (for UD without the GRH area).
func (f Frame) Bytes() []byte {
	if f.s == nil {
		return nil
	}
	return f.s.bytes(int(f.idx), f.n)
}

// Len returns the message length (for UD without the GRH area).
func (f Frame) Len() int { return len(f.Bytes()) }

// GRH returns the network-header area of a UD buffer (nil for other QPs).
func (f Frame) GRH() []byte {
	if f.s == nil || !f.s.grh {
		return nil
	}
	i := int(f.idx) * f.s.size
	return f.s.mr.buf[i : i+GRHSize]
}

// Imm returns the immediate data, and whether the message carried one.
func (f Frame) Imm() (uint32, bool) { return f.imm, f.flags&WCWithImm != 0 }

// Status returns the completion status. A receive that failed or was
// flushed has no bytes; release it all the same to recycle the buffer (on a
// QP in the error state the repost completes at once, flushed: stop
// releasing such frames there, or reset the QP first).
func (f Frame) Status() WCStatus { return f.status }

// Flags returns the completion's flags (WCWithImm, WCWithGRH, ...).
func (f Frame) Flags() WCFlags { return f.flags }

// QPN returns the QP the message arrived on (useful with an SRQ); SrcQP the
// sender's QPN for UD.
func (f Frame) QPN() uint32 { return f.qpn }

// SrcQP returns the sending QP of a UD datagram.
func (f Frame) SrcQP() uint32 { return f.srcQP }

// Release posts the buffer again. Any goroutine may call it, once: a
// second call (on this value or a copy) returns ErrFrameReleased and
// changes nothing.
func (f Frame) Release() error {
	s := f.s
	if s == nil {
		return fmt.Errorf("roce: release of a zero Frame: %w", qp.ErrInvalidArgument)
	}
	st := &s.state[f.idx]
	if !st.CompareAndSwap(f.state, f.state+1) {
		return fmt.Errorf("roce: release of buffer %d: %w", f.idx, ErrFrameReleased)
	}
	if err := s.d.lock(); err != nil {
		return err
	}
	err := ErrClosed
	if !s.closed.Load() {
		err = s.postLocked(int(f.idx), f.state+1)
	}
	s.d.mu.Unlock()
	if err != nil {
		st.Store(f.state) // still held: the caller may try again
		return err
	}
	return nil
}
