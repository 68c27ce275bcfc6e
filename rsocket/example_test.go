package rsocket_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
)

// A stream over RDMA between two devices, as net.Conn and net.Listener:
// here two devices on an in-memory link; on a NIC, each device comes from
// netdev.Open(ctx, "eth0", netdev.Options{}), and the peer may be
// librdmacm's rsockets (rstream, riostream, rcopy) as well as goroce.
func Example() {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	la, lb := memlink.PairWithOptions(memlink.Options{}) // no loss; Options sets seeded faults
	devA, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer devA.Close()
	devB, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer devB.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ln, err := rsocket.Listen(ctx, devB, "tcp", "10.0.0.2:7471")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client closes its side
	}()

	c, err := rsocket.Dial(ctx, devA, "tcp", "10.0.0.2:7471")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := c.Write([]byte("hello over RDMA")); err != nil {
		fmt.Println(err)
		return
	}
	c.CloseWrite()
	reply, err := io.ReadAll(c)
	fmt.Printf("%s %v\n", reply, err)
	// Output: hello over RDMA <nil>
}
