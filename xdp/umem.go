package xdp

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Default sizes.
const (
	DefaultFrameSize = 4096
	DefaultNumFrames = 4096
)

// UMEMConfig describes the shared packet memory.
type UMEMConfig struct {
	// FrameSize is the chunk size: 2048 or 4096 (0 means 4096).
	FrameSize int
	// NumFrames is the number of chunks (0 means 4096).
	NumFrames int
	// Headroom is space the kernel leaves in front of every received frame,
	// in addition to XDP_PACKET_HEADROOM.
	Headroom int
}

func (c *UMEMConfig) normalize() error {
	if c.FrameSize == 0 {
		c.FrameSize = DefaultFrameSize
	}
	if c.NumFrames == 0 {
		c.NumFrames = DefaultNumFrames
	}
	if c.FrameSize != 2048 && c.FrameSize != 4096 {
		return fmt.Errorf("%w: frame size %d (want 2048 or 4096)", ErrBadConfig, c.FrameSize)
	}
	if c.NumFrames < 2 || c.NumFrames > 1<<20 {
		return fmt.Errorf("%w: %d frames", ErrBadConfig, c.NumFrames)
	}
	if c.Headroom < 0 || c.Headroom > c.FrameSize-unix.XDP_PACKET_HEADROOM-128 {
		return fmt.Errorf("%w: headroom %d with %d-byte frames", ErrBadConfig, c.Headroom, c.FrameSize)
	}
	return nil
}

// UMEM is page-aligned packet memory registered with the kernel through the
// first socket that uses it. Further sockets (on other queues or devices)
// share it with XDP_SHARED_UMEM; each socket owns a disjoint range of its
// chunks.
type UMEM struct {
	mu        sync.Mutex
	mem       []byte
	frameSize uint32
	headroom  uint32
	nframes   uint32
	next      uint32 // first chunk not yet handed to a socket
	ownerFD   int    // socket the UMEM is registered with, -1 before
	owner     *Socket
	refs      int  // sockets using the memory
	closed    bool // Close called
	unmapped  bool
}

// NewUMEM maps the packet memory. It is registered with the kernel when the
// first socket is opened on it.
func NewUMEM(cfg UMEMConfig) (*UMEM, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	size := cfg.FrameSize * cfg.NumFrames
	// An anonymous mapping is page aligned, so no chunk straddles a page
	// boundary more than its size demands.
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("xdp: mapping %d-byte UMEM: %w", size, err)
	}
	return &UMEM{
		mem:       mem,
		frameSize: uint32(cfg.FrameSize),
		headroom:  uint32(cfg.Headroom),
		nframes:   uint32(cfg.NumFrames),
		ownerFD:   -1,
	}, nil
}

// FrameSize returns the chunk size.
func (u *UMEM) FrameSize() int { return int(u.frameSize) }

// NumFrames returns the number of chunks.
func (u *UMEM) NumFrames() int { return int(u.nframes) }

// FreeFrames returns how many chunks are not yet owned by a socket.
func (u *UMEM) FreeFrames() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return int(u.nframes - u.next)
}

// Close releases the memory once no socket uses it any more.
func (u *UMEM) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return ErrClosed
	}
	u.closed = true
	return u.maybeUnmapLocked()
}

func (u *UMEM) maybeUnmapLocked() error {
	if u.refs > 0 || u.unmapped || !u.closed {
		return nil
	}
	u.unmapped = true
	return unix.Munmap(u.mem)
}

// take reserves n chunks for a socket; it returns the first chunk index.
func (u *UMEM) take(n uint32) (uint32, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return 0, ErrClosed
	}
	if n == 0 || u.nframes-u.next < n {
		return 0, fmt.Errorf("%w: socket wants %d frames, UMEM has %d left", ErrBadConfig, n, u.nframes-u.next)
	}
	first := u.next
	u.next += n
	u.refs++
	return first, nil
}

// untake undoes take when a socket could not be opened. Chunks are only
// handed back if they were the last ones taken.
func (u *UMEM) untake(first, n uint32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.next == first+n {
		u.next = first
	}
	u.refs--
	_ = u.maybeUnmapLocked()
}

// put drops a socket's reference.
func (u *UMEM) put(s *Socket) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.refs--
	if u.owner == s {
		// Sharing needs the owner's descriptor open; once it is gone new
		// sockets cannot join.
		u.owner = nil
		u.ownerFD = -2
	}
	_ = u.maybeUnmapLocked()
}
