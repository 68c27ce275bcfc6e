package qptest

import (
	"fmt"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
)

// Wire joins two engines directly, with no pipe, impairment or clock
// between them: one message at a time is posted, every packet is handed
// straight to the peer and the completions are reaped, so what a loop of
// One costs is the engines' own work (the engine benchmarks of package qp
// and the goals table of package bench measure it).
type Wire struct {
	A, B *Endpoint
	// Packets counts the packets moved between the engines, both ways.
	Packets int

	a, b       *qp.Engine
	slots      []qp.TxPacket
	pkt        ib.Packet
	srcA, srcB qp.Source // what the peer sees as the source of A's (B's) packets
	wcs        [8]qp.WorkCompletion
	sendWR     qp.SendWR
	recvWR     qp.RecvWR
	sendSGE    [1]qp.SGE
	recvSGE    [1]qp.SGE
}

// NewWire connects an RC QP on each of two fresh engines (path MTU 4096)
// for messages of op (WRSend, WRRDMAWrite, WRRDMARead or an atomic) of size
// bytes, up to 1 MiB.
func NewWire(op qp.WROpcode, size int) (*Wire, error) {
	const mrSize, iova = 1 << 20, 0x10000
	if size > mrSize {
		return nil, fmt.Errorf("qptest: message of %d bytes exceeds the wire's %d-byte MRs", size, mrSize)
	}
	n, err := NewNet(Options{PortMTU: ib.MTU4096})
	if err != nil {
		return nil, err
	}
	w := &Wire{a: n.A.E, b: n.B.E,
		srcA: qp.Source{SGID: n.A.GID, DGID: n.B.GID}, srcB: qp.Source{SGID: n.B.GID, DGID: n.A.GID}}
	if w.A, err = NewEndpoint(w.a, qp.RC, 64); err != nil {
		return nil, err
	}
	if w.B, err = NewEndpoint(w.b, qp.RC, 64); err != nil {
		return nil, err
	}
	prm := DefaultRC
	prm.MTU = ib.MTU4096
	if err := n.Connect(w.A.QP, w.B.QP, prm); err != nil {
		return nil, err
	}
	aMR, err := w.A.PD.RegMR(make([]byte, mrSize), iova, qp.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	bMR, err := w.B.PD.RegMR(make([]byte, mrSize), iova, DefaultRC.Access)
	if err != nil {
		return nil, err
	}
	w.slots = make([]qp.TxPacket, 16)
	for i := range w.slots {
		w.slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
	}
	w.sendSGE[0] = qp.SGE{Addr: iova, Length: uint32(size), LKey: aMR.LKey()}
	w.recvSGE[0] = qp.SGE{Addr: iova, Length: uint32(size), LKey: bMR.LKey()}
	w.sendWR = qp.SendWR{Opcode: op, Flags: qp.SendSignaled, SGL: w.sendSGE[:], RemoteAddr: iova, RKey: bMR.RKey()}
	w.recvWR = qp.RecvWR{SGL: w.recvSGE[:]}
	return w, nil
}

// move hands every packet from transmits to to until it has nothing more
// to send, and returns how many there were.
func (w *Wire) move(from, to *qp.Engine, src *qp.Source) (int, error) {
	total := 0
	for {
		n := from.Transmit(w.slots)
		for i := 0; i < n; i++ {
			if err := ib.ParseIB(w.slots[i].Payload(), &w.pkt); err != nil {
				return total, err
			}
			to.Receive(&w.pkt, src)
		}
		total += n
		if n < len(w.slots) {
			return total, nil
		}
	}
}

// One runs one message: post, requests A→B, responses B→A, completions.
func (w *Wire) One() error {
	if w.sendWR.Opcode == qp.WRSend {
		if err := w.B.QP.PostRecv(&w.recvWR); err != nil {
			return err
		}
	}
	if err := w.A.QP.PostSend(&w.sendWR); err != nil {
		return err
	}
	n, err := w.move(w.a, w.b, &w.srcA)
	w.Packets += n
	if err != nil {
		return err
	}
	n, err = w.move(w.b, w.a, &w.srcB)
	w.Packets += n
	if err != nil {
		return err
	}
	if n := w.A.SCQ.Poll(w.wcs[:]); n != 1 || w.wcs[0].Status != qp.WCSuccess {
		return fmt.Errorf("qptest: %d send completions, the first %+v", n, w.wcs[0])
	}
	w.B.RCQ.Poll(w.wcs[:])
	return nil
}
