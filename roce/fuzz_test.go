package roce

import (
	"bytes"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
)

// FuzzReceive feeds arbitrary frames to a device's receive path, with QPs of
// every type set up to answer: nothing may panic, and the device must keep
// working afterwards.
func FuzzReceive(f *testing.F) {
	// Seeds: the frames of a real exchange.
	var capture bytes.Buffer
	{
		t := f
		da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, &capture)
		a := newEndpoint(t, da, RC, 3*3000+64)
		b := newEndpoint(t, db, RC, 3*3000+64)
		connect(t, a, b, addrA, addrB, ConnectAttr{})
		ua := newEndpoint(t, da, UD, 4096)
		ub := newEndpoint(t, db, UD, 4096)
		connect(t, ua, ub, addrA, addrB, ConnectAttr{})
		if err := ub.qp.PostRecv(&RecvWR{SGL: []SGE{ub.mr.SGE(0, 1000)}}); err == nil {
			ah, _ := ua.pd.CreateAH(t.Context(), AddressVector{DGID: ib.GIDFromAddr(addrB)})
			ua.qp.PostSend(&SendWR{Opcode: WRSend, AH: ah, RemoteQPN: ub.qp.QPN(), RemoteQKey: 0x1234,
				Flags: SendSignaled, SGL: []SGE{ua.mr.SGE(0, 100)}})
			waitWC(t, ua.scq, 5e9)
		}
		exerciseRC(t, a, b, 3000)
		da.Close()
		db.Close()
	}
	if r, err := pcapgo.NewReader(&capture); err == nil {
		for {
			data, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 14))

	da, db := memPair(f, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(f, da, RC, 1<<16)
	b := newEndpoint(f, db, RC, 1<<16)
	connect(f, a, b, addrA, addrB, ConnectAttr{})
	u := newEndpoint(f, da, UD, 4096)
	if err := u.qp.Connect(f.Context(), &ConnectAttr{QKey: 0x1234}); err != nil {
		f.Fatal(err)
	}
	for i := 0; i < 8; i++ {
		a.qp.PostRecv(&RecvWR{SGL: []SGE{a.mr.SGE(0, 4096)}})
		u.qp.PostRecv(&RecvWR{SGL: []SGE{u.mr.SGE(0, 4096)}})
	}
	var rx rxState
	f.Fuzz(func(t *testing.T, frame []byte) {
		da.receiveBatch([][]byte{frame}, &rx)
		da.flush()
		var wc [16]WorkCompletion
		a.scq.Poll(wc[:])
		a.rcq.Poll(wc[:])
		u.rcq.Poll(wc[:])
	})
}
