//go:build linux

package roce

import (
	"context"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/faultnet"
	"golang.org/x/sys/unix"
)

// The data path allocates nothing per packet: a SEND/RECV round over the
// memory link, through both devices' goroutines, costs no allocation.
func TestAllocsSendRecv(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	allocsSendRecv(t, da, db)
}

// The same with transmit shards, the two QPs in different ones.
func TestAllocsSendRecvShards(t *testing.T) {
	da, db := shardPair(t, 3, faultnet.Config{})
	newEndpoint(t, db, RC, 64) // b's QP in another shard than a's
	allocsSendRecv(t, da, db)
}

func allocsSendRecv(t *testing.T, da, db *Device) {
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	ctx := context.Background()
	rwr := RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4000)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 4000)}}
	var wc [4]WorkCompletion
	round := func() {
		if err := b.qp.PostRecv(&rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:1]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if wc[0].Status != WCSuccess {
				t.Fatal(wc[0].Status)
			}
		}
	}
	for i := 0; i < 50; i++ {
		round() // warm up pools and maps
	}
	allocs := testing.AllocsPerRun(200, round)
	t.Logf("%.2f allocations per 4000-byte SEND (4 packets + ACK)", allocs)
	if allocs > 0.5 {
		t.Fatalf("%.2f allocations per round trip, want 0", allocs)
	}
}

func BenchmarkSendRecvMemlink(b *testing.B) {
	da, db := memPair(b, faultnet.Config{}, faultnet.Config{}, nil)
	x := newEndpoint(b, da, RC, 1<<16)
	y := newEndpoint(b, db, RC, 1<<16)
	connect(b, x, y, addrA, addrB, ConnectAttr{})
	ctx := context.Background()
	const size = 4096
	rwr := RecvWR{ID: 1, SGL: []SGE{y.mr.SGE(0, size)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, size)}}
	var wc [1]WorkCompletion
	b.ReportAllocs()
	b.SetBytes(size)
	for b.Loop() {
		y.qp.PostRecv(&rwr)
		x.qp.PostSend(&swr)
		for _, cq := range []*CQ{x.scq, y.rcq} {
			for cq.Poll(wc[:]) == 0 {
				cq.Wait(ctx)
			}
		}
	}
}

// UD datagrams through an address handle, received into a slab: no
// allocation either.
func TestAllocsUD(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, UD, 4096)
	b := newEndpoint(t, db, UD, 4096)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	slab, err := b.pd.NewRecvSlab(b.qp, 8, 1024)
	if err != nil {
		t.Fatal(err)
	}
	ah, err := a.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
	if err != nil {
		t.Fatal(err)
	}
	swr := SendWR{Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 1000)}, AH: ah,
		RemoteQPN: b.qp.QPN(), RemoteQKey: 0x1234}
	ctx := context.Background()
	var wc [1]WorkCompletion
	round := func() {
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if wc[0].Status != WCSuccess {
				t.Fatal(wc[0].Status)
			}
		}
		if len(slab.Bytes(&wc[0])) != 1000 {
			t.Fatal("short datagram")
		}
		if err := slab.Repost(&wc[0]); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		round()
	}
	if allocs := testing.AllocsPerRun(200, round); allocs > 0.5 {
		t.Fatalf("%.2f allocations per UD datagram", allocs)
	}
}

// The same SEND/RECV loop over kernel UDP sockets.
func TestAllocsUDPLink(t *testing.T) {
	da, db := udpPair(t)
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, loA, loB, ConnectAttr{PathMTU: ib.MTU1024})
	ctx := context.Background()
	rwr := RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4000)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 4000)}}
	var wc [1]WorkCompletion
	round := func() {
		if err := b.qp.PostRecv(&rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if wc[0].Status != WCSuccess {
				t.Fatal(wc[0].Status)
			}
		}
	}
	for i := 0; i < 50; i++ {
		round()
	}
	if allocs := testing.AllocsPerRun(200, round); allocs > 0.5 {
		t.Fatalf("%.2f allocations per round trip over UDP", allocs)
	}
}

// And over AF_XDP between two namespaces.
func TestAllocsXDP(t *testing.T) {
	netnstest.RequireCaps(t, unix.CAP_NET_RAW, unix.CAP_NET_ADMIN, unix.CAP_BPF)
	p := readyPair(t, 1500)
	da := openIn(t, p.VethA, xdpLink, Options{})
	db := openIn(t, p.VethB, xdpLink, Options{})
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, p.VethA.Addr.Addr(), p.VethB.Addr.Addr(), ConnectAttr{})
	ctx := context.Background()
	rwr := RecvWR{ID: 1, SGL: []SGE{b.mr.SGE(0, 4000)}}
	swr := SendWR{ID: 2, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 4000)}}
	var wc [1]WorkCompletion
	round := func() {
		if err := b.qp.PostRecv(&rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&swr); err != nil {
			t.Fatal(err)
		}
		for _, cq := range []*CQ{a.scq, b.rcq} {
			for cq.Poll(wc[:]) == 0 {
				if err := cq.Wait(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if wc[0].Status != WCSuccess {
				t.Fatal(wc[0].Status)
			}
		}
	}
	for i := 0; i < 50; i++ {
		round()
	}
	if allocs := testing.AllocsPerRun(200, round); allocs > 0.5 {
		t.Fatalf("%.2f allocations per round trip over AF_XDP", allocs)
	}
}
