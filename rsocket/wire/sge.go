package wire

import "encoding/binary"

// SGE is struct rs_sge: a remote buffer. Member order on the wire is addr,
// key, length (key before length).
type SGE struct {
	Addr   uint64
	Key    uint32
	Length uint32
}

// End returns Addr+Length and whether that wraps past 2^64.
func (s SGE) End() (uint64, bool) {
	e := s.Addr + uint64(s.Length)
	return e, e < s.Addr
}

// Overlaps reports whether two non-empty SGEs share a byte (keys are not
// compared: one MR may hold both).
func (s SGE) Overlaps(t SGE) bool {
	if s.Length == 0 || t.Length == 0 {
		return false
	}
	se, _ := s.End()
	te, _ := t.End()
	return s.Addr < te && t.Addr < se
}

// Put writes s into b[:16] in byte order o.
func (s SGE) Put(b []byte, o binary.ByteOrder) {
	_ = b[SGELen-1]
	o.PutUint64(b[0:8], s.Addr)
	o.PutUint32(b[8:12], s.Key)
	o.PutUint32(b[12:16], s.Length)
}

// ParseSGE reads an SGE from b in byte order o without judging it.
func ParseSGE(b []byte, o binary.ByteOrder) (SGE, error) {
	if len(b) < SGELen {
		return SGE{}, errShort
	}
	return SGE{Addr: o.Uint64(b[0:8]), Key: o.Uint32(b[8:12]), Length: o.Uint32(b[12:16])}, nil
}

// ParseAdvert reads an SGE a peer wrote into a target SGL slot (the 16-byte
// payload of an RS_OP_SGL write) and checks it can take data: non-zero
// length, no address wrap.
func ParseAdvert(b []byte, o binary.ByteOrder) (SGE, error) {
	s, err := ParseSGE(b, o)
	if err != nil {
		return s, err
	}
	if s.Length == 0 {
		return s, errZeroLength
	}
	if _, wrap := s.End(); wrap {
		return s, errWrap
	}
	return s, nil
}

// IOMapEntry is struct rs_iomap: a remote buffer that riowrite addresses by
// Offset (the peer's riomap offset) instead of by address.
type IOMapEntry struct {
	Offset uint64
	SGE
}

// Put writes e into b[:24] in byte order o: offset, addr, key, length.
func (e IOMapEntry) Put(b []byte, o binary.ByteOrder) {
	_ = b[IOMapEntryLen-1]
	o.PutUint64(b[0:8], e.Offset)
	e.SGE.Put(b[8:24], o)
}

// Contains reports whether stream offset off falls inside e
// (entry.offset <= off < entry.offset + entry.length, as rs_find_iomap).
func (e IOMapEntry) Contains(off uint64) bool {
	return off >= e.Offset && off-e.Offset < uint64(e.Length)
}

// ParseIOMapEntry reads and checks a 24-byte iomap entry: non-zero length,
// neither the address range nor the offset range wraps.
func ParseIOMapEntry(b []byte, o binary.ByteOrder) (IOMapEntry, error) {
	if len(b) < IOMapEntryLen {
		return IOMapEntry{}, errShort
	}
	e := IOMapEntry{Offset: o.Uint64(b[0:8])}
	e.SGE, _ = ParseSGE(b[8:24], o)
	if e.Length == 0 {
		return e, errZeroLength
	}
	if _, wrap := e.End(); wrap {
		return e, errWrap
	}
	if e.Offset+uint64(e.Length) < e.Offset {
		return e, errWrap
	}
	return e, nil
}

// TargetListLen is the size of the remote-writable target buffer list a
// socket registers: RS_SGL_SIZE SGEs followed by iomapSize iomap entries.
func TargetListLen(iomapSize int) int { return SGLSize*SGELen + iomapSize*IOMapEntryLen }

// IOMapOffset is the offset of iomap entry i in the target buffer list.
func IOMapOffset(i int) int { return SGLSize*SGELen + i*IOMapEntryLen }

// ParseTargetSGL reads both SGEs of a target SGL (b holds at least 32 bytes
// in the owner's byte order). Empty slots (length 0) are allowed; two
// non-empty slots must not overlap.
func ParseTargetSGL(b []byte, o binary.ByteOrder) ([SGLSize]SGE, error) {
	var sgl [SGLSize]SGE
	if len(b) < SGLSize*SGELen {
		return sgl, errShort
	}
	for i := range sgl {
		sgl[i], _ = ParseSGE(b[i*SGELen:], o)
		if _, wrap := sgl[i].End(); wrap {
			return sgl, errWrap
		}
	}
	if sgl[0].Overlaps(sgl[1]) {
		return sgl, errOverlap
	}
	return sgl, nil
}

// ParseIOMapTable reads n consecutive iomap entries. Entries of length 0 are
// unused slots; used entries must not overlap in address or offset.
func ParseIOMapTable(b []byte, n int, o binary.ByteOrder, out []IOMapEntry) ([]IOMapEntry, error) {
	if n < 0 || len(b) < n*IOMapEntryLen {
		return out, errShort
	}
	start := len(out)
	for i := 0; i < n; i++ {
		p := b[i*IOMapEntryLen:]
		if o.Uint32(p[20:24]) == 0 {
			out = append(out, IOMapEntry{Offset: o.Uint64(p[0:8]), SGE: SGE{Addr: o.Uint64(p[8:16]), Key: o.Uint32(p[16:20])}})
			continue
		}
		e, err := ParseIOMapEntry(p, o)
		if err != nil {
			return out, err
		}
		for _, f := range out[start:] {
			if f.Length == 0 {
				continue
			}
			if f.SGE.Overlaps(e.SGE) || (e.Offset < f.Offset+uint64(f.Length) && f.Offset < e.Offset+uint64(e.Length)) {
				return out, errOverlap
			}
		}
		out = append(out, e)
	}
	return out, nil
}
