package rsocket

import (
	"encoding/binary"
	"errors"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// endpoint is what rs_create_ep and rs_init_bufs make before the CM
// exchange: a PD, one CQ for both queues, the send buffer, the receive ring
// and the target buffer list (SGL slots plus iomap table), registered.
type endpoint struct {
	dev  *roce.Device
	cfg  config
	pd   *roce.PD
	cq   *roce.CQ
	sbuf []byte
	rbuf []byte
	tbuf []byte
	smr  *roce.MR
	rmr  *roce.MR
	tmr  *roce.MR
}

// hostBigEndian is the NET flag librdmacm sends: the byte order in which
// this side reads the SGEs and iomap entries the peer writes into its
// target list.
var hostBigEndian = binary.NativeEndian.Uint16([]byte{0, 1}) == 1

func newEndpoint(dev *roce.Device, cfg config) (_ *endpoint, err error) {
	e := &endpoint{dev: dev, cfg: cfg}
	defer func() {
		if err != nil {
			e.free()
		}
	}()
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(cfg.sq + cfg.rq); err != nil {
		return nil, err
	}
	// The ACK of the message that ends a Read's wait leaves with what the
	// connection sends next, the answer of a request/response exchange
	// (one link write, on AF_XDP one sendto, instead of two in a row; at
	// most 20 µs later). The peer's order of completions does not matter
	// to rsockets: a send completion and a receive completion move
	// separate counts (rs_poll_cq).
	e.cq.SetAckWithReply(true)
	e.sbuf = make([]byte, cfg.sbuf)
	e.rbuf = make([]byte, cfg.rbuf)
	e.tbuf = make([]byte, wire.TargetListLen(cfg.iomap))
	if e.smr, err = e.pd.RegisterMR(e.sbuf, roce.AccessLocalWrite); err != nil {
		return nil, err
	}
	remote := roce.AccessLocalWrite | roce.AccessRemoteWrite
	if e.rmr, err = e.pd.RegisterMR(e.rbuf, remote); err != nil {
		return nil, err
	}
	if e.tmr, err = e.pd.RegisterMR(e.tbuf, remote); err != nil {
		return nil, err
	}
	return e, nil
}

// connConfig describes the local side to the wire state machines.
func (e *endpoint) connConfig() wire.ConnConfig {
	return wire.ConnConfig{SQSize: e.cfg.sq, RQSize: e.cfg.rq, SBufSize: uint32(e.cfg.sbuf),
		RBufAddr: e.rmr.Addr(), RBufKey: e.rmr.RKey(), RBufSize: uint32(e.cfg.rbuf),
		TargetAddr: e.tmr.Addr(), TargetKey: e.tmr.RKey(), IOMapSize: e.cfg.iomap, BigEndian: hostBigEndian}
}

// privateData is this side's rs_conn_data.
func (e *endpoint) privateData() []byte {
	cc := e.connConfig()
	cd := cc.Local()
	return cd.AppendTo(nil)
}

// qpOptions are the QP librdmacm creates (rs_create_ep): RC, two send SGEs (a write may wrap the send buffer), receives
// without SGEs (they only take immediates), and the receives posted before
// the CM lets the peer send.
func (e *endpoint) qpOptions() cm.QPOptions {
	return cm.QPOptions{PD: e.pd, SendCQ: e.cq, RecvCQ: e.cq,
		// Control messages put their 16- or 24-byte SGE inline whatever
		// RDMA_INLINE says for data.
		Cap: roce.QPCap{MaxSendWR: e.cfg.sq, MaxRecvWR: e.cfg.rq, MaxSendSGE: 2, MaxRecvSGE: 1,
			MaxInlineData: max(e.cfg.inline, wire.IOMapEntryLen)},
		Access: roce.AccessLocalWrite | roce.AccessRemoteWrite,
		Prepare: func(c *cm.Conn) error {
			// The data write of a response goes before the ACK leaving
			// with it (e.cq.SetAckWithReply): each frame costs the
			// kernel about a microsecond on the way to the peer.
			c.QP().SetReplyBeforeAck(true)
			for i := 0; i < e.cfg.rq; i++ {
				if err := c.QP().PostRecv(&roce.RecvWR{}); err != nil {
					return err
				}
			}
			return nil
		}}
}

// free releases what newEndpoint made; the QP must be gone.
func (e *endpoint) free() error {
	var errs []error
	for _, mr := range []*roce.MR{e.tmr, e.rmr, e.smr} {
		if mr != nil {
			errs = append(errs, mr.Close())
		}
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Close())
	}
	if e.pd != nil {
		errs = append(errs, e.pd.Close())
	}
	e.tmr, e.rmr, e.smr, e.cq, e.pd = nil, nil, nil, nil, nil
	return errors.Join(errs...)
}
