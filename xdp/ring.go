package xdp

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is the bookkeeping shared by the four ring kinds: pointers to the
// producer, consumer and flags words in the mapping, and cached copies of
// the indices so that most calls touch no shared word.
//
// The producing side writes descriptors, then publishes them with an
// atomic store of the producer word (release); the consuming side loads the
// producer word atomically (acquire) before reading descriptors and
// publishes consumption with an atomic store of the consumer word after it
// has finished reading them.
type ring struct {
	mem      []byte
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32

	cachedProd uint32
	cachedCons uint32
}

func (r *ring) init(mem []byte, off unix.XDPRingOffset, size uint32) {
	r.mem = mem
	r.producer = (*uint32)(unsafe.Pointer(&mem[off.Producer]))
	r.consumer = (*uint32)(unsafe.Pointer(&mem[off.Consumer]))
	r.flags = (*uint32)(unsafe.Pointer(&mem[off.Flags]))
	r.size = size
	r.mask = size - 1
	r.cachedProd = atomic.LoadUint32(r.producer)
	r.cachedCons = atomic.LoadUint32(r.consumer)
}

// needWakeup reports whether the kernel asked to be kicked for this ring.
func (r *ring) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// Producer side (fill, TX).

// free returns how many entries can be produced, refreshing the cached
// consumer only when the cache cannot satisfy want.
func (r *ring) free(want uint32) uint32 {
	n := r.size - (r.cachedProd - r.cachedCons)
	if n >= want {
		return n
	}
	r.cachedCons = atomic.LoadUint32(r.consumer)
	return r.size - (r.cachedProd - r.cachedCons)
}

// submit publishes everything produced so far.
func (r *ring) submit() { atomic.StoreUint32(r.producer, r.cachedProd) }

// pending returns how many produced entries the kernel has not consumed yet.
func (r *ring) pending() uint32 {
	r.cachedCons = atomic.LoadUint32(r.consumer)
	return r.cachedProd - r.cachedCons
}

// Consumer side (RX, completion).

// avail returns how many entries are ready to consume, refreshing the cached
// producer only when the cache is empty.
func (r *ring) avail() uint32 {
	n := r.cachedProd - r.cachedCons
	if n > 0 {
		return n
	}
	r.cachedProd = atomic.LoadUint32(r.producer)
	return r.cachedProd - r.cachedCons
}

// release hands n consumed entries back to the kernel.
func (r *ring) release(n uint32) {
	r.cachedCons += n
	atomic.StoreUint32(r.consumer, r.cachedCons)
}

// addrRing is a fill or completion ring: entries are UMEM addresses.
type addrRing struct {
	ring
	addrs []uint64
}

func (r *addrRing) init(mem []byte, off unix.XDPRingOffset, size uint32) {
	r.ring.init(mem, off, size)
	r.addrs = unsafe.Slice((*uint64)(unsafe.Pointer(&mem[off.Desc])), size)
}

// descRing is an RX or TX ring: entries are descriptors.
type descRing struct {
	ring
	descs []unix.XDPDesc
}

func (r *descRing) init(mem []byte, off unix.XDPRingOffset, size uint32) {
	r.ring.init(mem, off, size)
	r.descs = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&mem[off.Desc])), size)
}
