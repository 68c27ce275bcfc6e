package roce_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// Two devices over an in-memory link: an RC QP pair, one SEND and one RDMA
// WRITE. On a network interface netdev.Open(ctx, "eth0", netdev.Options{})
// replaces OpenLink, and the peer's QPN, address and keys come over the
// network.
func Example() {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	ipA, ipB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	devA, _ := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{ipA},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipB: lb.HardwareAddr()}})
	defer devA.Close()
	devB, _ := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{ipB},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipA: la.HardwareAddr()}})
	defer devB.Close()

	type side struct {
		pd *roce.PD
		cq *roce.CQ
		qp *roce.QP
		mr *roce.MR
	}
	mk := func(d *roce.Device) side {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		qp, _ := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq})
		mr, _ := pd.RegisterMR(make([]byte, 4096), roce.AccessLocalWrite|roce.AccessRemoteWrite)
		return side{pd, cq, qp, mr}
	}
	a, b := mk(devA), mk(devB)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: ipB})
	b.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: ipA})

	wait := func(cq *roce.CQ) roce.WorkCompletion {
		var wc [1]roce.WorkCompletion
		for cq.Poll(wc[:]) == 0 {
			if err := cq.Wait(ctx); err != nil {
				panic(err)
			}
		}
		return wc[0]
	}

	// SEND "hello" into a posted receive.
	b.qp.PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{b.mr.SGE(0, 64)}})
	copy(a.mr.Bytes(), "hello")
	a.qp.PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{a.mr.SGE(0, 5)}})
	fmt.Println(wait(a.cq).Status)
	wc := wait(b.cq)
	fmt.Println(wc.Opcode, wc.ByteLen, string(b.mr.Bytes()[:wc.ByteLen]))

	// RDMA WRITE "world" to offset 100 of b's region.
	copy(a.mr.Bytes()[8:], "world")
	a.qp.PostSend(&roce.SendWR{ID: 3, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
		SGL: []roce.SGE{a.mr.SGE(8, 5)}, RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey()})
	fmt.Println(wait(a.cq).Opcode)
	b.mr.Sync() // b's side got no completion for the WRITE
	fmt.Println(string(b.mr.Bytes()[100:105]))
	// Output:
	// success
	// RECV 5 hello
	// RDMA_WRITE
	// world
}

// A UD QP receiving into a slab of pre-posted buffers, read in place.
func ExampleRecvSlab() {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	ipA, ipB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	devA, _ := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{ipA},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipB: lb.HardwareAddr()}})
	defer devA.Close()
	devB, _ := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{ipB}})
	defer devB.Close()
	ctx := context.Background()

	pdB, _ := devB.AllocPD()
	cqB, _ := devB.CreateCQ(64)
	server, _ := pdB.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cqB, RecvCQ: cqB})
	server.Connect(ctx, &roce.ConnectAttr{QKey: 0x11})
	slab, _ := pdB.NewRecvSlab(server, 32, 1024) // 32 receives of up to 1 KiB, posted

	pdA, _ := devA.AllocPD()
	cqA, _ := devA.CreateCQ(64)
	client, _ := pdA.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cqA, RecvCQ: cqA})
	client.Connect(ctx, &roce.ConnectAttr{QKey: 0x11})
	gidB, _ := devB.GID(1)
	ah, _ := pdA.CreateAH(ctx, roce.AddressVector{DGID: gidB})
	client.PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline, Inline: []byte("datagram"),
		AH: ah, RemoteQPN: server.QPN(), RemoteQKey: 0x11})

	var wc [8]roce.WorkCompletion
	cqB.Wait(ctx)
	n := cqB.Poll(wc[:])
	for i := range wc[:n] {
		fmt.Printf("%s from QP %d\n", slab.Bytes(&wc[i]), wc[i].SrcQP)
		slab.Repost(&wc[i])
	}
	// Output: datagram from QP 17
}

// Many goroutines, one device: each connection has its own CQ and its own
// goroutine that waits only for its completions, bounded by a deadline as a
// net.Conn read would be. A device-wide subscription learns of connections
// that fail.
func Example_manyWaiters() {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	ipA, ipB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	devA, _ := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{ipA},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipB: lb.HardwareAddr()}})
	defer devA.Close()
	devB, _ := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{ipB},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipA: la.HardwareAddr()}})
	defer devB.Close()
	events, _ := devA.SubscribeEvents(16)
	defer events.Close()
	ctx := context.Background()

	type conn struct {
		cq *roce.CQ
		qp *roce.QP
		mr *roce.MR
	}
	mk := func(d *roce.Device) conn {
		pd, _ := d.AllocPD()
		cq, _ := d.CreateCQ(64)
		qp, _ := pd.CreateQP(&roce.QPInitAttr{Type: roce.RC, SendCQ: cq, RecvCQ: cq})
		mr, _ := pd.RegisterMR(make([]byte, 4096), roce.AccessLocalWrite|roce.AccessRemoteWrite)
		return conn{cq, qp, mr}
	}
	const conns, msgs = 4, 10
	results := make([]string, conns)
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		a, b := mk(devA), mk(devB)
		a.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: b.qp.QPN(), RemoteAddr: ipB})
		b.qp.Connect(ctx, &roce.ConnectAttr{RemoteQPN: a.qp.QPN(), RemoteAddr: ipA})
		wg.Add(1)
		go func() { // this connection's goroutine: WRITEs, each waited for
			defer wg.Done()
			var wc [1]roce.WorkCompletion
			done := 0
			for j := 0; j < msgs; j++ {
				a.qp.PostSend(&roce.SendWR{ID: uint64(j), Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
					SGL: []roce.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
				for a.cq.Poll(wc[:]) == 0 {
					if err := a.cq.WaitDeadline(time.Now().Add(5 * time.Second)); err != nil {
						results[i] = err.Error()
						return
					}
				}
				if wc[0].Status == roce.WCSuccess && wc[0].QPN == a.qp.QPN() {
					done++
				}
			}
			results[i] = fmt.Sprintf("connection %d: %d writes completed", i, done)
		}()
	}
	wg.Wait()
	for _, r := range results {
		fmt.Println(r)
	}
	select {
	case ev := <-events.C():
		fmt.Println("event:", ev)
	default:
		fmt.Println("no connection failed")
	}
	// Output:
	// connection 0: 10 writes completed
	// connection 1: 10 writes completed
	// connection 2: 10 writes completed
	// connection 3: 10 writes completed
	// no connection failed
}

// A receive server that hands zero-copy frames to a worker goroutine, which
// releases each one when done with it: the release posts the buffer again.
func ExampleRecvSlab_Frame() {
	la, lb := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	ipA, ipB := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	devA, _ := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{ipA},
		Neighbours: map[netip.Addr]net.HardwareAddr{ipB: lb.HardwareAddr()}})
	defer devA.Close()
	devB, _ := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{ipB}})
	defer devB.Close()
	ctx := context.Background()

	pdB, _ := devB.AllocPD()
	cqB, _ := devB.CreateCQ(64)
	server, _ := pdB.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cqB, RecvCQ: cqB})
	server.Connect(ctx, &roce.ConnectAttr{QKey: 0x11})
	slab, _ := pdB.NewRecvSlab(server, 2, 1024) // two buffers, reused for every datagram

	pdA, _ := devA.AllocPD()
	cqA, _ := devA.CreateCQ(64)
	client, _ := pdA.CreateQP(&roce.QPInitAttr{Type: roce.UD, SendCQ: cqA, RecvCQ: cqA})
	client.Connect(ctx, &roce.ConnectAttr{QKey: 0x11})
	gidB, _ := devB.GID(1)
	ah, _ := pdA.CreateAH(ctx, roce.AddressVector{DGID: gidB})

	frames := make(chan roce.Frame)
	done := make(chan struct{})
	go func() { // the worker: reads each frame in place, then releases it
		for f := range frames {
			fmt.Printf("%s (%d bytes)\n", f.Bytes(), f.Len())
			if err := f.Release(); err != nil {
				fmt.Println(err)
			}
		}
		close(done)
	}()
	var wc [1]roce.WorkCompletion
	for _, msg := range []string{"one", "two", "three", "four"} {
		client.PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline, Inline: []byte(msg),
			AH: ah, RemoteQPN: server.QPN(), RemoteQKey: 0x11})
		for cqB.Poll(wc[:]) == 0 {
			cqB.Wait(ctx)
		}
		f, err := slab.Frame(&wc[0])
		if err != nil {
			fmt.Println(err)
			continue
		}
		frames <- f
	}
	close(frames)
	<-done
	// Output:
	// one (3 bytes)
	// two (3 bytes)
	// three (5 bytes)
	// four (4 bytes)
}

// The GID table of a device: the default GID from the MAC, then the addresses.
func ExampleDevice_GIDs() {
	la, _ := memlink.Pair(faultnet.Config{}, faultnet.Config{})
	d, _ := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("192.168.1.1")}})
	defer d.Close()
	for _, g := range d.GIDs() {
		fmt.Println(g.Index, g.GID, g.Type)
	}
	// Output:
	// 0 fe80::ff:fe00:a RoCE v2
	// 1 ::ffff:192.168.1.1 RoCE v2
}
