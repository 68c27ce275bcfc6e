package wire

import "encoding/binary"

// Event is what a received message meant.
type Event uint8

const (
	EvData       Event = iota + 1 // data queued; Unread grew
	EvCredit                      // credit limit raised, no buffer
	EvAdvert                      // credit limit raised and a buffer advertised
	EvIOMap                       // peer published an iomap entry
	EvDisconnect                  // peer sent RS_CTRL_DISCONNECT: socket disconnected
	EvShutdown                    // peer sent RS_CTRL_SHUTDOWN: no more data will come
	EvKeepalive                   // CTRL KEEPALIVE carried as immediate (no-op)
)

// Conn is both halves of a connected stream rsocket plus the
// readable/writable state that CTRL messages change (rs_poll_cq).
type Conn struct {
	Send Sender
	Recv Receiver

	// Local target buffer list: where the peer writes adverts and iomap
	// entries, in our own entry order.
	targetAddr uint64
	iomapSize  int
	order      binary.ByteOrder

	Readable, Writable bool
}

// ConnConfig describes the local side of a connection.
type ConnConfig struct {
	SQSize, RQSize int
	SBufSize       uint32
	RBufAddr       uint64
	RBufKey        uint32
	RBufSize       uint32
	TargetAddr     uint64 // local target buffer list (TargetListLen(IOMapSize) bytes)
	TargetKey      uint32
	IOMapSize      int
	BigEndian      bool // entry order of the local target list (NET flag)
}

// Local returns the ConnData this side sends.
func (c *ConnConfig) Local() ConnData {
	return NewConnData(uint16(c.RQSize), c.IOMapSize, c.TargetAddr, c.TargetKey,
		c.RBufAddr, c.RBufKey, c.RBufSize, c.BigEndian)
}

// NewConn joins the local configuration with the peer's ConnData.
func NewConn(cfg ConnConfig, peer *ConnData) (*Conn, error) {
	if cfg.IOMapSize < 0 || cfg.IOMapSize > MaxIOMapSize || cfg.RQSize > QPMaxSize {
		return nil, errBadConfig
	}
	s, err := NewSender(peer, cfg.SQSize, cfg.SBufSize)
	if err != nil {
		return nil, err
	}
	r, err := NewReceiver(peer, uint16(cfg.RQSize), cfg.RBufAddr, cfg.RBufKey, cfg.RBufSize)
	if err != nil {
		return nil, err
	}
	c := &Conn{Send: *s, Recv: *r, targetAddr: cfg.TargetAddr, iomapSize: IOMapSizeFromScale(IOMapSizeToScale(cfg.IOMapSize)),
		order: binary.LittleEndian, Readable: true, Writable: true}
	if cfg.BigEndian {
		c.order = binary.BigEndian
	}
	return c, nil
}

// OnRecv processes one received RDMA WRITE WITH IMM: imm as read from the
// ImmDt (host order), addr the RETH VA (ignored for zero-length writes),
// body the bytes written (needed for adverts and iomap entries; for data
// only its length counts). For EvAdvert and EvIOMap, idx is the slot or
// iomap index; an iomap entry is returned in e.
func (c *Conn) OnRecv(imm uint32, addr uint64, body []byte) (ev Event, idx int, e IOMapEntry, err error) {
	m, err := ParseImm(imm)
	if err != nil {
		return 0, 0, e, err
	}
	switch m.Op() {
	case OpData:
		if !c.Readable {
			return 0, 0, e, ErrClosed
		}
		if uint32(len(body)) != m.Data() {
			return 0, 0, e, errLength
		}
		if err := c.Recv.OnData(addr, m.Data()); err != nil {
			return 0, 0, e, err
		}
		return EvData, 0, e, nil
	case OpSGL:
		switch len(body) {
		case 0:
			c.Send.OnCredit(m.Data())
			return EvCredit, 0, e, nil
		case SGELen:
			if addr < c.targetAddr || addr-c.targetAddr >= SGLSize*SGELen || (addr-c.targetAddr)%SGELen != 0 {
				return 0, 0, e, errBadSlot
			}
			slot := int(addr-c.targetAddr) / SGELen
			sge, err := ParseAdvert(body, c.order)
			if err != nil {
				return 0, 0, e, err
			}
			if err := c.Send.Advertise(slot, sge); err != nil {
				return 0, 0, e, err
			}
			c.Send.OnCredit(m.Data())
			return EvAdvert, slot, e, nil
		}
		return 0, 0, e, errLength
	case OpIOMapSGL:
		i := int(m.Data())
		if i >= c.iomapSize {
			return 0, 0, e, errBadSlot
		}
		if len(body) != IOMapEntryLen {
			return 0, 0, e, errLength
		}
		if addr != c.targetAddr+uint64(IOMapOffset(i)) {
			return 0, 0, e, errBadSlot
		}
		e, err = ParseIOMapEntry(body, c.order)
		if err != nil {
			return 0, 0, e, err
		}
		if err := c.Recv.OnIOMap(); err != nil {
			return 0, 0, e, err
		}
		return EvIOMap, i, e, nil
	default: // OpCtrl
		if len(body) != 0 {
			return 0, 0, e, errLength
		}
		switch m.Data() {
		case CtrlDisconnect:
			c.Readable, c.Writable = false, false
			return EvDisconnect, 0, e, nil
		case CtrlShutdown:
			if c.Writable {
				c.Readable = false
			} else {
				c.Readable, c.Writable = false, false
			}
			return EvShutdown, 0, e, nil
		}
		return EvKeepalive, 0, e, nil
	}
}

// Shutdown returns the CTRL immediate rshutdown sends for how (true = both
// directions): DISCONNECT for SHUT_RDWR or when no longer readable,
// SHUTDOWN for SHUT_WR while still readable.
func (c *Conn) Shutdown(both bool) (Imm, error) {
	v := uint32(CtrlDisconnect)
	if !both && c.Readable {
		v = CtrlShutdown
	}
	imm, err := c.Recv.Ctrl(v)
	if err != nil {
		return 0, err
	}
	c.Writable = false
	if both {
		c.Readable = false
	}
	return imm, nil
}
