package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func FuzzConnData(f *testing.F) {
	f.Add(mustHex(f, rstreamREP))
	f.Add(make([]byte, 40))
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConnData(b)
		if err != nil {
			return
		}
		if !bytes.Equal(c.AppendTo(nil), b[:ConnDataLen]) {
			t.Fatalf("re-encode differs: %x", b[:ConnDataLen])
		}
		if c.DataBuf.Length == 0 || c.TargetSGL.Length != SGLSize {
			t.Fatal("accepted invalid conn data")
		}
		end, _ := c.DataBuf.End()
		if c.DataBuf.Addr < c.IOMapAddr()+uint64(c.IOMapSize()*IOMapEntryLen) && c.TargetSGL.Addr < end {
			t.Fatal("accepted overlap")
		}
	})
}

func FuzzImm(f *testing.F) {
	for _, v := range []uint32{0, 1, 0x80000180, 0xC0000001, 0xE0000000, 0xE0000003, 0xA0000000} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v uint32) {
		m, err := ParseImm(v)
		if MakeImm(m.Op(), m.Data()) != Imm(v) {
			t.Fatal("round trip")
		}
		if err == nil {
			switch m.Op() {
			case OpData, OpSGL, OpIOMapSGL, OpCtrl:
			default:
				t.Fatalf("accepted op %v", m.Op())
			}
		}
	})
}

func FuzzTargetList(f *testing.F) {
	f.Add(make([]byte, 80), uint8(2), false)
	f.Fuzz(func(t *testing.T, b []byte, n uint8, big bool) {
		o := binary.ByteOrder(binary.LittleEndian)
		if big {
			o = binary.BigEndian
		}
		if sgl, err := ParseTargetSGL(b, o); err == nil && sgl[0].Overlaps(sgl[1]) {
			t.Fatal("overlap accepted")
		}
		_, _ = ParseAdvert(b, o)
		tbl, err := ParseIOMapTable(b, int(n), o, nil)
		if err == nil && len(tbl) != int(n) {
			t.Fatal("table length")
		}
	})
}

// FuzzConn drives a connected pair with an arbitrary mix of well-formed
// protocol steps and raw messages from the input; nothing may panic, and
// the receiver's accounting must stay inside its ring and its credits.
func FuzzConn(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0, 0, 1, 2, 3})
	f.Add([]byte{4, 0xE0, 0, 0, 0, 0, 4, 0x80, 0, 0, 1, 16})
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := newPair(t, false, len(in)%2 == 1, 8192, 16, 2)
		body := make([]byte, 8192)
		next := func() byte {
			if len(in) == 0 {
				return 0
			}
			c := in[0]
			in = in[1:]
			return c
		}
		// Once a raw message has been accepted the two ends may disagree (a
		// forged write moves the fill position, a forged CTRL closes), so
		// later refusals of valid steps are expected.
		tainted := false
		for len(in) > 0 {
			switch next() % 5 {
			case 0: // a sends data
				w, err := a.conn.Send.WriteData(uint32(next())*40 + 1)
				if err != nil {
					continue
				}
				if _, _, _, err := b.conn.OnRecv(uint32(w.Imm), w.Addr, body[:w.Len]); err != nil && !tainted {
					t.Fatalf("valid write rejected: %v", err)
				}
				a.conn.Send.DataDone(w.Len)
			case 1: // b reads
				_ = b.conn.Recv.Consume(min(b.conn.Recv.Unread(), uint32(next())*50))
			case 2: // b gives credits
				if b.conn.Recv.CreditDue() {
					c, err := b.conn.Recv.NextCredit()
					if err != nil {
						t.Fatal(err)
					}
					var p []byte
					if c.HasSGE {
						p = make([]byte, SGELen)
						c.SGE.Put(p, a.conn.order)
					}
					if _, _, _, err := a.conn.OnRecv(uint32(c.Imm), c.Addr, p); err != nil && !tainted {
						t.Fatalf("valid credit rejected: %v", err)
					}
					b.conn.Recv.CtrlDone()
				}
			case 3: // a publishes an iomap entry
				w, err := a.conn.Send.WriteIOMap(int(next() % 3))
				if err != nil {
					continue
				}
				p := make([]byte, IOMapEntryLen)
				IOMapEntry{Offset: uint64(w.Slot) << 20, SGE: SGE{Addr: uint64(w.Slot+1) << 20, Key: 1, Length: 4096}}.Put(p, b.conn.order)
				if _, _, _, err := b.conn.OnRecv(uint32(w.Imm), w.Addr, p); err != nil && !tainted {
					t.Fatalf("valid iomap rejected: %v", err)
				}
				a.conn.Send.DataDone(IOMapEntryLen)
			case 4: // raw message into b
				imm := uint32(next())<<24 | uint32(next())<<16 | uint32(next())<<8 | uint32(next())
				off := uint64(next()) << 5
				n := int(next()) << 3
				addr := b.cfg.RBufAddr + off
				if next()%2 == 0 {
					addr = b.cfg.TargetAddr + off
				}
				_, _, _, err := b.conn.OnRecv(imm, addr, body[:n])
				if err == nil {
					tainted = true
				} else if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrProtocol) && err != ErrClosed {
					t.Fatalf("peer input refused outside the peer categories: %v", err)
				}
			}
			r := &b.conn.Recv
			if r.Unread() > r.rbufSize || r.readOff >= r.rbufSize || r.advN > SGLSize {
				t.Fatalf("receiver accounting broken: %+v", r)
			}
			if lim, rcvd := r.Granted(); int16(lim-rcvd) < 0 {
				t.Fatal("credits overrun")
			}
		}
	})
}
