package qp_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

const guard = 64

// guarded allocates n bytes with guard bytes on both sides.
func guarded(n int) (all, inner []byte) {
	all = make([]byte, n+2*guard)
	for i := range all {
		all[i] = 0xA5
	}
	inner = all[guard : guard+n]
	clear(inner)
	return all, inner
}

func guardsIntact(all []byte) bool {
	for _, b := range all[:guard] {
		if b != 0xA5 {
			return false
		}
	}
	for _, b := range all[len(all)-guard:] {
		if b != 0xA5 {
			return false
		}
	}
	return true
}

// FuzzEngine feeds arbitrary packets to an RC responder (B) with registered
// memory and to an RC requester (A) with outstanding requests. Neither may
// panic or write outside a registered region, and afterwards a valid exchange
// over the same engines still works.
//
// Input: records of [flags][len hi][len lo] + len bytes; flags bits 0-1 select
// the target (0 = RC responder B, 1 = RC requester A, 2 = UC QP on B, 3 = UD QP
// on B), bit 2 keeps the packet's own DestQP instead of steering it to the
// target QP, bit 3 sends it from a third address (which RC and UC drop).
func FuzzEngine(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := qptest.NewNet(qptest.Options{PortMTU: ib.MTU4096})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := qptest.NewEndpoint(n.A.E, qp.RC, 16)
		b, _ := qptest.NewEndpoint(n.B.E, qp.RC, 16)
		prm := qptest.DefaultRC
		prm.PSNA, prm.PSNB = 0x100, 0x200
		prm.MTU = ib.MTU256
		prm.RetryCnt, prm.RNRRetry = 2, 2
		if err := n.Connect(a.QP, b.QP, prm); err != nil {
			t.Fatal(err)
		}
		ucA, _ := qptest.NewEndpoint(n.A.E, qp.UC, 4)
		ucB, _ := qptest.NewEndpoint(n.B.E, qp.UC, 4)
		udA, _ := qptest.NewEndpoint(n.A.E, qp.UD, 4)
		udB, _ := qptest.NewEndpoint(n.B.E, qp.UD, 4)
		if err := n.Connect(ucA.QP, ucB.QP, prm); err != nil {
			t.Fatal(err)
		}
		if err := n.Connect(udA.QP, udB.QP, prm); err != nil {
			t.Fatal(err)
		}
		// Responder memory at the IOVAs seeds use.
		bAll, bMem := guarded(4096)
		bMR, err := qp.RegMRWithKey(b.PD, bMem, 0x10000, allAccess, 0x1234)
		if err != nil {
			t.Fatal(err)
		}
		rAll, rMem := guarded(1024)
		rMR, _ := b.PD.RegMR(rMem, 0x80000, qp.AccessLocalWrite)
		for i := 0; i < 4; i++ {
			b.QP.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x80000 + uint64(i*256), Length: 256, LKey: rMR.LKey()}}})
		}
		// UC and UD receives (their own PD) into guarded memory.
		uAll, uMem := guarded(1024)
		ucMR, _ := qp.RegMRWithKey(ucB.PD, uMem[:512], 0x10000, allAccess, 0x2234)
		udMR, _ := udB.PD.RegMR(uMem[512:], 0x90000, qp.AccessLocalWrite)
		for i := 0; i < 2; i++ {
			ucB.QP.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x10000 + uint64(i*256), Length: 256, LKey: ucMR.LKey()}}})
			udB.QP.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x90000 + uint64(i*256), Length: 256, LKey: udMR.LKey()}}})
		}
		// Requester with a READ and a FETCH_ADD outstanding (their requests are dropped).
		aAll, aMem := guarded(1024)
		aMR, _ := a.PD.RegMR(aMem, 0x4000, qp.AccessLocalWrite)
		a.QP.PostSend(&qp.SendWR{ID: 1, Opcode: qp.WRRDMARead, SGL: []qp.SGE{{Addr: 0x4000, Length: 600, LKey: aMR.LKey()}}, RemoteAddr: 0x10000, RKey: bMR.RKey()})
		a.QP.PostSend(&qp.SendWR{ID: 2, Opcode: qp.WRAtomicFetchAndAdd, SGL: []qp.SGE{{Addr: 0x4000 + 1000, Length: 8, LKey: aMR.LKey()}}, RemoteAddr: 0x10000, RKey: bMR.RKey(), CompareAdd: 1})
		slots := make([]qp.TxPacket, 8)
		for i := range slots {
			slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 32}
		}
		drain := func(e *qp.Engine) {
			for k := 0; k < 1000 && e.Transmit(slots) == len(slots); k++ {
			}
		}
		drain(n.A.E)

		var pkt ib.Packet
		buf := make([]byte, 1<<16)
		third := ib.GIDFromAddr(netip.MustParseAddr("10.0.0.66"))
		for len(data) >= 3 {
			flags := data[0]
			ln := min(int(data[1])<<8|int(data[2]), len(data)-3)
			p := buf[:ln]
			copy(p, data[3:3+ln])
			data = data[3+ln:]
			target, e := b.QP, n.B.E
			switch flags & 3 {
			case 1:
				target, e = a.QP, n.A.E
			case 2:
				target = ucB.QP
			case 3:
				target = udB.QP
			}
			if flags&4 == 0 && len(p) >= ib.BTHSize {
				p[5], p[6], p[7] = byte(target.QPN()>>16), byte(target.QPN()>>8), byte(target.QPN())
			}
			if ib.ParseIB(p, &pkt) != nil {
				continue
			}
			src := qp.Source{SGID: n.A.GID, DGID: n.B.GID}
			if e == n.A.E {
				src = qp.Source{SGID: n.B.GID, DGID: n.A.GID}
			}
			if flags&8 != 0 {
				src.SGID = third
			}
			e.Receive(&pkt, &src)
			drain(e)
			n.Clock.T += time.Millisecond
			n.A.E.Advance(n.Clock.T)
			n.B.E.Advance(n.Clock.T)
			drain(n.A.E)
			drain(n.B.E)
		}
		if !guardsIntact(bAll) || !guardsIntact(rAll) || !guardsIntact(aAll) || !guardsIntact(uAll) {
			t.Fatal("write outside a registered region")
		}

		// A valid exchange afterwards: reset both QPs and reconnect.
		for _, q := range []*qp.QP{a.QP, b.QP} {
			if err := q.Modify(&qp.QPAttr{State: qp.StateReset}, qp.AttrState); err != nil {
				t.Fatal(err)
			}
		}
		pollAll(a.SCQ, nil)
		pollAll(b.RCQ, nil)
		prm.PSNA, prm.PSNB = 0xFFFFFE, 7
		if err := n.Connect(a.QP, b.QP, prm); err != nil {
			t.Fatal(err)
		}
		msg := []byte("a valid exchange after hostile input")
		copy(aMem, msg)
		if err := b.QP.PostRecv(&qp.RecvWR{ID: 77, SGL: []qp.SGE{{Addr: 0x80000, Length: 256, LKey: rMR.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if err := a.QP.PostSend(&qp.SendWR{ID: 10, Opcode: qp.WRSend, Flags: qp.SendSignaled, SGL: []qp.SGE{{Addr: 0x4000, Length: uint32(len(msg)), LKey: aMR.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		var wcs []qp.WorkCompletion
		if err := n.Run(func() bool { wcs = pollAll(a.SCQ, wcs); return len(wcs) > 0 }, time.Second); err != nil {
			t.Fatal(err)
		}
		if wcs[0].Status != qp.WCSuccess || !bytes.Equal(rMem[:len(msg)], msg) {
			t.Fatalf("exchange after fuzzing failed: %+v", wcs[0])
		}
	})
}

func addSeeds(f *testing.F) {
	rec := func(flags byte, p []byte) []byte {
		return append([]byte{flags, byte(len(p) >> 8), byte(len(p))}, p...)
	}
	mk := func(op ib.Opcode, psn uint32, ext []byte, payload []byte, ack bool) []byte {
		b := make([]byte, ib.BTHSize)
		pc := (-len(payload)) & 3
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xFFFF, PSN: ib.PSN(psn), AckReq: ack, PadCount: uint8(pc)})
		b = append(b, ext...)
		b = append(b, payload...)
		return append(b, make([]byte, pc+4)...)
	}
	reth := func(va uint64, key, n uint32) []byte {
		r := make([]byte, 16)
		binary.BigEndian.PutUint64(r, va)
		binary.BigEndian.PutUint32(r[8:], key)
		binary.BigEndian.PutUint32(r[12:], n)
		return r
	}
	atom := func(va uint64, key uint32, add uint64) []byte {
		r := make([]byte, 28)
		binary.BigEndian.PutUint64(r, va)
		binary.BigEndian.PutUint32(r[8:], key)
		binary.BigEndian.PutUint64(r[12:], add)
		return r
	}
	aeth := func(syn byte, msn uint32) []byte { return []byte{syn, byte(msn >> 16), byte(msn >> 8), byte(msn)} }
	pl := bytes.Repeat([]byte{0x42}, 256)
	var s []byte
	s = append(s, rec(0, mk(ib.RCWriteFirst, 0x200, reth(0x10000, 0x1234, 600), pl, false))...)
	s = append(s, rec(0, mk(ib.RCWriteMiddle, 0x201, nil, pl, false))...)
	s = append(s, rec(0, mk(ib.RCWriteLast, 0x202, nil, pl[:88], true))...)
	s = append(s, rec(0, mk(ib.RCReadRequest, 0x203, reth(0x10000, 0x1234, 4096), nil, true))...)
	s = append(s, rec(0, mk(ib.RCFetchAdd, 0x213, atom(0x10008, 0x1234, 5), nil, true))...)
	s = append(s, rec(0, mk(ib.RCFetchAdd, 0x213, atom(0x10008, 0x1234, 5), nil, true))...)
	s = append(s, rec(0, mk(ib.RCSendOnly, 0x214, nil, pl[:100], true))...)
	f.Add(s)
	f.Add(append(rec(0, mk(ib.RCAtomicWrite, 0x200, reth(0x10008, 0x1234, 8), pl[:8], true)),
		rec(0, mk(ib.RCAtomicWrite, 0x200, reth(0x10008, 0x1234, 8), pl[:8], true))...))
	f.Add(rec(0, mk(ib.RCFlush, 0x200, append([]byte{0, 0, 0, 0x11}, reth(0x10000, 0x1234, 64)...), nil, true)))
	f.Add(rec(0, mk(ib.RCWriteOnly, 0x200, reth(0x10000+4090, 0x1234, 100), pl[:100], true)))
	f.Add(rec(0, mk(ib.RCWriteOnly, 0x200, reth(^uint64(0)-10, 0x1234, 100), pl[:100], true)))
	f.Add(rec(0, mk(ib.RCSendFirst, 0x200, nil, pl, false)))
	f.Add(rec(8, mk(ib.RCWriteOnly, 0x200, reth(0x10000, 0x1234, 100), pl[:100], true)))
	f.Add(rec(9, mk(ib.RCAck, 0x100, aeth(0x60, 2), nil, false)))
	f.Add(rec(0, mk(ib.RCReadRequest, 0x200, reth(0x10000, 0x1234, 1<<31), nil, true)))
	var r []byte
	r = append(r, rec(1, mk(ib.RCReadResponseFirst, 0x100, aeth(0x1f, 1), pl, false))...)
	r = append(r, rec(1, mk(ib.RCReadResponseMiddle, 0x101, nil, pl, false))...)
	r = append(r, rec(1, mk(ib.RCReadResponseLast, 0x102, aeth(0x1f, 1), pl[:88], false))...)
	r = append(r, rec(1, mk(ib.RCAtomicAck, 0x103, append(aeth(0x1f, 2), 0, 0, 0, 0, 0, 0, 0, 9), nil, false))...)
	r = append(r, rec(1, mk(ib.RCAck, 0x103, aeth(0x60, 2), nil, false))...)
	r = append(r, rec(1, mk(ib.RCAck, 0x100, aeth(0x21, 2), nil, false))...)
	f.Add(r)
	f.Add(rec(1, mk(ib.RCReadResponseOnly, 0x100, aeth(0x1f, 1), pl[:200], false)))
	// UC: a write and a send; UD: a send with DETH.
	var u []byte
	u = append(u, rec(2, mk(ib.UCWriteFirst, 0x200, reth(0x10000, 0x2234, 300), pl, false))...)
	u = append(u, rec(2, mk(ib.UCWriteLast, 0x201, nil, pl[:44], false))...)
	u = append(u, rec(2, mk(ib.UCSendOnlyImm, 0x202, []byte{0, 0, 0, 1}, pl[:100], false))...)
	deth := []byte{0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x42}
	u = append(u, rec(3, mk(ib.UDSendOnly, 0, deth, pl[:200], false))...)
	u = append(u, rec(3, mk(ib.UDSendOnlyImm, 0, append(deth, 1, 2, 3, 4), pl[:250], false))...)
	f.Add(u)
	// Real rxe request packets from the reference captures, if present.
	if root, err := os.Getwd(); err == nil {
		dir := filepath.Join(root, "..", "..", "shared", "rxe-lab", "captures", "mtu1024")
		for _, name := range []string{"rc_write.pcap", "rc_read.pcap", "rc_send.pcap"} {
			frames, err := readPcap(filepath.Join(dir, name))
			if err != nil {
				continue
			}
			var seed []byte
			for _, fr := range frames[:min(len(frames), 12)] {
				var p ib.Packet
				if ib.Parse(fr, &p) == nil {
					seed = append(seed, rec(0, p.IB)...)
				}
			}
			f.Add(seed)
		}
	}
}
