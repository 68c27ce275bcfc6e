package qp_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// FuzzDCEngine feeds arbitrary DC packets to a DCI and a DCT that are also
// doing real work: no panic, no write outside registered memory, and the
// DCT's initiator state stays within its bound.
func FuzzDCEngine(f *testing.F) {
	seed := func(op ib.Opcode, dest uint32, srcQP uint32, extra func(b []byte)) []byte {
		info := ib.DCInfo(op)
		b := make([]byte, info.HeaderLen+8+ib.ICRCSize)
		if !info.Payload {
			b = b[:info.HeaderLen+ib.ICRCSize]
		}
		ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: dest, PSN: 0})
		dcHeaders(b, dcKey, srcQP, 0)
		if extra != nil {
			extra(b)
		}
		return append([]byte{1, byte(len(b))}, b...)
	}
	// QPNs: the DCI is 17 on A, the DCT 17 on B (the first QPN of each engine).
	f.Add(seed(ib.DCConnect, 17, 0x99, nil))
	f.Add(append(seed(ib.DCConnect, 17, 0x99, nil), seed(ib.DCWriteOnly, 17, 0x99, func(b []byte) {
		ib.RETH(b[ib.DCInfo(ib.DCWriteOnly).Offset(ib.HdrRETH):]).Encode(&ib.RETHFields{VA: 0x10000, RKey: 0x1234, DMALen: 8})
	})...))
	f.Add(seed(ib.DCAck, 17, 17, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		fx := newDCFix(t, impairments()[0], qptest.DefaultRC, 1, 1, 8, 4)
		all, mem := guarded(4096)
		if _, err := qp.RegMRWithKey(fx.dcts[0].PD, mem, 0x10000, allAccess, 0x1234); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 4; i++ {
			fx.dcts[0].SRQ.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 0x10000 + uint64(i*1024), Length: 1024, LKey: 0x1234}}})
		}
		var p ib.Packet
		for len(data) >= 2 {
			to, n := data[0], int(data[1])
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			b := append([]byte(nil), data[:n]...)
			data = data[n:]
			if ib.ParseDCIB(b, &p) != nil {
				continue
			}
			e, src := fx.net.A.E, &qp.Source{SGID: fx.net.B.GID, DGID: fx.net.A.GID}
			if to&1 == 1 {
				e, src = fx.net.B.E, &qp.Source{SGID: fx.net.A.GID, DGID: fx.net.B.GID}
			}
			_ = e.Receive(&p, src)
		}
		_ = fx.net.Run(func() bool { return false }, 10*time.Second)
		if !guardsIntact(all) {
			t.Fatal("write outside the registered region")
		}
		if k := fx.dcts[0].QP.DCTInitiators(); k > 4 {
			t.Fatalf("%d initiators, bound 4", k)
		}
	})
}
