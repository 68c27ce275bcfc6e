package rsocket

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/rsocket/wire"
)

// rawPeer is a hand-driven rsocket client: it connects with the conn data
// it is given and posts whatever writes a test asks for.
type rawPeer struct {
	cmc  *cm.Conn
	mr   *roce.MR
	peer wire.ConnData
	used int // bytes of the MR's upper half taken by earlier writes
}

func dialRaw(t *testing.T, dev *roce.Device, raddr netip.AddrPort, cd wire.ConnData) (*rawPeer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegisterMR(make([]byte, 256<<10), roce.AccessLocalWrite|roce.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	// The conn data points into our MR unless the test set its own.
	if cd.TargetSGL.Addr == 0 {
		cd.TargetSGL = wire.SGE{Addr: mr.Addr(), Key: mr.RKey(), Length: wire.SGLSize}
		cd.DataBuf = wire.SGE{Addr: mr.Addr() + 4096, Key: mr.RKey(), Length: 64 << 10}
	}
	cmc, err := cm.Dial(ctx, dev, raddr, cm.DialOptions{QP: cm.QPOptions{PD: pd, SigAll: true,
		Access: roce.AccessLocalWrite | roce.AccessRemoteWrite,
		Prepare: func(c *cm.Conn) error {
			for i := 0; i < 64; i++ {
				if err := c.QP().PostRecv(&roce.RecvWR{}); err != nil {
					return err
				}
			}
			return nil
		}}, PrivateData: cd.AppendTo(nil)})
	if err != nil {
		mr.Close()
		pd.Close()
		return nil, err
	}
	t.Cleanup(func() { cmc.Close(); mr.Close(); pd.Close() })
	p := &rawPeer{cmc: cmc, mr: mr}
	if p.peer, err = wire.ParseConnData(cmc.PrivateData()); err != nil {
		t.Fatal(err)
	}
	return p, nil
}

// write posts an RDMA WRITE WITH IMM of n bytes (from our MR) to addr/key.
func (p *rawPeer) write(t *testing.T, imm uint32, addr uint64, key uint32, payload []byte) {
	t.Helper()
	// Payloads come from the upper half of the MR; the victim writes its
	// adverts into the lower one. Each write takes its own bytes: the
	// device reads them when it transmits, after PostSend returns.
	off := 128<<10 + p.used
	if off+len(payload) > len(p.mr.Bytes()) {
		off, p.used = 128<<10, 0
	}
	p.used += len(payload)
	copy(p.mr.Bytes()[off:], payload)
	wr := roce.SendWR{Opcode: roce.WRRDMAWriteWithImm, Imm: imm, RemoteAddr: addr, RKey: key}
	if len(payload) > 0 {
		wr.SGL = []roce.SGE{p.mr.SGE(off, len(payload))}
	}
	if err := p.cmc.QP().PostSend(&wr); err != nil {
		t.Logf("post: %v", err) // the victim may have torn the connection down
	}
}

func TestBadPeer(t *testing.T) {
	cases := []struct {
		name   string
		send   func(t *testing.T, p *rawPeer)
		want   error  // category, or nil when more than one rule may catch it first
		reason string // wire.Error.Reason
	}{
		{"reserved op", func(t *testing.T, p *rawPeer) {
			p.write(t, 5<<29|1, 0, 0, nil)
		}, wire.ErrMalformed, "reserved-op"},
		{"write past buffer", func(t *testing.T, p *rawPeer) {
			d := p.peer.DataBuf
			p.write(t, uint32(wire.MakeImm(wire.OpData, d.Length+4096)), d.Addr, d.Key, make([]byte, d.Length+4096))
		}, nil, ""},
		{"length differs from immediate", func(t *testing.T, p *rawPeer) {
			d := p.peer.DataBuf
			p.write(t, uint32(wire.MakeImm(wire.OpData, 10)), d.Addr, d.Key, make([]byte, 20))
		}, wire.ErrMalformed, "length"},
		{"no credits", func(t *testing.T, p *rawPeer) {
			d := p.peer.DataBuf
			for i := 0; i <= int(p.peer.Credits); i++ {
				p.write(t, uint32(wire.MakeImm(wire.OpData, 1)), d.Addr+uint64(i), d.Key, []byte{byte(i)})
			}
		}, wire.ErrProtocol, "credit"},
		{"zero-length advert", func(t *testing.T, p *rawPeer) {
			s := p.peer.TargetSGL
			p.write(t, uint32(wire.MakeImm(wire.OpSGL, 100)), s.Addr+wire.SGELen, s.Key, make([]byte, wire.SGELen))
		}, wire.ErrMalformed, "zero-length"},
		{"overlapping advert", func(t *testing.T, p *rawPeer) {
			s := p.peer.TargetSGL
			b := make([]byte, wire.SGELen)
			// Slot 0 holds our first half (4096 + 64 KiB into our MR).
			wire.SGE{Addr: p.mr.Addr() + 8192, Key: p.mr.RKey(), Length: 4096}.Put(b, binary.LittleEndian)
			p.write(t, uint32(wire.MakeImm(wire.OpSGL, 100)), s.Addr+wire.SGELen, s.Key, b)
		}, wire.ErrMalformed, "overlap"},
		{"iomap without table", func(t *testing.T, p *rawPeer) {
			s := p.peer.TargetSGL
			// Zero bytes: a 24-byte write would end outside the victim's
			// 32-byte target list, which its QP refuses by itself.
			p.write(t, uint32(wire.MakeImm(wire.OpIOMapSGL, 0)), s.Addr+2*wire.SGELen, s.Key, nil)
		}, wire.ErrProtocol, "slot"},
	}
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lc := ListenConfig{Options: Options{RQSize: 16}}
	l, err := lc.Listen(ctx, db, "tcp", ":7471")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	raddr := netip.AddrPortFrom(addrB, 7471)
	// A healthy connection alongside must not notice anything.
	good, goodSrv := func() (*Conn, *Conn) {
		acc := make(chan *Conn, 1)
		go func() { c, _ := l.AcceptRsocket(ctx); acc <- c }()
		c, err := Dial(ctx, da, "tcp", raddr.String())
		if err != nil {
			t.Fatal(err)
		}
		return c, <-acc
	}()
	defer good.Close()
	defer goodSrv.Close()

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := ReadStats().ProtocolErrors
			acc := make(chan *Conn, 1)
			go func() { c, _ := l.AcceptRsocket(ctx); acc <- c }()
			cd := wire.ConnData{Version: 1, Flags: wire.ConnFlagIOMap, Credits: 64}
			p, err := dialRaw(t, da, raddr, cd)
			if err != nil {
				t.Fatal(err)
			}
			srv := <-acc
			if srv == nil {
				t.Fatal("accept failed")
			}
			defer srv.Close()
			tc.send(t, p)
			// Read only once the damage is done: reading grants credits.
			for end := time.Now().Add(10 * time.Second); srv.Err() == nil && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			srv.SetReadDeadline(time.Now().Add(10 * time.Second))
			buf := make([]byte, 256<<10)
			var rerr error
			for rerr == nil {
				_, rerr = srv.Read(buf)
			}
			var pe *ProtocolError
			if !errors.As(rerr, &pe) {
				t.Fatalf("read: %v, want a ProtocolError", rerr)
			}
			if tc.want != nil && (!errors.Is(rerr, tc.want) || wire.ReasonOf(rerr) != tc.reason) {
				t.Fatalf("read: %v, want %v (%s)", rerr, tc.want, tc.reason)
			}
			if ReadStats().ProtocolErrors == before {
				t.Fatal("not counted")
			}
			if _, err := srv.Write([]byte("x")); err == nil {
				t.Fatal("write after a protocol error succeeded")
			}
			t.Log(rerr)
		})
	}
	// The healthy connection still works.
	go func() { good.Write([]byte("still here")); good.CloseWrite() }()
	got, err := io.ReadAll(goodSrv)
	if err != nil || string(got) != "still here" {
		t.Fatalf("healthy connection: %q %v", got, err)
	}
}

func TestRejectVersion(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, "tcp", ":7471")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go l.AcceptRsocket(ctx)
	before := ReadStats().RejectedVersion
	_, err = dialRaw(t, da, netip.AddrPortFrom(addrB, 7471), wire.ConnData{Version: 2, Flags: wire.ConnFlagIOMap, Credits: 64})
	var rej *mad.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("dial with version 2: %v, want a REJ", err)
	}
	if ReadStats().RejectedVersion != before+1 {
		t.Fatal("reject not counted")
	}
	// And the listener still accepts good peers.
	c, err := Dial(ctx, da, "tcp", netip.AddrPortFrom(addrB, 7471).String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_ = net.ErrClosed
}
