package wire

// Write is one RDMA write the sender must post.
type Write struct {
	Addr uint64 // remote address (RETH VA)
	Key  uint32 // remote key (RETH R_Key)
	Len  uint32 // bytes
	Imm  Imm    // immediate to carry
	// Slot is the target SGL entry the write went to (data writes), or the
	// iomap index (iomap writes).
	Slot int
}

// Sender is the sending half of a stream rsocket: rs_can_send, the chunking
// of rsend and rs_write_data, with their counters. It is a pure state
// machine; the caller posts the writes it returns and reports completions.
// The zero value is not usable; build one with NewSender.
type Sender struct {
	target    [SGLSize]SGE // target_sgl: where the peer lets us write
	cur       int          // target_sge
	sseqNo    uint16       // credit-consuming messages sent
	sseqComp  uint16       // credit limit from the peer
	sqeAvail  int
	sbufAvail uint32

	iomapAddr uint64
	iomapKey  uint32
	iomapLen  int
}

// NewSender seeds a sender from the peer's validated ConnData (target SGL
// entry 0 = the peer's first receive half, credit limit = the peer's RQ size),
// for a local send queue of sqSize entries and a send buffer of sbufSize
// bytes. QPCtrlSize send slots stay reserved for control messages.
func NewSender(peer *ConnData, sqSize int, sbufSize uint32) (*Sender, error) {
	if sqSize <= QPCtrlSize || sqSize > QPMaxSize || sbufSize < SndLowat {
		return nil, errBadConfig
	}
	s := &Sender{
		sseqComp:  peer.Credits,
		sqeAvail:  sqSize - QPCtrlSize,
		sbufAvail: sbufSize,
		iomapAddr: peer.IOMapAddr(),
		iomapKey:  peer.TargetSGL.Key,
		iomapLen:  peer.IOMapSize(),
	}
	s.target[0] = peer.DataBuf
	return s, nil
}

// Blocked returns nil if a write may be posted now, or the first rs_can_send
// term that fails.
func (s *Sender) Blocked() error {
	switch {
	case s.sqeAvail <= 0:
		return errNoSendQueue
	case s.sbufAvail < SndLowat:
		return errNoSendBuffer
	case s.sseqNo == s.sseqComp:
		return errNoCredits
	case s.target[s.cur].Length == 0:
		return errNoTarget
	}
	return nil
}

// Avail returns the free send queue entries (QPCtrlSize excluded) and the
// free send buffer bytes.
func (s *Sender) Avail() (sqe int, sbuf uint32) { return s.sqeAvail, s.sbufAvail }

// Credits returns how many credit-consuming messages may still be sent.
func (s *Sender) Credits() uint16 { return s.sseqComp - s.sseqNo }

// Target returns target SGL entry i and the index of the entry in use.
func (s *Sender) Target(i int) (SGE, int) { return s.target[i&1], s.cur }

// NextChunk is rsend's chunk schedule: the first chunk of a call is
// OlapStartSize (*olen starts there), each further one doubles up to
// MaxTransfer, and the last is the remainder.
func NextChunk(left uint64, olen *uint32) uint32 {
	if uint64(*olen) < left {
		x := *olen
		if *olen < MaxTransfer {
			*olen <<= 1
		}
		return x
	}
	return uint32(left)
}

// WriteData takes up to want bytes for one RDMA WRITE WITH IMM: the size is
// cut to the free send buffer and to the rest of the current target entry, so
// a write never crosses an advertised buffer. It advances the target entry
// (to the next slot when used up) and counts one credit.
func (s *Sender) WriteData(want uint32) (Write, error) {
	if err := s.Blocked(); err != nil {
		return Write{}, err
	}
	if want == 0 {
		return Write{}, errZeroWrite
	}
	n := want
	if n > s.sbufAvail {
		n = s.sbufAvail
	}
	t := &s.target[s.cur]
	if n > t.Length {
		n = t.Length
	}
	w := Write{Addr: t.Addr, Key: t.Key, Len: n, Imm: MakeImm(OpData, n), Slot: s.cur}
	s.sseqNo++
	s.sqeAvail--
	s.sbufAvail -= n
	t.Addr += uint64(n)
	t.Length -= n
	if t.Length == 0 {
		s.cur = (s.cur + 1) % SGLSize
	}
	return w, nil
}

// WriteIOMap returns the write that publishes local iomap entry index into
// the peer's iomap table (rs_write_iomap): 24 bytes at table+24*index with
// imm IOMAP_SGL|index. It needs everything rs_can_send needs and uses a
// credit that the peer never gives back (librdmacm's receiver does not
// count iomap updates as consumed).
func (s *Sender) WriteIOMap(index int) (Write, error) {
	if index < 0 || index >= s.iomapLen {
		return Write{}, errIOMapIndex
	}
	if err := s.Blocked(); err != nil {
		return Write{}, err
	}
	s.sseqNo++
	s.sqeAvail--
	s.sbufAvail -= IOMapEntryLen
	return Write{Addr: s.iomapAddr + uint64(index)*IOMapEntryLen, Key: s.iomapKey,
		Len: IOMapEntryLen, Imm: MakeImm(OpIOMapSGL, uint32(index)), Slot: index}, nil
}

// DataDone records the send completion of a data write of n bytes, or of
// an iomap write (n = IOMapEntryLen).
func (s *Sender) DataDone(n uint32) {
	s.sqeAvail++
	s.sbufAvail += n
}

// OnCredit applies an RS_OP_SGL immediate's data: the new credit limit,
// of which only the low 16 bits count.
func (s *Sender) OnCredit(data uint32) { s.sseqComp = uint16(data) }

// Advertise stores an SGE the peer wrote into our target SGL slot. The
// slot must be used up (the peer only re-advertises a half it has
// consumed, so a live slot means the peer broke the protocol) and the new
// buffer must not overlap the other live slot.
func (s *Sender) Advertise(slot int, sge SGE) error {
	if slot < 0 || slot >= SGLSize {
		return errBadSlot
	}
	if sge.Length == 0 {
		return errZeroLength
	}
	if _, wrap := sge.End(); wrap {
		return errWrap
	}
	if s.target[slot].Length != 0 {
		return errSlotBusy
	}
	if sge.Overlaps(s.target[slot^1]) {
		return errOverlap
	}
	s.target[slot] = sge
	return nil
}

// WriteDirect takes up to want bytes for a plain RDMA WRITE into a peer's
// iomap buffer (riowrite's rs_write_direct): it needs everything
// rs_can_send needs, uses a send queue slot and send buffer space, but no
// credit and no target entry. DataDone(n) gives them back.
func (s *Sender) WriteDirect(want uint32) (uint32, error) {
	if err := s.Blocked(); err != nil {
		return 0, err
	}
	if want == 0 {
		return 0, errZeroWrite
	}
	n := min(want, s.sbufAvail)
	s.sqeAvail--
	s.sbufAvail -= n
	return n, nil
}
