package fpga

import "github.com/goroce/goroce/fpga/wire"

// Frame is one frame the FPGA sent: a view of its slab slot with the
// channel and counter of its immediate. It is a small value; copies share
// the reference the consumer holds.
type Frame struct {
	s    *Server
	slot uint32
	gen  uint32
	n    uint32
	imm  uint32
}

// Data returns the payload in place. It is valid until the frame's last
// reference is released.
func (f Frame) Data() []byte {
	if f.s == nil {
		return nil
	}
	return f.s.slab.bytes(int(f.slot), int(f.n))
}

// Len returns the payload length.
func (f Frame) Len() int { return int(f.n) }

// Channel returns the channel (low byte of the immediate).
func (f Frame) Channel() uint8 { return wire.Imm(f.imm).Channel() }

// Counter returns the FPGA's frame counter (upper 24 bits of the immediate;
// diagnostic, wrapping).
func (f Frame) Counter() uint32 { return wire.Imm(f.imm).Counter() }

// Imm returns the raw immediate.
func (f Frame) Imm() uint32 { return f.imm }

// Slot returns the slab slot holding the frame.
func (f Frame) Slot() int { return int(f.slot) }

// Retain adds a reference: the frame stays valid past AcceptFrame until a
// matching Release.
func (f Frame) Retain() {
	if f.s == nil {
		return
	}
	r := &f.s.refs[f.slot]
	for {
		v := r.Load()
		if uint32(v>>32) != f.gen || uint32(v) == 0 {
			f.s.badRelease.Add(1)
			return
		}
		if r.CompareAndSwap(v, v+1) {
			return
		}
	}
}

// Release drops a reference; the last one posts the slot's receive again.
// It is safe from any goroutine. Releasing more often than the frame was
// retained is counted (Stats.BadRelease) and otherwise ignored.
func (f Frame) Release() {
	if f.s != nil && f.s.unref(f) {
		f.s.slab.repost(int(f.slot))
	}
}
