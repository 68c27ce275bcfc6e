package qp_test

import (
	"fmt"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
)

type exampleClock struct{ t time.Duration }

func (c *exampleClock) Now() time.Duration { return c.t }

// This is the loop a device runs around an engine: received frames go in
// through Receive, packets to send come out of Transmit into buffers with
// headroom for the encapsulation, and timers run from Advance. Here two
// engines are wired back to back.
func Example() {
	clock := &exampleClock{}
	a, _ := qp.New(qp.Config{Clock: clock})
	b, _ := qp.New(qp.Config{Clock: clock})
	mk := func(e *qp.Engine) (*qp.PD, *qp.CQ, *qp.QP) {
		pd, _ := e.AllocPD()
		cq, _ := e.CreateCQ(16)
		q, _ := pd.CreateQP(&qp.QPInitAttr{Type: qp.RC, SendCQ: cq, RecvCQ: cq,
			Cap: qp.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
		return pd, cq, q
	}
	_, acq, aq := mk(a)
	bpd, bcq, bq := mk(b)
	connect := func(q *qp.QP, peer uint32) {
		q.Modify(&qp.QPAttr{State: qp.StateInit, Port: 1, AccessFlags: qp.AccessRemoteWrite},
			qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags)
		q.Modify(&qp.QPAttr{State: qp.StateRTR, PathMTU: ib.MTU1024, DestQPN: peer, RQPSN: 100, MaxDestRdAtomic: 1, MinRNRTimer: 12},
			qp.AttrState|qp.AttrAV|qp.AttrPathMTU|qp.AttrDestQPN|qp.AttrRQPSN|qp.AttrMaxDestRdAtomic|qp.AttrMinRNRTimer)
		q.Modify(&qp.QPAttr{State: qp.StateRTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1},
			qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRdAtomic)
	}
	connect(aq, bq.QPN())
	connect(bq, aq.QPN())

	buf := make([]byte, 64)
	mr, _ := bpd.RegMR(buf, 0, qp.AccessLocalWrite)
	bq.PostRecv(&qp.RecvWR{ID: 1, SGL: []qp.SGE{{Addr: 0, Length: 64, LKey: mr.LKey()}}})
	aq.PostSend(&qp.SendWR{ID: 7, Opcode: qp.WRSend, Flags: qp.SendSignaled | qp.SendInline, Inline: []byte("hello")})

	slots := make([]qp.TxPacket, 8)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 128+4096+64), Headroom: 128}
	}
	var pkt ib.Packet
	move := func(from, to *qp.Engine) {
		for from.HasWork() {
			n := from.Transmit(slots)
			if n == 0 {
				return
			}
			for _, s := range slots[:n] {
				// A device would prepend Ethernet/IP/UDP to s.Payload(),
				// fill in the ICRC and send it to s.AV.DGID.
				if ib.ParseIB(s.Payload(), &pkt) == nil {
					to.Receive(&pkt, &qp.Source{})
				}
			}
		}
	}
	move(a, b) // the SEND
	move(b, a) // its ACK
	clock.t += time.Millisecond
	a.Advance(clock.t)

	var wc [1]qp.WorkCompletion
	bcq.Poll(wc[:])
	fmt.Printf("B: %v %v %q\n", wc[0].Opcode, wc[0].Status, buf[:wc[0].ByteLen])
	acq.Poll(wc[:])
	fmt.Printf("A: WR %d %v %v\n", wc[0].WRID, wc[0].Opcode, wc[0].Status)
	// Output:
	// B: RECV success "hello"
	// A: WR 7 SEND success
}
