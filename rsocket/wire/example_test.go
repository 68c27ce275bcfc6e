package wire_test

import (
	"fmt"

	"github.com/goroce/goroce/rsocket/wire"
)

// One direction of a stream: the accepting side parses the REQ's conn
// data, the connecting side the REP's; the receiver advertises its second
// half, the sender writes.
func Example() {
	rx := wire.ConnConfig{SQSize: 384, RQSize: 384, SBufSize: 1 << 17, RBufAddr: 0x10000, RBufKey: 0x11,
		RBufSize: 1 << 17, TargetAddr: 0x1000, TargetKey: 0x22}
	tx := wire.ConnConfig{SQSize: 384, RQSize: 384, SBufSize: 1 << 17, RBufAddr: 0x90000, RBufKey: 0x33,
		RBufSize: 1 << 17, TargetAddr: 0x2000, TargetKey: 0x44}

	rxData, txData := rx.Local(), tx.Local()
	rep := rxData.AppendTo(nil) // the receiver's REP private data
	peerOfTx, err := wire.ParseConnData(rep)
	if err != nil {
		panic(err)
	}
	peerOfRx, _ := wire.ParseConnData(txData.AppendTo(nil))
	sender, _ := wire.NewConn(tx, &peerOfTx)
	receiver, _ := wire.NewConn(rx, &peerOfRx)
	fmt.Printf("REP % x\n", rep[:8])

	// First CQ pass on the receiver: advertise the second half.
	c, _ := receiver.Recv.NextCredit()
	sge := make([]byte, wire.SGELen)
	c.SGE.Put(sge, peerOfRx.EntryOrder())
	ev, slot, _, _ := sender.OnRecv(uint32(c.Imm), c.Addr, sge)
	fmt.Printf("credit imm %#x -> %v slot %d\n", uint32(c.Imm), ev == wire.EvAdvert, slot)

	// A 3000-byte rsend: chunks of 2048 then the rest.
	olen := uint32(wire.OlapStartSize)
	left := uint64(3000)
	for left > 0 {
		w, _ := sender.Send.WriteData(wire.NextChunk(left, &olen))
		_, _, _, err := receiver.OnRecv(uint32(w.Imm), w.Addr, make([]byte, w.Len))
		fmt.Printf("write %d bytes at %#x imm %#x: %v\n", w.Len, w.Addr, uint32(w.Imm), err)
		left -= uint64(w.Len)
	}
	// Output:
	// REP 01 02 01 80 00 00 00 00
	// credit imm 0x80000180 -> true slot 1
	// write 2048 bytes at 0x10000 imm 0x800: <nil>
	// write 952 bytes at 0x10800 imm 0x3b8: <nil>
}
