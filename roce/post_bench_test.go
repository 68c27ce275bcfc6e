package roce

import (
	"context"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
)

// BenchmarkPostSend measures the device's post path alone, per work
// request: batches of 16 posted to a QP in the error state, where each
// completes at once with a flush error, so no frame is built or sent. The
// UD case names an AH in every request.
func BenchmarkPostSend(b *testing.B) {
	for _, typ := range []QPType{RC, UD} {
		b.Run(typ.String(), func(b *testing.B) {
			da, db := memPair(b, faultnet.Config{}, faultnet.Config{}, nil)
			x := newEndpoint(b, da, typ, 4096)
			y := newEndpoint(b, db, typ, 4096)
			connect(b, x, y, addrA, addrB, ConnectAttr{})
			wr := SendWR{Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{x.mr.SGE(0, 64)}}
			if typ == UD {
				ah, err := x.pd.CreateAH(b.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
				if err != nil {
					b.Fatal(err)
				}
				wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah, y.qp.QPN(), 0x1234
			}
			if err := x.qp.Modify(context.Background(), &QPAttr{State: StateErr}, AttrState); err != nil {
				b.Fatal(err)
			}
			const batch = 16
			wrs := make([]SendWR, batch)
			for i := range wrs {
				wrs[i] = wr
			}
			var wc [batch]WorkCompletion
			b.ReportAllocs()
			for b.Loop() {
				if n, err := x.qp.PostSendBatch(wrs); n != batch || err != nil {
					b.Fatal(n, err)
				}
				for got := 0; got < batch; {
					got += x.scq.Poll(wc[:])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/wr")
		})
	}
}
