package cm_test

import (
	"context"
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
	conn, err := cm.Dial(ctx, dev, netip.MustParseAddrPort("192.0.2.1:7174"), &cm.DialOptions{
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
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(netip.IPv4Unspecified(), 7174), nil)
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
