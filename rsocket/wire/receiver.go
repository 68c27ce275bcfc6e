package wire

// Credit is one credit message the receiver must send (rs_send_credits): an
// RDMA WRITE WITH IMM of Imm. With HasSGE, the 16-byte SGE is written (in
// the peer's entry order) to Addr/Key, the peer's target SGL slot Slot;
// without it the write is zero-length and Addr/Key do not matter.
type Credit struct {
	Imm    Imm
	HasSGE bool
	SGE    SGE
	Slot   int
	Addr   uint64
	Key    uint32
}

type segment struct{ off, left uint32 }

// Receiver is the receiving half of a stream rsocket: the ring of
// rbufSize bytes split into two halves, the credits granted to the peer,
// the advertised-buffer queue the peer must fill strictly in order, and the
// credit/re-advertisement rule of rs_give_credits. The zero value is not
// usable; build one with NewReceiver.
type Receiver struct {
	rqSize   uint16
	rbufSize uint32
	rbufAddr uint64
	rbufKey  uint32

	remote    SGE // peer's target SGL (addr, key, count)
	remoteSge int

	// Ring accounting, as in rs_init_bufs / rrecv.
	freeOff  uint32 // rbuf_free_offset: next half to advertise
	avail    uint32 // rbuf_bytes_avail: consumed, not yet re-advertised
	readOff  uint32 // rbuf_offset
	rseqNo   uint16 // data messages fully consumed
	rseqComp uint16 // re-grant threshold
	granted  uint16 // credit limit last given to the peer
	rcvd     uint16 // credit-consuming messages received

	adv  [SGLSize]segment // advertised, not yet filled (FIFO)
	advN int

	msgs       []uint32 // rmsg ring: bytes left per received data message
	head, tail int
	unread     uint32

	ctrlSeq, ctrlMax uint16
}

// NewReceiver builds the receiving half for a local RQ of rqSize, a ring of
// rbufSize bytes at rbufAddr/rbufKey, and the peer's validated ConnData (for
// its target SGL). The first half counts as advertised by our own ConnData;
// the second half is free and goes out with the first credit message.
func NewReceiver(peer *ConnData, rqSize uint16, rbufAddr uint64, rbufKey, rbufSize uint32) (*Receiver, error) {
	if rqSize < QPMinSize || rqSize > QPMaxSize || rbufSize < 2 || rbufSize%2 != 0 {
		return nil, errBadConfig
	}
	if _, wrap := (SGE{Addr: rbufAddr, Length: rbufSize}).End(); wrap {
		return nil, errBadConfig
	}
	half := rbufSize / 2
	r := &Receiver{
		rqSize: rqSize, rbufSize: rbufSize, rbufAddr: rbufAddr, rbufKey: rbufKey,
		remote: peer.TargetSGL, remoteSge: 1,
		freeOff: half, avail: half,
		rseqComp: rqSize / 2, granted: rqSize,
		msgs:    make([]uint32, int(rqSize)+1),
		ctrlMax: QPCtrlSize,
	}
	r.adv[0] = segment{0, half}
	r.advN = 1
	return r, nil
}

// Unread is the number of received bytes not yet consumed.
func (r *Receiver) Unread() uint32 { return r.unread }

// ReadOffset is the ring offset the next Consume reads from.
func (r *Receiver) ReadOffset() uint32 { return r.readOff }

// Granted returns the credit limit last granted and the count of
// credit-consuming messages received (both 16-bit sequence numbers).
func (r *Receiver) Granted() (limit, received uint16) { return r.granted, r.rcvd }

// takeCredit checks and counts one credit-consuming message.
func (r *Receiver) takeCredit() error {
	if r.rcvd == r.granted {
		return errNoCredit
	}
	r.rcvd++
	return nil
}

// OnData validates a received RS_OP_DATA write of n bytes at address addr
// (RETH VA) and queues it for Consume. The write must use a credit, start
// exactly at the fill position of the oldest advertised buffer and end
// within it.
func (r *Receiver) OnData(addr uint64, n uint32) error {
	if n == 0 {
		return errZeroData
	}
	if r.rcvd == r.granted {
		return errNoCredit
	}
	if r.advN == 0 {
		return errPastBuffer
	}
	s := &r.adv[0]
	if addr < r.rbufAddr || addr-r.rbufAddr >= uint64(r.rbufSize) {
		return errPastBuffer
	}
	if uint32(addr-r.rbufAddr) != s.off {
		return errOutOfOrder
	}
	if n > s.left {
		if r.advN > 1 && (s.off+s.left)%r.rbufSize == r.adv[1].off && n-s.left <= r.adv[1].left {
			return errCrossesSGE
		}
		return errPastBuffer
	}
	r.rcvd++
	s.off += n
	s.left -= n
	if s.left == 0 {
		r.adv[0] = r.adv[1]
		r.adv[1] = segment{}
		r.advN--
	}
	r.msgs[r.tail] = n
	r.tail++
	if r.tail == len(r.msgs) {
		r.tail = 0
	}
	r.unread += n
	return nil
}

// OnIOMap counts a received RS_OP_IOMAP_SGL message (one credit, never
// returned, as in librdmacm).
func (r *Receiver) OnIOMap() error { return r.takeCredit() }

// Consume records that the application read n bytes from ReadOffset on
// (rrecv): whole messages count toward the next credit grant and the bytes
// become free for re-advertisement.
func (r *Receiver) Consume(n uint32) error {
	if n > r.unread {
		return errOverConsume
	}
	r.unread -= n
	for n > 0 {
		m := &r.msgs[r.head]
		k := n
		if k >= *m {
			k = *m
			r.rseqNo++
			r.head++
			if r.head == len(r.msgs) {
				r.head = 0
			}
		}
		*m -= k
		n -= k
		r.avail += k
		r.readOff += k
		if r.readOff >= r.rbufSize {
			r.readOff -= r.rbufSize
		}
	}
	return nil
}

// CreditDue is rs_give_credits: a credit message is due when a half of the
// ring is free or the peer has used half its credits since the last grant,
// and a control slot is free.
func (r *Receiver) CreditDue() bool {
	return (r.avail >= r.rbufSize/2 || int16(r.rseqNo-r.rseqComp) >= 0) && r.ctrlSeq != r.ctrlMax
}

// NextCredit builds the due credit message and applies rs_send_credits'
// bookkeeping: new limit rseq_no+rq_size, and if a half is free, its SGE for
// the next peer slot (slots alternate 1, 0, 1, ... and carry halves 1, 0,
// 1, ...). It uses a control slot until CtrlDone.
func (r *Receiver) NextCredit() (Credit, error) {
	if r.ctrlSeq == r.ctrlMax {
		return Credit{}, errNoCtrlSlot
	}
	r.ctrlSeq++
	half := r.rbufSize / 2
	r.rseqComp = r.rseqNo + r.rqSize/2
	r.granted = r.rseqNo + r.rqSize
	c := Credit{Imm: MakeImm(OpSGL, uint32(r.rseqNo)+uint32(r.rqSize))}
	if r.avail >= half && r.advN < SGLSize {
		c.HasSGE = true
		c.SGE = SGE{Addr: r.rbufAddr + uint64(r.freeOff), Key: r.rbufKey, Length: half}
		c.Slot = r.remoteSge
		c.Addr = r.remote.Addr + uint64(r.remoteSge)*SGELen
		c.Key = r.remote.Key
		r.adv[r.advN&1] = segment{r.freeOff, half}
		r.advN++
		r.avail -= half
		r.freeOff += half
		if r.freeOff >= r.rbufSize {
			r.freeOff = 0
		}
		r.remoteSge++
		if r.remoteSge == int(r.remote.Length) {
			r.remoteSge = 0
		}
	}
	return c, nil
}

// Ctrl takes a control slot for a CTRL message (disconnect, shutdown) and
// returns its immediate.
func (r *Receiver) Ctrl(value uint32) (Imm, error) {
	if value > CtrlShutdown {
		return 0, errCtrlValue
	}
	if r.ctrlSeq == r.ctrlMax {
		return 0, errNoCtrlSlot
	}
	r.ctrlSeq++
	return MakeImm(OpCtrl, value), nil
}

// CtrlDone records the send completion of a credit or CTRL message.
func (r *Receiver) CtrlDone() { r.ctrlMax++ }

// FillAddr is the ring address at which the peer's next data write must
// start: the fill position of the oldest advertised buffer. A receiver
// whose completions carry no RETH address (ibv_wc has none) passes it to
// OnData, as librdmacm trusts the peer to fill the ring in order.
func (r *Receiver) FillAddr() uint64 { return r.rbufAddr + uint64(r.adv[0].off) }
