package qp_test

import (
	"slices"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
	"github.com/goroce/goroce/link/faultnet"
)

// With SetReplyBeforeAck a request the application posted goes before the
// ACK a receive queued, and the ACK follows it at once (it is not held
// behind further requests); in the next exchange the request leads again.
func TestReplyBeforeAck(t *testing.T) {
	p := newPair(t, qp.RC, impairment{name: "clean", ab: faultnet.Config{}, ba: faultnet.Config{}}, qptest.DefaultRC, 16)
	aMR := p.regMR(p.a, make([]byte, 1024), 0x1000, allAccess)
	bMR := p.regMR(p.b, make([]byte, 1024), 0x7000_0000, allAccess)
	p.b.QP.SetReplyBeforeAck(true)
	write := func(ep *qptest.Endpoint, id uint64, lkey, rkey uint32, local, remote uint64) {
		t.Helper()
		if err := ep.QP.PostSend(&qp.SendWR{ID: id, Opcode: qp.WRRDMAWrite, Flags: qp.SendSignaled,
			SGL: []qp.SGE{{Addr: local, Length: 64, LKey: lkey}}, RemoteAddr: remote, RKey: rkey}); err != nil {
			t.Fatal(err)
		}
	}
	var order []ib.Opcode
	p.net.Tap = func(from string, b []byte) {
		if from == "B" {
			order = append(order, ib.BTH(b).Opcode())
		}
	}
	id := uint64(0)
	for round, replies := range []int{1, 1, 3} {
		id++
		write(p.a, id, aMR.LKey(), bMR.RKey(), 0x1000, 0x7000_0000)
		p.net.Step() // A sends; B receives and queues its ACK, but has not transmitted
		order = order[:0]
		for range replies {
			id++
			write(p.b, id, bMR.LKey(), aMR.RKey(), 0x7000_0000, 0x1000+64*id)
		}
		p.net.Step()
		want := []ib.Opcode{ib.RCWriteOnly, ib.RCAck}
		for range replies - 1 {
			want = append(want, ib.RCWriteOnly)
		}
		if !slices.Equal(order, want) {
			t.Fatalf("exchange %d: B sent %v after receiving A's WRITE and posting %d, want %v", round, order, replies, want)
		}
		// Let everything be acknowledged before the next exchange.
		var aw, bw []qp.WorkCompletion
		if err := p.net.Run(func() bool {
			aw, bw = pollAll(p.a.SCQ, aw), pollAll(p.b.SCQ, bw)
			return len(aw) == 1 && len(bw) == replies
		}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
}
