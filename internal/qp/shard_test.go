package qp_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// With Config.Shards, the QPs with packets to send wait in the queue of
// their shard (QPN mod Shards): TransmitShard sends only that shard's,
// each QP's in PSN order, ReadyShards says which shards have any, and
// Transmit serves them all.
func TestTransmitShards(t *testing.T) {
	const shards = 3
	e, err := qp.New(qp.Config{Clock: &qptest.Clock{}, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	if e.Shards() != shards {
		t.Fatalf("Shards() = %d", e.Shards())
	}
	pd, _ := e.AllocPD()
	cq, _ := e.CreateCQ(256)
	sgid, dgid := ib.GIDFromAddr(netip.MustParseAddr("10.0.0.1")), ib.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	var qps []*qp.QP
	for i := 0; i < 2*shards; i++ {
		q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq, Cap: qp.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxInlineData: 64}})
		if err != nil {
			t.Fatal(err)
		}
		if err := qptest.BringUp(q, 1000+uint32(i), qptest.DefaultRC, 100, 200, sgid, dgid); err != nil {
			t.Fatal(err)
		}
		qps = append(qps, q)
	}
	slots := make([]qp.TxPacket, 64)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 64+4096+64), Headroom: 64}
	}
	// A move to RTS queues a QP, for what it may have queued before.
	if m := e.ReadyShards(); m != 1<<shards-1 {
		t.Fatalf("ReadyShards() = %#b after the moves to RTS", m)
	}
	if n := e.Transmit(slots); n != 0 {
		t.Fatalf("Transmit sent %d packets before any post", n)
	}
	if m := e.ReadyShards(); m != 0 {
		t.Fatalf("ReadyShards() = %#b before any post", m)
	}
	// Three SENDs on the QPs of shards 0 and 2 only.
	const msgs = 3
	posted := 0
	for _, q := range qps {
		if e.ShardOf(q.QPN()) == 1 {
			continue
		}
		for k := 0; k < msgs; k++ {
			if err := q.PostSend(&qp.SendWR{ID: uint64(k), Opcode: qp.WRSend, Flags: qp.SendInline, Inline: []byte("shard")}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
	}
	if m := e.ReadyShards(); m != 0b101 {
		t.Fatalf("ReadyShards() = %#b, want 0b101", m)
	}
	if n := e.TransmitShard(1, slots); n != 0 {
		t.Fatalf("shard 1 sent %d packets, has none", n)
	}
	n := e.TransmitShard(2, slots)
	if n != posted/2 {
		t.Fatalf("shard 2 sent %d packets, want %d", n, posted/2)
	}
	next := map[uint32]ib.PSN{}
	for _, p := range slots[:n] {
		if e.ShardOf(p.SrcQPN) != 2 {
			t.Fatalf("shard 2 sent a packet of QP %d (shard %d)", p.SrcQPN, e.ShardOf(p.SrcQPN))
		}
		psn := ib.BTH(p.Payload()).PSN()
		if want, ok := next[p.SrcQPN]; ok && psn != want {
			t.Fatalf("QP %d: PSN %d after %d", p.SrcQPN, psn, want-1)
		}
		next[p.SrcQPN] = psn + 1
	}
	if m := e.ReadyShards(); m != 0b001 {
		t.Fatalf("ReadyShards() = %#b after shard 2's pass, want 0b001", m)
	}
	if n := e.Transmit(slots); n != posted/2 {
		t.Fatalf("Transmit sent %d packets, want shard 0's %d", n, posted/2)
	}
	if m := e.ReadyShards(); m != 0 || e.HasWork() {
		t.Fatalf("ReadyShards() = %#b after every pass", m)
	}
	// A destroyed QP leaves its shard's queue.
	q := qps[0]
	if err := q.PostSend(&qp.SendWR{ID: 9, Opcode: qp.WRSend, Flags: qp.SendInline, Inline: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if m := e.ReadyShards(); m != 1<<e.ShardOf(q.QPN()) {
		t.Fatalf("ReadyShards() = %#b", m)
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if m := e.ReadyShards(); m != 0 {
		t.Fatalf("ReadyShards() = %#b after the only ready QP was destroyed", m)
	}
}

func TestShardsConfig(t *testing.T) {
	for _, n := range []int{-1, qp.MaxShards + 1} {
		if _, err := qp.New(qp.Config{Clock: &qptest.Clock{}, Shards: n}); !errors.Is(err, qp.ErrInvalidArgument) {
			t.Errorf("Shards %d: %v, want ErrInvalidArgument", n, err)
		}
	}
	e, err := qp.New(qp.Config{Clock: &qptest.Clock{}})
	if err != nil || e.Shards() != 1 || e.ShardOf(12345) != 0 {
		t.Fatalf("default: %v, %d shards", err, e.Shards())
	}
}

// PostRecvConcurrent posts to a QP's own queue in the states that take a
// receive, refuses RESET and a destroyed QP, and leaves the error state
// (a flushed completion) and SRQ-attached QPs to PostRecv.
func TestPostRecvConcurrent(t *testing.T) {
	e, err := qp.New(qp.Config{Clock: &qptest.Clock{}})
	if err != nil {
		t.Fatal(err)
	}
	ep, err := qptest.NewEndpoint(e, qp.RC, 4)
	if err != nil {
		t.Fatal(err)
	}
	q := ep.QP
	wr := &qp.RecvWR{ID: 1}
	if ok, err := q.PostRecvConcurrent(wr); !ok || !errors.Is(err, qp.ErrInvalidState) {
		t.Fatalf("RESET: %v, %v", ok, err)
	}
	if err := q.Modify(&qp.QPAttr{State: qp.StateInit, Port: 1}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if ok, err := q.PostRecvConcurrent(wr); !ok || err != nil {
			t.Fatalf("INIT, receive %d: %v, %v", i, ok, err)
		}
	}
	if ok, err := q.PostRecvConcurrent(wr); !ok || !errors.Is(err, qp.ErrQueueFull) {
		t.Fatalf("full queue: %v, %v", ok, err)
	}
	if err := q.Modify(&qp.QPAttr{State: qp.StateErr}, qp.AttrState); err != nil {
		t.Fatal(err)
	}
	var wc [8]qp.WorkCompletion
	if n := ep.RCQ.Poll(wc[:]); n != 4 || wc[0].Status != qp.WCWRFlushErr {
		t.Fatalf("%d completions after the move to ERR, want the 4 posted, flushed", n)
	}
	if ok, _ := q.PostRecvConcurrent(wr); ok {
		t.Fatal("ERR: posted without the engine")
	}
	srq, _ := ep.PD.CreateSRQ(qp.SRQAttr{MaxWR: 4, MaxSGE: 1})
	sq, err := ep.PD.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: ep.SCQ, RecvCQ: ep.RCQ, SRQ: srq, Cap: qp.QPCap{MaxSendWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := sq.PostRecvConcurrent(wr); ok {
		t.Fatal("an SRQ-attached QP took a receive of its own")
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if ok, err := q.PostRecvConcurrent(wr); !ok || !errors.Is(err, qp.ErrClosed) {
		t.Fatalf("destroyed: %v, %v", ok, err)
	}
}
