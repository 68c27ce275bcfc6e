package rsocket

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"unsafe"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// iomapMR is one riomap registration.
type iomapMR struct {
	mr      *roce.MR
	buf     []byte
	offset  uint64
	index   int  // slot in the peer's iomap table, -1 for local-only maps
	pending bool // not yet published to the peer
}

// ErrNoIOMap reports an IOWrite to an offset the peer has not mapped, or
// an IOMap beyond the peer's RDMA_IOMAPSIZE.
var ErrNoIOMap = errors.New("rsocket: no iomap entry for that offset")

// errNoIOMapSlot is riomap's ENOMEM: every entry of the peer's iomap
// table is taken, or it has none (its RDMA_IOMAPSIZE was 0 when it took
// the connection).
var errNoIOMapSlot = fmt.Errorf("rsocket: no free entry in the peer's iomap table: %w", syscall.ENOMEM)

// IOMap registers buf for the peer's IOWrites (riomap with PROT_WRITE), at
// stream offset offset (-1: the buffer's address). The mapping is
// published to the peer with the next Write or IOWrite, as librdmacm
// does; it is usable once the peer has received data sent after it. The
// peer must have set Options.IOMapSize; buf must stay untouched by the
// garbage collector's view (keep a reference) until IOUnmap. With
// remoteWrite false the buffer is only registered (PROT_NONE).
func (c *Conn) IOMap(buf []byte, remoteWrite bool, offset int64) (int64, error) {
	if len(buf) == 0 {
		return -1, syscall.EINVAL
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return -1, net.ErrClosed
	}
	index := -1
	if remoteWrite {
		used := make([]bool, c.peer.IOMapSize())
		for _, m := range c.iomaps {
			if m.index >= 0 {
				used[m.index] = true
			}
		}
		for i, u := range used {
			if !u {
				index = i
				break
			}
		}
		if index < 0 {
			return -1, errNoIOMapSlot
		}
	}
	access := roce.AccessLocalWrite
	if remoteWrite {
		access |= roce.AccessRemoteWrite
	}
	mr, err := c.ep.pd.RegisterMR(buf, access)
	if err != nil {
		return -1, err
	}
	if offset == -1 {
		offset = int64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	}
	c.iomaps = append(c.iomaps, &iomapMR{mr: mr, buf: buf, offset: uint64(offset), index: index, pending: remoteWrite})
	if remoteWrite {
		c.iomapPending++
	}
	return offset, nil
}

// IOUnmap removes the mapping of buf (riounmap). Nothing goes to the peer:
// its copy of the entry stays, and an IOWrite it sends there afterwards
// fails the connection.
func (c *Conn) IOUnmap(buf []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.iomaps {
		if unsafe.SliceData(m.buf) == unsafe.SliceData(buf) && len(m.buf) == len(buf) {
			if m.pending {
				c.iomapPending--
			}
			c.iomaps = append(c.iomaps[:i], c.iomaps[i+1:]...)
			return m.mr.Close()
		}
	}
	return syscall.EINVAL
}

// sendIOMapsLocked publishes queued mappings while the sender may send
// (rs_send_iomaps); it reports whether none is left.
func (c *Conn) sendIOMapsLocked() bool {
	for c.iomapPending > 0 && c.err == nil {
		var m *iomapMR
		for _, x := range c.iomaps {
			if x.pending {
				m = x
				break
			}
		}
		w, err := c.w.Send.WriteIOMap(m.index)
		if err != nil {
			return false
		}
		e := wire.IOMapEntry{Offset: m.offset, SGE: wire.SGE{Addr: m.mr.Addr(), Key: m.mr.RKey(), Length: uint32(m.mr.Len())}}
		wr := c.resetWR(kindIOMap<<kindShift, roce.WRRDMAWriteWithImm)
		b := c.scratch()
		e.Put(b, c.entry)
		wr.Imm, wr.RemoteAddr, wr.RKey = uint32(w.Imm), w.Addr, w.Key
		wr.Flags |= roce.SendInline
		wr.Inline = b
		// The entry counts against the send buffer, as in librdmacm.
		c.shead = (c.shead + wire.IOMapEntryLen) % len(c.ep.sbuf)
		c.postLocked()
		m.pending = false
		c.iomapPending--
	}
	return c.iomapPending == 0
}

// findIOMapLocked is rs_find_iomap over the peer's published entries.
func (c *Conn) findIOMapLocked(off uint64) *wire.IOMapEntry {
	for i := range c.peerMaps {
		if e := &c.peerMaps[i]; e.Length != 0 && e.Contains(off) {
			return e
		}
	}
	return nil
}

// IOWrite writes p directly into the peer's iomapped buffer at stream
// offset offset (riowrite): plain RDMA WRITEs, of which the peer is not
// told; RC ordering places them before anything written later.
func (c *Conn) IOWrite(p []byte, offset int64) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.enter()
	defer c.leave()
	c.mu.Lock()
	defer c.mu.Unlock()
	done := 0
	for {
		if err := c.writableLocked(); err != nil {
			return done, c.opError("iowrite", err)
		}
		if c.wdl.exceeded() {
			return done, c.opError("iowrite", os.ErrDeadlineExceeded)
		}
		if done == len(p) {
			return done, nil
		}
		if c.w.Send.Blocked() != nil {
			c.progressLocked()
		}
		c.batching = true
		for c.sendIOMapsLocked() && done < len(p) && c.err == nil && c.w.Send.Blocked() == nil {
			off := uint64(offset) + uint64(done)
			e := c.findIOMapLocked(off)
			if e == nil {
				c.batching = false
				c.flushLocked()
				if done > 0 {
					return done, nil
				}
				return 0, c.opError("iowrite", ErrNoIOMap)
			}
			want := uint32(min(uint64(len(p)-done), wire.MaxTransfer, e.Offset+uint64(e.Length)-off))
			n, err := c.w.Send.WriteDirect(want)
			if err != nil {
				break
			}
			c.postDataLocked(p[done:done+int(n)], kindIOWrite, roce.WRRDMAWrite, 0, e.Addr+off-e.Offset, e.Key)
			done += int(n)
		}
		c.batching = false
		c.flushLocked()
		if done < len(p) && c.err == nil {
			c.awaitLocked(c.wdl, c.wwake)
		}
	}
}

// freeIOMaps deregisters what IOMap registered.
func (c *Conn) freeIOMaps() error {
	var errs []error
	for _, m := range c.iomaps {
		errs = append(errs, m.mr.Close())
	}
	c.iomaps = nil
	return errors.Join(errs...)
}

// IOSync orders the caller after every byte the peer's IOWrites placed in
// this side's iomapped buffers so far. IOWrites raise no completion, so a
// program that polls a buffer for a marker byte (as riostream does) calls
// it before each look.
func (c *Conn) IOSync() { c.ep.rmr.Sync() }
