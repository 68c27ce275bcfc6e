// Command faults shows, from a module of its own, that a program outside
// goroce sets the in-memory link's seeded faults: two devices on a memlink
// pair that loses, reorders and duplicates frames stream 1 MiB over rsocket
// and get every byte back.
package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket"
)

func main() {
	faults := faultnet.Config{Seed: 7, Loss: 0.02, Duplicate: 0.01, Reorder: 0.01}
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: faults, BtoA: faults})
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	devA, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: lb.HardwareAddr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer devA.Close()
	devB, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: la.HardwareAddr()}})
	if err != nil {
		log.Fatal(err)
	}
	defer devB.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ln, err := rsocket.Listen(ctx, devB, "tcp", "10.0.0.2:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := rsocket.Dial(ctx, devA, "tcp", "10.0.0.2:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	go func() {
		c.Write(data)
		c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		log.Fatalf("echo: %d bytes, equal %v, %v", len(got), bytes.Equal(got, data), err)
	}
	s := la.TxStats()
	fmt.Printf("1 MiB echoed intact; A→B lost %d, duplicated %d, reordered %d frames\n", s.Dropped, s.Duplicated, s.Reordered)
}
