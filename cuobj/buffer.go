package cuobj

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/goroce/goroce/roce"
)

// Buffer is registered server memory (struct rdma_buffer): one buffer, a
// scatter-gather list of up to MaxSGEntries buffers, or a view over parts
// of a one-entry registered buffer.
type Buffer struct {
	s    *Server
	mrs  []*roce.MR // registered entries; nil for a view
	base *Buffer    // a view's registered buffer
	view []SGOffset // a view's entries, relative to base
	size uint64
	// views counts live views of a registered buffer; closed marks a
	// deregistered buffer or released view.
	views  atomic.Int32
	closed atomic.Bool
}

// SGOffset is one entry of a view (cuObjScatterGatherEntryWithOffset_t):
// Size bytes at Offset of the base buffer.
type SGOffset struct {
	Offset uint64
	Size   uint64
}

// Size returns the buffer's length in bytes (the sum of its entries).
func (b *Buffer) Size() uint64 { return b.size }

// Entries returns the number of scatter-gather entries.
func (b *Buffer) Entries() int {
	if b.base != nil {
		return len(b.view)
	}
	return len(b.mrs)
}

// IsView reports whether b came from View.
func (b *Buffer) IsView() bool { return b.base != nil }

// AllocHostBuffer returns size bytes of memory aligned to the page size
// (allocHostBuffer). The memory belongs to the Go heap: it needs no free
// and stays put while registered. size 0 fails with EINVAL.
func (s *Server) AllocHostBuffer(size int) ([]byte, error) {
	return allocAligned("AllocHostBuffer", size)
}

func allocAligned(op string, size int) ([]byte, error) {
	if size <= 0 {
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "size %d", size)
	}
	page := os.Getpagesize()
	if size > int(^uint(0)>>1)-page {
		return nil, newErr(op, syscall.ENOMEM, ErrInvalid, "size %d", size)
	}
	raw := make([]byte, size+page)
	off := (page - int(uintptr(unsafe.Pointer(&raw[0])))%page) % page
	return raw[off : off+size : off+size], nil
}

// RegisterBuffer registers one host buffer (registerBuffer(ptr, size)).
// It fails with ENODEV when the server is not connected and EINVAL for an
// empty buffer.
func (s *Server) RegisterBuffer(buf []byte) (*Buffer, error) {
	if buf == nil || len(buf) == 0 {
		return nil, newErr("RegisterBuffer", syscall.EINVAL, ErrInvalid, "empty buffer")
	}
	return s.RegisterSG([][]byte{buf})
}

// RegisterSG registers a scatter-gather list of host buffers
// (registerBuffer(sglist)): 1 … MaxSGEntries non-empty entries.
func (s *Server) RegisterSG(sgl [][]byte) (*Buffer, error) {
	const op = "RegisterBuffer"
	if !s.IsConnected() {
		return nil, newErr(op, syscall.ENODEV, ErrNoDevice, "")
	}
	if len(sgl) == 0 || len(sgl) > MaxSGEntries {
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "%d scatter-gather entries, want 1 … %d", len(sgl), MaxSGEntries)
	}
	for i, e := range sgl {
		if len(e) == 0 {
			return nil, newErr(op, syscall.EINVAL, ErrInvalid, "entry %d is empty", i)
		}
	}
	b := &Buffer{s: s}
	for _, e := range sgl {
		mr, err := s.pd.RegisterMR(e, roce.AccessLocalWrite)
		if err != nil {
			for _, m := range b.mrs {
				_ = m.Close()
			}
			return nil, newErr(op, syscall.ENOMEM, ErrInvalid, "%v", err)
		}
		b.mrs = append(b.mrs, mr)
		b.size += uint64(len(e))
	}
	s.telem.debug("register", "entries", len(sgl), "bytes", b.size)
	return b, nil
}

// DeregisterBuffer deregisters a buffer from RegisterBuffer or RegisterSG
// (deRegisterBuffer). Requests still using it fail with a local protection
// error. A view is refused (release it with ReleaseView), as is a buffer
// with live views.
func (s *Server) DeregisterBuffer(b *Buffer) error {
	const op = "DeregisterBuffer"
	switch {
	case b == nil || b.s != s:
		return newErr(op, syscall.EINVAL, ErrInvalid, "not a buffer of this server")
	case b.base != nil:
		return newErr(op, syscall.EINVAL, ErrInvalid, "a view: release it with ReleaseView")
	case b.views.Load() > 0:
		return newErr(op, syscall.EBUSY, ErrInvalid, "%d views still use the buffer", b.views.Load())
	case !b.closed.CompareAndSwap(false, true):
		return newErr(op, syscall.EINVAL, ErrNotRegistered, "already deregistered")
	}
	var first error
	for _, m := range b.mrs {
		if err := m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// View makes a scatter-gather view over a registered one-entry buffer
// (getRDMABufferFromSgList). Each entry must lie inside the base buffer
// (stricter than the C library, which checks only the sum of the sizes);
// the sum must not exceed it either.
func (s *Server) View(base *Buffer, sgl []SGOffset) (*Buffer, error) {
	const op = "View"
	switch {
	case len(sgl) == 0:
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "empty view")
	case base == nil || base.s != s:
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "base is not a buffer of this server")
	case base.base != nil:
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "base is a view")
	case len(base.mrs) != 1:
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "base has %d entries, want 1", len(base.mrs))
	case base.closed.Load():
		return nil, newErr(op, syscall.EINVAL, ErrNotRegistered, "base deregistered")
	case len(sgl) > MaxSGEntries:
		return nil, newErr(op, syscall.EINVAL, ErrInvalid, "%d entries, at most %d", len(sgl), MaxSGEntries)
	}
	var sum uint64
	for i, e := range sgl {
		if e.Size == 0 || e.Offset >= base.size || e.Size > base.size-e.Offset {
			return nil, newErr(op, syscall.EINVAL, ErrRange, "entry %d (%d bytes at %d) outside the %d-byte base", i, e.Size, e.Offset, base.size)
		}
		sum += e.Size
	}
	if sum > base.size {
		return nil, newErr(op, syscall.EINVAL, ErrRange, "views of %d bytes over a %d-byte base", sum, base.size)
	}
	base.views.Add(1)
	return &Buffer{s: s, base: base, view: append([]SGOffset(nil), sgl...), size: sum}, nil
}

// ReleaseView releases a view (putRDMABufferFromSgList); the base stays
// registered.
func (s *Server) ReleaseView(v *Buffer) error {
	const op = "ReleaseView"
	if v == nil || v.s != s || v.base == nil {
		return newErr(op, syscall.EINVAL, ErrInvalid, "not a view of this server")
	}
	if !v.closed.CompareAndSwap(false, true) {
		return newErr(op, syscall.EINVAL, ErrInvalid, "already released")
	}
	v.base.views.Add(-1)
	return nil
}

// sgl fills dst with the scatter-gather list of size bytes at off and
// returns it. Multi-entry buffers ignore off (the seed's behaviour, after
// the range check against the whole size).
func (b *Buffer) sgl(dst []roce.SGE, off, size uint64) []roce.SGE {
	dst = dst[:0]
	if b.base != nil {
		mr := b.base.mrs[0]
		if len(b.view) > 1 {
			off = 0
		}
		for _, e := range b.view {
			if size == 0 {
				break
			}
			if off >= e.Size {
				off -= e.Size
				continue
			}
			n := min(e.Size-off, size)
			dst = append(dst, roce.SGE{Addr: mr.Addr() + e.Offset + off, Length: uint32(n), LKey: mr.LKey()})
			size -= n
			off = 0
		}
		return dst
	}
	if len(b.mrs) > 1 {
		off = 0
	}
	for _, mr := range b.mrs {
		if size == 0 {
			break
		}
		l := uint64(mr.Len())
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, size)
		dst = append(dst, roce.SGE{Addr: mr.Addr() + off, Length: uint32(n), LKey: mr.LKey()})
		size -= n
		off = 0
	}
	return dst
}

func (b *Buffer) String() string {
	if b.base != nil {
		return fmt.Sprintf("view of %d entries, %d bytes", len(b.view), b.size)
	}
	return fmt.Sprintf("buffer of %d entries, %d bytes", len(b.mrs), b.size)
}
