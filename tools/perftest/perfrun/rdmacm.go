// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// RDMACM makes a test run in perftest's -R mode: the control channel and
// the test QP are both connected with rdma_cm (RDMA_PS_TCP), one after the
// other on the same port, and the exchanges travel as SENDs on the
// control QP instead of over TCP. perftest resolves only IPv4 addresses in
// this mode. Exactly one of Listen (a server) and Peer (a client) is set.
type RDMACM struct {
	Listen netip.AddrPort
	Peer   netip.AddrPort
	// listening, if set, is closed once a server's CM listens (Loopback
	// starts its client then, instead of waiting out a REQ timeout).
	listening chan struct{}
}

// The control channel's receives: perftest keeps one 56-byte receive
// posted; goroce keeps a few so a message never waits for a repost.
const (
	ctlSlots    = 4
	ctlSlotSize = 64
)

// cmChannel is perftest's control channel over an rdma_cm connection.
type cmChannel struct {
	conn *cm.Conn
	mr   *roce.MR
	buf  []byte // ctlSlots receive slots, then the send slot
	wc   [1]roce.WorkCompletion
	swr  roce.SendWR
	ssge [1]roce.SGE
	rwr  roce.RecvWR
	rsge [1]roce.SGE
}

// prepare registers the buffer and posts the receives while the QP is in
// INIT, before the CM lets the peer send (cm.QPOptions.Prepare).
func (ch *cmChannel) prepare(c *cm.Conn) error {
	ch.buf = make([]byte, (ctlSlots+1)*ctlSlotSize)
	mr, err := c.PD().RegisterMR(ch.buf, roce.AccessLocalWrite)
	if err != nil {
		return err
	}
	ch.mr = mr
	for i := 0; i < ctlSlots; i++ {
		if err := ch.postRecv(c.QP(), i); err != nil {
			return err
		}
	}
	return nil
}

func (ch *cmChannel) postRecv(q *roce.QP, slot int) error {
	ch.rsge[0] = ch.mr.SGE(slot*ctlSlotSize, ctlSlotSize)
	ch.rwr = roce.RecvWR{ID: uint64(slot), SGL: ch.rsge[:]}
	return q.PostRecv(&ch.rwr)
}

func (ch *cmChannel) qpOptions() cm.QPOptions {
	return cm.QPOptions{
		Cap:     roce.QPCap{MaxSendWR: 2, MaxRecvWR: ctlSlots, MaxSendSGE: 1, MaxRecvSGE: 1},
		Prepare: ch.prepare,
	}
}

// SendMessage implements perftest.MessageTransport (rdma_write_data).
func (ch *cmChannel) SendMessage(ctx context.Context, b []byte) error {
	if len(b) > perftest.DestBinarySize {
		return fmt.Errorf("message of %d bytes is longer than the peer's %d-byte receive", len(b), perftest.DestBinarySize)
	}
	off := ctlSlots * ctlSlotSize
	copy(ch.buf[off:], b)
	ch.ssge[0] = ch.mr.SGE(off, len(b))
	ch.swr = roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: ch.ssge[:]}
	if err := ch.conn.QP().PostSend(&ch.swr); err != nil {
		return err
	}
	if _, err := pollWait(ctx, ch.conn.SendCQ(), ch.wc[:], true, nil); err != nil {
		return err
	}
	if ch.wc[0].Status != roce.WCSuccess {
		return &WCError{ch.wc[0]}
	}
	return nil
}

// RecvMessage implements perftest.MessageTransport (rdma_read_data).
func (ch *cmChannel) RecvMessage(ctx context.Context, b []byte) (int, error) {
	if _, err := pollWait(ctx, ch.conn.RecvCQ(), ch.wc[:], true, nil); err != nil {
		return 0, err
	}
	wc := ch.wc[0]
	if wc.Status != roce.WCSuccess {
		return 0, &WCError{wc}
	}
	slot := int(wc.WRID)
	if slot < 0 || slot >= ctlSlots {
		return 0, fmt.Errorf("receive completion for unknown slot %d", wc.WRID)
	}
	n := int(wc.ByteLen)
	copy(b, ch.buf[slot*ctlSlotSize:slot*ctlSlotSize+min(n, ctlSlotSize)])
	if err := ch.postRecv(ch.conn.QP(), slot); err != nil {
		return 0, err
	}
	return n, nil
}

// Close disconnects (briefly waiting for the DREP: the peer may already
// have gone) and frees the connection.
func (ch *cmChannel) Close() error {
	// The region lives in the connection's PD: deregister it between
	// the disconnect (QP in error) and the Close that frees the PD.
	disconnect(ch.conn)
	var err error
	if ch.mr != nil {
		err = ch.mr.Close()
	}
	return errors.Join(err, ch.conn.Close())
}

// disconnect sends a DREQ and waits a second at most for the DREP (the
// peer may already have gone).
func disconnect(c *cm.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = c.Disconnect(ctx)
	cancel()
}

// CMConnectPatience bounds cmDialRetry: perftest's client retries while
// its rdma_cm calls have time left; without a bound, a peer where nothing
// listens would be tried in silence until interrupted.
var CMConnectPatience = 20 * time.Second

// cmDialRetry dials like perftest's rdma_cm client: a server that is not
// listening yet (its CM rejects the service ID, or does not answer) is
// tried again every 100 ms, for CMConnectPatience at most. step names what
// is being connected, for the error.
func cmDialRetry(ctx context.Context, dev *roce.Device, addr netip.AddrPort, step string, opts cm.DialOptions) (*cm.Conn, error) {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, CMConnectPatience)
	defer cancel()
	for {
		c, err := cm.Dial(ctx, dev, addr, opts)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, mad.RejInvalidServiceID) && !errors.Is(err, cm.ErrTimeout) {
			return nil, fmt.Errorf("rdma_cm connect (%s) to %v: %w", step, addr, err)
		}
		select {
		case <-ctx.Done():
			if parent.Err() == nil {
				return nil, fmt.Errorf("rdma_cm connect (%s) to %v: no server accepted within %v (last: %v)",
					step, addr, CMConnectPatience, err)
			}
			return nil, fmt.Errorf("rdma_cm connect (%s) to %v: %w (last: %v)", step, addr, parent.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// cmSession is the rdma_cm side of one -R test: the control channel and,
// on a server, the listener the test QP arrives on.
type cmSession struct {
	cfg  RDMACM
	dev  *roce.Device
	ctl  *cmChannel
	ln   *cm.Listener // server: for the test QP
	test *cm.Conn
}

// connectControl establishes the control channel (establish_connection with
// use_rdma_cm). A server then listens for the test QP at once, before any
// exchange lets the client dial it.
func (s *cmSession) connectControl(ctx context.Context, testQP cm.QPOptions, outReads uint8) (*perftest.Conn, error) {
	s.ctl = &cmChannel{}
	if !s.cfg.Listen.IsValid() {
		// The path MTU of the control QP is asked low: its messages are
		// tiny, and the MTU exchange that tells us the peer's comes later.
		c, err := cmDialRetry(ctx, s.dev, s.cfg.Peer, "control channel", cm.DialOptions{
			QP: s.ctl.qpOptions(), RetryCount: 7, RNRRetryCount: 7,
			ResponderResources: 1, InitiatorDepth: 1, PathMTU: ib.MTU1024,
		})
		if err != nil {
			return nil, fmt.Errorf("rdma_cm control connection: %w", err)
		}
		s.ctl.conn = c
		return perftest.NewMessageConn(s.ctl, perftest.Client), nil
	}
	ln, err := cm.Listen(ctx, s.dev, s.cfg.Listen, cm.ListenOptions{QP: s.ctl.qpOptions(), RNRRetryCount: 7, Backlog: 1})
	if err != nil {
		return nil, fmt.Errorf("rdma_cm listen on %v: %w", s.cfg.Listen, err)
	}
	if s.cfg.listening != nil {
		close(s.cfg.listening)
	}
	c, err := ln.Accept(ctx)
	ln.Close()
	if err != nil {
		return nil, fmt.Errorf("waiting for the client: %w", err)
	}
	s.ctl.conn = c
	if s.ln, err = cm.Listen(ctx, s.dev, s.cfg.Listen, cm.ListenOptions{QP: testQP, RNRRetryCount: 7,
		ResponderResources: outReads, InitiatorDepth: outReads, Backlog: 1}); err != nil {
		c.Close()
		return nil, fmt.Errorf("rdma_cm listen on %v for the test QP: %w", s.cfg.Listen, err)
	}
	return perftest.NewMessageConn(s.ctl, perftest.Server), nil
}

// connectTest connects the test QP (create_rdma_cm_connection). A client
// asks for the path MTU both ends agreed on in the exchange, and for the
// traffic class of -T (perftest's rdma_set_option RDMA_OPTION_ID_TOS); the
// server's QP takes the path of the client's request.
func (s *cmSession) connectTest(ctx context.Context, testQP cm.QPOptions, outReads uint8, mtu ib.MTU, tos uint8) (*cm.Conn, error) {
	var err error
	if s.ln != nil {
		s.test, err = s.ln.Accept(ctx)
		s.ln.Close()
		s.ln = nil
	} else {
		s.test, err = cmDialRetry(ctx, s.dev, s.cfg.Peer, "test QP", cm.DialOptions{QP: testQP,
			RetryCount: 7, RNRRetryCount: 7, ResponderResources: outReads, InitiatorDepth: outReads, PathMTU: mtu,
			TrafficClass: tos})
	}
	if err != nil {
		return nil, fmt.Errorf("rdma_cm test connection: %w", err)
	}
	return s.test, nil
}

// close disconnects the test QP, then the control channel, as perftest's
// destroy_ctx does; either may already be gone from the peer's side.
func (s *cmSession) close() {
	if s.ln != nil {
		s.ln.Close()
	}
	if s.test != nil {
		disconnect(s.test)
		s.test.Close()
	}
	if s.ctl != nil && s.ctl.conn != nil {
		s.ctl.Close()
	}
}
