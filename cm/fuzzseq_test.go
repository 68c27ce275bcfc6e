package cm

import (
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
)

// FuzzEngineSequence drives two connected engines with a byte-coded
// sequence of crafted MADs (whose IDs and QPNs are drawn from the live
// connections, so they reach the state machines), API calls in any state,
// losses and clock jumps. Whatever happens, once the consumers give up
// (reject requests, destroy IDs) and every timer has run, both engines
// must hold nothing.
func FuzzEngineSequence(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{3, 0x10, 7, 7, 9, 9, 12, 1, 14, 2, 15})
	f.Add([]byte{13, 13, 13, 4, 4, 5, 6, 8, 8, 8, 8})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 200 {
			ops = ops[:200]
		}
		p := newPair(t)
		_ = p.b.e.Listen(testSID)
		_ = p.a.e.Listen(testSID + 1)
		aID, bID := p.establish()
		ids := []uint32{aID, bID, 0, 0x12345678}
		qpns := []uint32{0x11, 0x22, 0, 0xFFFFFF}
		next := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			v := ops[*i]
			*i++
			return v
		}
		drop := false
		for i := 0; i < len(ops); {
			op := next(&i)
			to := p.b
			if op&0x80 != 0 {
				to = p.a
			}
			from := p.peer(to)
			local := ids[next(&i)%4]
			remote := ids[next(&i)%4]
			qpn := qpns[next(&i)%4]
			m := make(mad.MAD, mad.Size)
			attr := mad.AttrID(0x10 + op%11)
			h := mad.CMHeader(attr, uint64(op))
			m.Encode(&h)
			switch attr {
			case mad.AttrREQ:
				m.REQ().Encode(&mad.REQFields{LocalCommID: local, ServiceID: testSID + uint64(op>>6&1), LocalQPN: qpn,
					LocalCAGUID: 0x505400fffe000001 + uint64(op>>5&1), PathMTU: 3, MaxCMRetries: 1,
					LocalCMResponseTimeout: 10, Primary: mad.PathFields{LocalACKTimeout: 10}})
			case mad.AttrMRA:
				m.MRA().Encode(&mad.MRAFields{LocalCommID: local, RemoteCommID: remote, MessageMRAed: mad.MsgType(op >> 4 % 3), ServiceTimeout: op % 32})
			case mad.AttrREJ:
				m.REJ().Encode(&mad.REJFields{LocalCommID: local, RemoteCommID: remote, Reason: mad.RejectReason(op%36 + 1), ARILength: 8})
			case mad.AttrREP:
				m.REP().Encode(&mad.REPFields{LocalCommID: local, RemoteCommID: remote, LocalQPN: qpn, LocalCAGUID: 0x505400fffe000002})
			case mad.AttrRTU:
				m.RTU().Encode(&mad.RTUFields{LocalCommID: local, RemoteCommID: remote})
			case mad.AttrDREQ:
				m.DREQ().Encode(&mad.DREQFields{LocalCommID: local, RemoteCommID: remote, RemoteQPN: qpn})
			case mad.AttrDREP:
				m.DREP().Encode(&mad.DREPFields{LocalCommID: local, RemoteCommID: remote})
			case mad.AttrSIDRREQ:
				m.SIDRREQ().Encode(&mad.SIDRREQFields{RequestID: local, ServiceID: testSID + uint64(op>>6&1)})
			case mad.AttrSIDRREP:
				m.SIDRREP().Encode(&mad.SIDRREPFields{RequestID: local, QPN: qpn})
			case mad.AttrLAP:
				m.LAP().Encode(&mad.LAPFields{LocalCommID: local, RemoteCommID: remote, RemoteQPN: qpn})
			case mad.AttrAPR:
				m.APR().Encode(&mad.APRFields{LocalCommID: local, RemoteCommID: remote})
			}
			if err := to.e.Receive(Path{Local: to.addr, Remote: from.addr}, m); err != nil {
				t.Fatal(err)
			}
			// API calls on whatever IDs exist, in whatever state.
			switch next(&i) % 8 {
			case 0:
				_ = to.e.Disconnect(local, nil)
			case 1:
				_ = to.e.Destroy(remote)
			case 2:
				_ = to.e.RTU(local, nil)
			case 3:
				_ = to.e.Accept(local, acceptParams())
			case 4:
				p.clock.t += time.Duration(next(&i)) * 100 * time.Millisecond
				p.a.e.Advance()
				p.b.e.Advance()
			case 5:
				cp := p.connectParams(testSID + uint64(op>>6&1))
				cp.Path.Local, cp.Path.Remote = from.addr, to.addr
				id, err := from.e.Connect(cp)
				if err == nil {
					ids[2] = id
				}
			}
			drop = next(&i)%4 == 0
			if !drop {
				p.pump()
			} else {
				for _, s := range []*side{p.a, p.b} {
					for {
						if _, ok := s.e.PollOutbound(); !ok {
							break
						}
					}
				}
			}
			for _, s := range []*side{p.a, p.b} {
				if err := s.e.checkTimers(); err != nil {
					t.Fatal(err)
				}
				for _, ev := range s.events {
					if ev.Type == EventRequest || ev.Type == EventReply {
						ids[3] = ev.ID
					}
				}
			}
		}
		// The consumers give up on everything.
		p.pump()
		for round := 0; round < 3; round++ {
			for _, s := range []*side{p.a, p.b} {
				for id := range s.e.conns {
					_ = s.e.Destroy(id)
				}
				s.events = nil
			}
			p.pump()
			p.drain()
		}
		p.assertEmpty()
	})
}
