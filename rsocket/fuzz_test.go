package rsocket

import (
	"encoding/binary"
	"testing"

	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// FuzzRecv feeds arbitrary receive completions (immediate, length) and
// arbitrary bytes in the target list (what a peer may RDMA-write there at
// any time) to a connection's receive path: it must end the connection
// with an error or accept the message, never panic, and never count more
// unread bytes than the ring holds.
func FuzzRecv(f *testing.F) {
	f.Add([]byte{0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x10})
	f.Add([]byte{0x80, 0x00, 0x01, 0x80, 0x00, 0x00, 0x00, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10, 0})
	f.Add([]byte{0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18})
	f.Add([]byte{0xE0, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg := config{sq: 16, rq: 16, inline: 64, iomap: 2, sbuf: 8192, rbuf: 8192}
		ep := &endpoint{cfg: cfg, rbuf: make([]byte, cfg.rbuf), tbuf: make([]byte, wire.TargetListLen(cfg.iomap))}
		cc := wire.ConnConfig{SQSize: cfg.sq, RQSize: cfg.rq, SBufSize: uint32(cfg.sbuf), RBufAddr: 0x100000,
			RBufKey: 1, RBufSize: uint32(cfg.rbuf), TargetAddr: 0x200000, TargetKey: 2, IOMapSize: cfg.iomap}
		peer := wire.NewConnData(16, 2, 0x300000, 3, 0x400000, 4, 8192, false)
		w, err := wire.NewConn(cc, &peer)
		if err != nil {
			t.Fatal(err)
		}
		// closing: no receive is reposted and a failure starts no DREQ.
		c := &Conn{ep: ep, w: w, peer: peer, entry: binary.LittleEndian, nextAdv: 1,
			peerMaps: make([]wire.IOMapEntry, cfg.iomap), closing: true, rdl: newDeadline(), wdl: newDeadline()}
		for len(in) >= 8 && c.err == nil {
			imm, n := binary.BigEndian.Uint32(in), binary.BigEndian.Uint32(in[4:])
			in = in[8:]
			k := copy(ep.tbuf, in)
			in = in[k:]
			c.onRecv(&roce.WorkCompletion{Opcode: roce.WCRecvRDMAWithImm, Flags: roce.WCWithImm, Imm: imm, ByteLen: n})
			if u := c.w.Recv.Unread(); u > uint32(cfg.rbuf) {
				t.Fatalf("%d unread bytes in a %d-byte ring", u, cfg.rbuf)
			}
			if c.err == nil && c.w.Recv.Unread() > 0 {
				p := make([]byte, 1000)
				c.copyOutLocked(p, c.w.Recv.Unread())
			}
		}
	})
}
