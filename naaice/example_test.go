package naaice_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/roce"
)

// A software NAA with the C library's example routines and one of its
// own, on the C server's port.
func ExampleServer() {
	var dev *roce.Device // from roce.Open(ctx, "eth0", roce.Options{})
	if dev == nil {
		return
	}
	srv := naaice.NewServer(dev, naaice.ServerOptions{MaxConns: 8})
	naaice.ExampleRoutines(srv) // 1: +1, 2: +2, 3: nothing
	srv.Handle(4, func(_ context.Context, c *naaice.Call) uint8 {
		if len(c.Regions) < 2 {
			return 0x10 // an application error: the host gets an *RPCError
		}
		copy(c.Regions[1], c.Regions[0])
		return 0
	})
	err := srv.ListenAndServe(context.Background(), netip.MustParseAddrPort("0.0.0.0:12345"))
	fmt.Println(err, srv.Counters())
}

// Many RPCs on one connection: the MRSP runs once, the configuration
// region is sent with the first RPC only.
func ExampleContext() {
	var dev *roce.Device
	if dev == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	config, data := make([]byte, 64), make([]byte, 1<<20)
	c, err := naaice.NewContext(dev, netip.MustParseAddrPort("192.0.2.1:12345"), [][]byte{config, data}, nil, 1, naaice.Options{})
	if err != nil {
		return
	}
	defer c.Close()
	c.SetSingleSend(0)
	c.SetInput(1)
	c.SetOutput(1)
	if err := c.Connect(ctx); err != nil {
		return
	}
	if err := c.DoMRSP(ctx); err != nil {
		var me *naaice.MRSPError
		if errors.As(err, &me) {
			fmt.Println("the NAA refused the regions:", me.Code)
		}
		return
	}
	for i := 0; i < 100; i++ {
		if err := c.DoRPC(ctx); err != nil {
			var re *naaice.RPCError
			if errors.As(err, &re) {
				fmt.Println("routine failed with", re.Code)
			}
			return
		}
		// data now holds the result, and is the next RPC's input.
	}
}

// One call: connect, MRSP, RPC, disconnect.
func ExampleClient_Call() {
	var dev *roce.Device
	if dev == nil {
		return
	}
	in, out := []byte("parameters"), make([]byte, 4096)
	cl := naaice.NewClient(dev, netip.MustParseAddrPort("192.0.2.1:12345"), naaice.Options{})
	if err := cl.Call(context.Background(), 2, [][]byte{in}, [][]byte{out}); err != nil {
		fmt.Println(err)
	}
}
