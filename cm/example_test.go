package cm_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/roce"
)

// Connect to an rdma_cm server (rping -s, rstream, ...) on port 7174 and
// get an RC QP in RTS.
func ExampleDial() {
	var dev *roce.Device // from netdev.Open(ctx, "eth0", netdev.Options{})
	if dev == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, dev, netip.MustParseAddrPort("192.0.2.1:7174"), cm.DialOptions{
		ResponderResources: 1, InitiatorDepth: 1,
		// Post receives before the peer may send.
		QP: cm.QPOptions{Prepare: func(c *cm.Conn) error { return nil }},
	})
	if err != nil {
		fmt.Println(err) // errors.Is(err, mad.RejInvalidServiceID): nothing listens there
		return
	}
	defer conn.Close() // DREQ
	fmt.Println(conn.QP().QPN(), conn.RemoteQPN())
}

// Accept rdma_cm connections on port 7174 of any of the device's addresses.
func ExampleListen() {
	var dev *roce.Device
	if dev == nil {
		return
	}
	ctx := context.Background()
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(netip.IPv4Unspecified(), 7174), cm.ListenOptions{})
	if err != nil {
		return
	}
	defer l.Close()
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			return
		}
		go func() {
			<-conn.Done() // the peer disconnected
			conn.Close()
		}()
	}
}

// Serve each connection with its own buffer, as an rsocket or rping
// server does: read the request's private data, then accept with a REP
// that carries this connection's buffer address and rkey, or reject with
// a reason the client can read.
func ExampleListener_Request() {
	var dev *roce.Device
	if dev == nil {
		return
	}
	ctx := context.Background()
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(netip.IPv4Unspecified(), 7174), cm.ListenOptions{})
	if err != nil {
		return
	}
	defer l.Close()
	for {
		req, err := l.Request(ctx)
		if err != nil {
			return
		}
		// Answer in a goroutine: Accept returns once the peer's RTU came,
		// and a slow peer must not hold up the next request.
		go func() {
			if !bytes.HasPrefix(req.PrivateData(), []byte("hello")) {
				_ = req.Reject(0, []byte("unknown protocol")) // REJ CONSUMER_DEFINED
				return
			}
			pd, err := dev.AllocPD()
			if err != nil {
				_ = req.Reject(0, nil)
				return
			}
			buf := make([]byte, 4096)
			mr, err := pd.RegisterMR(buf, roce.AccessLocalWrite|roce.AccessRemoteWrite)
			if err != nil {
				_ = req.Reject(0, nil)
				pd.Close()
				return
			}
			rep := binary.BigEndian.AppendUint64(nil, mr.Addr())
			rep = binary.BigEndian.AppendUint32(rep, mr.RKey())
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			conn, err := req.Accept(actx, cm.AcceptOptions{
				QP:          cm.QPOptions{PD: pd, Access: roce.AccessRemoteWrite}, // writes only
				PrivateData: rep,
			})
			if err != nil {
				mr.Close()
				pd.Close()
				return
			}
			<-conn.Done()
			fmt.Println(conn.RemoteAddr(), conn.Err()) // e.g. "cm: disconnected by the peer"
			conn.Close()
			mr.Close()
			pd.Close()
		}()
	}
}

// Own the device's CM explicitly instead of letting the package-level
// functions share one: Close releases QP1.
func ExampleNewManager() {
	var dev *roce.Device
	if dev == nil {
		return
	}
	m, err := cm.NewManager(dev, cm.ManagerOptions{})
	if err != nil {
		return // QP1 is taken
	}
	defer m.Close()
	ctx := context.Background()
	conn, err := m.Dial(ctx, netip.MustParseAddrPort("192.0.2.1:7174"), cm.DialOptions{PrivateData: []byte("hello")})
	if err != nil {
		return
	}
	defer conn.Close()
}

// Learn why a connection ended: the peer's DREQ or REJ, a CM timeout, or the
// QP failing on its own (its retries ran out, a NAK), which Err reports as
// the QP's error with the failing completion status.
func ExampleConn_Err() {
	var conn *cm.Conn // from cm.Dial or Listener.Accept
	if conn == nil {
		return
	}
	select {
	case <-conn.Done():
	case <-conn.QP().Failed():
	}
	err := conn.Err()
	var qe *roce.QPError
	switch {
	case errors.As(err, &qe):
		fmt.Println("QP failed:", qe.Status) // e.g. RETRY_EXC_ERR: the peer vanished
	case errors.Is(err, cm.ErrDisconnected):
		fmt.Println("disconnected:", err)
	default:
		fmt.Println("ended:", err)
	}
	conn.Close()
}
