package qp_test

import (
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
)

// FuzzCCReceive feeds arbitrary packets with an arbitrary ECN field to
// engines with DCQCN on (CNPs, CE marks on any opcode, to any QPN), then
// lets both transmit and run their timers: nothing panics, an incoming CNP
// is never a dropped packet, and the rate stays within its bounds.
func FuzzCCReceive(f *testing.F) {
	cnp := make([]byte, ib.BTHSize+ib.CNPReservedSize+ib.ICRCSize)
	ib.BTH(cnp).Encode(&ib.BTHFields{Opcode: ib.CNP, PKey: 0xFFFF, BECN: true, DestQP: 17})
	f.Add(cnp, uint8(0), uint16(0))
	f.Add(cnp, uint8(3), uint16(1000))
	short := append([]byte(nil), cnp[:ib.BTHSize+4]...)
	f.Add(short, uint8(3), uint16(1))
	req := make([]byte, ib.BTHSize+ib.RETHSize+8+ib.ICRCSize)
	ib.BTH(req).Encode(&ib.BTHFields{Opcode: ib.Opcode(0x0A), PKey: 0xFFFF, DestQP: 18})
	f.Add(req, uint8(3), uint16(5))
	f.Fuzz(func(t *testing.T, b []byte, tc uint8, step uint16) {
		c := newCCPair(t, qp.CCConfig{DCQCN: true})
		var p ib.Packet
		if ib.ParseDCIB(b, &p) != nil {
			return
		}
		isCNP := p.BTH.Opcode() == ib.CNP
		dropped := c.a.Stats().RxDropped
		src := qp.Source{SGID: c.gidB, DGID: c.gidA, TrafficClass: tc}
		err := c.a.Receive(&p, &src)
		if isCNP && err == nil && c.a.Stats().RxDropped != dropped {
			t.Fatal("a CNP taken was counted dropped")
		}
		c.clk.T += time.Duration(step) * time.Microsecond
		c.a.Advance(c.clk.T)
		c.a.Transmit(c.slots)
		if r, lim := c.qa.QP.CCRate(); r <= 0 || r > 10e9 || lim && r < 1e6 {
			t.Fatalf("rate %d limited %v", r, lim)
		}
	})
}
