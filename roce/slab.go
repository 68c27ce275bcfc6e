package roce

import (
	"fmt"
	"sync/atomic"

	"github.com/goroce/goroce/qp"
)

// RecvSlab is a slab of equal receive buffers carved from one registered
// region and kept posted on a QP or SRQ: the pattern of receive servers that
// pre-post many receives and hand the received bytes on without copying.
//
// Each buffer's work request ID carries the slab's tag in the upper 32 bits
// and the buffer index in the lower 32, so a completion can be routed back to
// its slab (Owns) and its bytes read in place (Bytes) until Repost returns the
// buffer to the queue.
type RecvSlab struct {
	mr    *MR
	post  func(*RecvWR) error
	size  int
	count int
	tag   uint64
	grh   bool
	sge   [1]SGE
	wr    RecvWR
}

var slabTags atomic.Uint32

// NewRecvSlab allocates count buffers of size bytes (plus the GRHSize area
// for a UD QP), registers them with local write access and posts them all on
// q. size is the largest message a buffer receives.
func (pd *PD) NewRecvSlab(q *QP, count, size int) (*RecvSlab, error) {
	if q == nil || q.d != pd.d {
		return nil, ErrWrongDevice
	}
	grh := q.typ == UD
	return pd.newSlab(q.PostRecv, grh, count, size)
}

// NewSRQSlab is NewRecvSlab for a shared receive queue. grh reserves the
// GRHSize area for UD QPs attached to the SRQ.
func (pd *PD) NewSRQSlab(s *SRQ, count, size int, grh bool) (*RecvSlab, error) {
	if s == nil || s.d != pd.d {
		return nil, ErrWrongDevice
	}
	return pd.newSlab(s.PostRecv, grh, count, size)
}

func (pd *PD) newSlab(post func(*RecvWR) error, grh bool, count, size int) (*RecvSlab, error) {
	if count <= 0 || size <= 0 {
		return nil, fmt.Errorf("roce: receive slab of %d × %d bytes: %w", count, size, qp.ErrInvalidArgument)
	}
	if grh {
		size += GRHSize
	}
	mr, err := pd.RegisterMR(make([]byte, count*size), AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	s := &RecvSlab{mr: mr, post: post, size: size, count: count, grh: grh,
		tag: uint64(slabTags.Add(1)) << 32}
	for i := 0; i < count; i++ {
		if err := s.repost(i); err != nil {
			mr.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *RecvSlab) repost(i int) error {
	// The engine copies the SGE list at post time, so one scratch list
	// serves every post; RecvSlab is not for concurrent Repost calls.
	s.sge[0] = s.mr.SGE(i*s.size, s.size)
	s.wr = RecvWR{ID: s.tag | uint64(i), SGL: s.sge[:]}
	return s.post(&s.wr)
}

// Owns reports whether the completion belongs to one of the slab's buffers.
func (s *RecvSlab) Owns(wc *WorkCompletion) bool {
	return wc.WRID&^0xFFFFFFFF == s.tag && int(wc.WRID&0xFFFFFFFF) < s.count
}

// Bytes returns the received message in place (for UD without the GRH area;
// see GRH). The slice stays valid until the buffer is reposted.
func (s *RecvSlab) Bytes(wc *WorkCompletion) []byte {
	if !s.Owns(wc) {
		return nil
	}
	i := int(wc.WRID & 0xFFFFFFFF)
	b := s.mr.buf[i*s.size : (i+1)*s.size]
	n := int(wc.ByteLen)
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
	i := int(wc.WRID & 0xFFFFFFFF)
	return s.mr.buf[i*s.size : i*s.size+GRHSize]
}

// Repost gives the buffer of a completion back to the receive queue.
func (s *RecvSlab) Repost(wc *WorkCompletion) error {
	if !s.Owns(wc) {
		return fmt.Errorf("roce: completion %#x is not from this slab: %w", wc.WRID, qp.ErrInvalidArgument)
	}
	return s.repost(int(wc.WRID & 0xFFFFFFFF))
}

// MR returns the slab's memory region.
func (s *RecvSlab) MR() *MR { return s.mr }

// Close deregisters the slab's memory. Destroy (or reset) the QP first: the
// buffers are still posted.
func (s *RecvSlab) Close() error { return s.mr.Close() }
