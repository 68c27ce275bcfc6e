package netdev_test

import (
	"context"
	"fmt"
	"time"

	"github.com/goroce/goroce/netdev"
)

// Opening a device on a network interface (AF_XDP, or the kernel UDP link
// when AF_XDP is unavailable) and describing it. Needs root for AF_XDP.
func ExampleOpen() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dev, err := netdev.Open(ctx, "eth0", netdev.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	info := dev.Info()
	fmt.Println("link:", info.Link.Kind, "fallback:", info.Fallback)
	port := dev.QueryPort()
	fmt.Println("state:", port.State, "active MTU:", port.ActiveMTU.Bytes())
	for _, g := range dev.GIDs() {
		fmt.Println(g.Index, g.GID)
	}
	dev.Counters().Each(func(name string, v uint64) { fmt.Println(name, v) })
}
