package mrsp

import (
	"bytes"
	"testing"
)

func FuzzMessage(f *testing.F) {
	b, _ := AppendAAR(nil, exampleRegions)
	f.Add(b)
	f.Add([]byte{2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 4, 0})
	f.Add([]byte{0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, err := Type(b)
		if err != nil {
			return
		}
		switch typ {
		case MsgAAR:
			rs, err := ParseAAR(b, nil, nil)
			if err != nil {
				var e *Error
				if x, ok := err.(*Error); ok {
					e = x
				}
				if e == nil || e.Code == 0 {
					t.Fatalf("AAR error without MRSP code: %v", err)
				}
				if e.Kind != ErrMalformed && e.Kind != ErrRefused {
					t.Fatalf("AAR refused outside ErrMalformed/ErrRefused: %v", err)
				}
				return
			}
			out, err := AppendAAR(nil, rs)
			if err != nil || !bytes.Equal(out, b) {
				t.Fatalf("AAR round trip %x", b)
			}
			if len(b) > RecvBufLen {
				t.Fatal("accepted AAR larger than the receive buffer")
			}
			// Plans over an NAA that answers with regions of the same size.
			var adv []Advert
			for i, r := range rs {
				if !r.Internal() {
					adv = append(adv, Advert{Addr: uint64(i+1) << 32, RKey: 1, Size: r.Size})
				}
			}
			for rpc := 0; rpc < 2; rpc++ {
				ws, err := HostWrites(rs, adv, rpc, nil, 0x81, nil)
				if err == nil && (!ws[len(ws)-1].WithImm || ws[0].Len == 0) {
					t.Fatalf("bad plan %+v", ws)
				}
			}
			if ws, err := NAAWrites(rs, 0, nil); err == nil {
				for _, w := range ws[:len(ws)-1] {
					if w.WithImm {
						t.Fatal("immediate before the last write")
					}
				}
			}
		case MsgA:
			as, err := ParseA(b, nil)
			if err != nil {
				return
			}
			out, _ := AppendA(nil, as)
			if !bytes.Equal(out, b) {
				t.Fatalf("A round trip %x", b)
			}
		case MsgErr:
			c, err := ParseErr(b)
			if err == nil && !bytes.Equal(AppendErr(nil, c), b) {
				t.Fatalf("ERR round trip %x", b)
			}
		}
	})
}

func FuzzImm(f *testing.F) {
	f.Add(uint32(0x81))
	f.Add(uint32(0))
	f.Fuzz(func(t *testing.T, v uint32) {
		fn, user, err := ParseHostImm(v)
		if err == nil {
			w, err := HostImm(fn, user)
			if err != nil || w != v {
				t.Fatalf("%#x -> %#x %v", v, w, err)
			}
		}
		if c, failed := ParseNAAImm(v); failed != (v != 0) || (failed && c == 0) {
			t.Fatal(v, c, failed)
		}
	})
}

// FuzzMachine feeds arbitrary event sequences; nothing panics and the
// state is always one of the defined ones.
func FuzzMachine(f *testing.F) {
	f.Add([]byte{1, 4, 6, 9, 10, 12, 3, 13, 13, 13, 15})
	f.Fuzz(func(t *testing.T, evs []byte) {
		for _, role := range []Role{Host, NAA} {
			m := NewMachine(role)
			for i, e := range evs {
				if e%19 == uint8(EvStartData) {
					_ = m.StartData(int(e >> 5))
				} else {
					_ = m.Step(Event(e % 19))
				}
				if _, ok := stateNames[m.State()]; !ok {
					t.Fatalf("step %d: state %v", i, m.State())
				}
				if m.writesLeft < 0 {
					t.Fatal("negative writes")
				}
			}
		}
	})
}
