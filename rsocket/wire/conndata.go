package wire

import "encoding/binary"

// ConnData is struct rs_conn_data, the 40 bytes of CM private data each side
// sends (REQ after the 36-byte cma_hdr, REP at offset 0).
//
// The fixed fields are always big-endian, whatever the host: credits and
// both SGEs go through htobe16/32/64 in rs_format_conn_data and back
// through be*toh in rs_save_conn_data. The NET flag does not describe these
// fields; it announces the sender's native byte order, which is the order the
// peer must use for the SGEs and iomap entries it later RDMA-writes into the
// sender's target SGL (RS_OPT_SWAP_SGL when the orders differ).
type ConnData struct {
	Version uint8
	Flags   ConnFlags
	// Credits is the sender's RQ size: the peer's initial send credit limit.
	Credits  uint16
	Reserved [3]byte
	// IOMapScale is target_iomap_size as sent (scaled, see IOMapSizeFromScale).
	IOMapScale uint8
	// TargetSGL is the sender's target SGL: Addr/Key of the remote-writable
	// target buffer list, Length = number of SGL entries (2).
	TargetSGL SGE
	// DataBuf is the first half of the sender's receive buffer; the peer may
	// write data into it at once.
	DataBuf SGE
}

// NewConnData fills a ConnData as rs_format_conn_data does for a socket with
// the given RQ size, iomap size, target buffer list and receive buffer
// (rbufSize is the whole ring; half of it is advertised). bigEndian selects the
// NET flag: set it only if the SGEs/iomap entries this side reads from its
// target list are big-endian.
func NewConnData(rqSize uint16, iomapSize int, targetAddr uint64, targetKey uint32,
	rbufAddr uint64, rbufKey uint32, rbufSize uint32, bigEndian bool) ConnData {
	c := ConnData{
		Version:    ConnVersion,
		Flags:      ConnFlagIOMap,
		Credits:    rqSize,
		IOMapScale: IOMapSizeToScale(iomapSize),
		TargetSGL:  SGE{Addr: targetAddr, Key: targetKey, Length: SGLSize},
		DataBuf:    SGE{Addr: rbufAddr, Key: rbufKey, Length: rbufSize >> 1},
	}
	if bigEndian {
		c.Flags |= ConnFlagNet
	}
	return c
}

// Put writes c into b[:40].
func (c *ConnData) Put(b []byte) {
	_ = b[ConnDataLen-1]
	b[0] = c.Version
	b[1] = byte(c.Flags)
	binary.BigEndian.PutUint16(b[2:4], c.Credits)
	copy(b[4:7], c.Reserved[:])
	b[7] = c.IOMapScale
	c.TargetSGL.Put(b[8:24], binary.BigEndian)
	c.DataBuf.Put(b[24:40], binary.BigEndian)
}

// AppendTo appends the 40-byte encoding of c to b.
func (c *ConnData) AppendTo(b []byte) []byte {
	n := len(b)
	b = append(b, make([]byte, ConnDataLen)...)
	c.Put(b[n:])
	return b
}

// EntryOrder is the byte order the peer must use for SGEs and iomap entries
// it writes into this side's target list (the sender's native order).
func (c *ConnData) EntryOrder() binary.ByteOrder {
	if c.Flags&ConnFlagNet != 0 {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

// IOMapSize is the unscaled number of iomap entries the sender exposes; 0
// unless the IOMAP flag is set.
func (c *ConnData) IOMapSize() int {
	if c.Flags&ConnFlagIOMap == 0 {
		return 0
	}
	return IOMapSizeFromScale(c.IOMapScale)
}

// IOMapAddr is the address of the sender's iomap table: right after its
// target SGL (target_sgl.addr + 16 * target_sgl.length).
func (c *ConnData) IOMapAddr() uint64 {
	return c.TargetSGL.Addr + SGELen*uint64(c.TargetSGL.Length)
}

// ParseConnData decodes and checks the first 40 bytes of b (longer private
// data, e.g. a REQ padded to 56 bytes, is fine; the rest is ignored).
//
// librdmacm checks only the version. The other checks reject what a
// librdmacm version-1 sender never produces and what would break the state
// machines: reserved flag bits or bytes, a target SGL that is not 2 entries,
// an empty receive buffer, addresses that wrap, and a receive buffer that
// overlaps the target list.
func ParseConnData(b []byte) (ConnData, error) {
	var c ConnData
	if len(b) < ConnDataLen {
		return c, errShort
	}
	c.Version = b[0]
	c.Flags = ConnFlags(b[1])
	c.Credits = binary.BigEndian.Uint16(b[2:4])
	copy(c.Reserved[:], b[4:7])
	c.IOMapScale = b[7]
	c.TargetSGL, _ = ParseSGE(b[8:24], binary.BigEndian)
	c.DataBuf, _ = ParseSGE(b[24:40], binary.BigEndian)
	if c.Version != ConnVersion {
		return c, errVersion
	}
	if c.Flags&^(ConnFlagNet|ConnFlagIOMap) != 0 {
		return c, errReservedFlags
	}
	if c.Reserved != [3]byte{} {
		return c, errReservedBytes
	}
	if c.TargetSGL.Length != SGLSize {
		return c, errSGLLength
	}
	if c.DataBuf.Length == 0 {
		return c, errZeroLength
	}
	list := SGE{Addr: c.TargetSGL.Addr, Length: uint32(TargetListLen(c.IOMapSize()))}
	if _, wrap := list.End(); wrap {
		return c, errWrap
	}
	if _, wrap := c.DataBuf.End(); wrap {
		return c, errWrap
	}
	if list.Overlaps(c.DataBuf) {
		return c, errOverlap
	}
	return c, nil
}
