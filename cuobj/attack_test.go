package cuobj

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// The attacks of issue #28 on tokens and the client's listener, over
// memlink. The exhaustion attacks on the server are in s3gw (they need
// its HTTP front end).

// strangerIP is a second address of the server's device: a host that
// sniffed a token but was not handed it.
var strangerIP = netip.MustParseAddr("10.0.0.3")

func attackDevices(t testing.TB) (*roce.Device, *roce.Device) {
	t.Helper()
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}, net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{srvIP, strangerIP}, Neighbours: map[netip.Addr]net.HardwareAddr{cliIP: macB}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{cliIP},
		Neighbours: map[netip.Addr]net.HardwareAddr{srvIP: macA, strangerIP: macA}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

// steal serves a request with a token the attacker holds, into or from
// loot, on a channel of the server's that served the client before (its
// connection to the client kept); it returns the request's error.
func (r *rig) steal(ctx context.Context, loot *Buffer, tok Token, put bool) error {
	s := r.srv
	ch := r.channel()
	defer func() { r.chans <- ch }()
	var err error
	req := &Request{Key: "attack", Local: loot, RemoteAddr: tok.Addr, Size: uint64(tok.Size), Token: tok.String(), Channel: ch}
	if put {
		_, err = s.HandlePutObject(ctx, req)
	} else {
		_, err = s.HandleGetObject(ctx, req)
	}
	return err
}

func wantAccessError(t *testing.T, what string, err error) {
	t.Helper()
	if st, ok := CompletionStatus(err); !ok || st != roce.WCRemAccessErr {
		t.Errorf("%s: %v, want a remote access error", what, err)
	}
}

// wantDead checks that a dead token got nothing: a remote access error
// on a kept connection, or, where the server had to connect anew, a
// refusal by a listener that has no live token for it.
func wantDead(t *testing.T, what string, err error) {
	t.Helper()
	if st, ok := CompletionStatus(err); ok && st == roce.WCRemAccessErr {
		return
	}
	var rej *mad.RejectError
	if errors.As(err, &rej) {
		return
	}
	t.Errorf("%s: %v, want a remote access error or a refused connection", what, err)
}

// waitCount waits (generously) for a counter to reach want.
func waitCount(t *testing.T, what string, get func() uint64, want uint64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for get() < want {
		if time.Now().After(deadline) {
			t.Errorf("%s = %d, want at least %d", what, get(), want)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var attackProtos = []Proto{ProtoRC, ProtoDC}

// TestAttackWidenedToken: a PUT token sniffed while its request runs,
// its rsize widened to the whole 64 KiB registration, replayed to the
// server: the server's READ beyond the object fails with a remote access
// error and fetches nothing, and the legitimate PUT still completes.
func TestAttackWidenedToken(t *testing.T) {
	for _, proto := range attackProtos {
		t.Run(proto.String(), func(t *testing.T) {
			sdev, cdev := attackDevices(t)
			const regSize, objSize = 64 << 10, 4096
			r := newRig(t, sdev, cdev, regSize, &ClientOptions{Proto: proto}, nil)
			ctx := ctxT(t, 60*time.Second)
			buf := pattern(regSize, 1) // beyond objSize: the client's private data
			if err := r.cli.Register(buf); err != nil {
				t.Fatal(err)
			}
			loot, err := r.srv.AllocHostBuffer(regSize)
			if err != nil {
				t.Fatal(err)
			}
			lreg, err := r.srv.RegisterBuffer(loot)
			if err != nil {
				t.Fatal(err)
			}
			var attacked bool
			r.hook = func(h *Handle, info *RDMAInfo) error {
				if attacked {
					return nil
				}
				attacked = true
				tok := info.Token
				tok.Size = regSize
				wantAccessError(t, "widened PUT token", r.steal(ctx, lreg, tok, true))
				return nil
			}
			n, err := r.cli.Put(ctx, "user", buf[:objSize], 0, 0)
			if err != nil || n != objSize {
				t.Fatalf("legitimate Put = %d, %v", n, err)
			}
			if !bytes.Equal(r.sbuf[:objSize], buf[:objSize]) {
				t.Error("legitimate Put: data differs")
			}
			if !bytes.Equal(loot, make([]byte, regSize)) {
				t.Error("the widened READ fetched client memory")
			}
			// A GET token widened the same way writes nothing beyond it.
			attacked = false
			r.object = pattern(objSize, 2)
			r.hook = func(h *Handle, info *RDMAInfo) error {
				if attacked {
					return nil
				}
				attacked = true
				tok := info.Token
				tok.Size = regSize
				copy(loot, bytes.Repeat([]byte{0xee}, regSize))
				wantAccessError(t, "widened GET token", r.steal(ctx, lreg, tok, false))
				return nil
			}
			if n, err := r.cli.Get(ctx, "user", buf[:objSize], 0, 0); err != nil || n != objSize {
				t.Fatalf("legitimate Get = %d, %v", n, err)
			}
			if !bytes.Equal(buf[:objSize], r.object) || !bytes.Equal(buf[objSize:], pattern(regSize, 1)[objSize:]) {
				t.Error("the widened WRITE changed client memory")
			}
			if proto == ProtoRC {
				waitCount(t, "client AccessErrors", r.cli.Stats().AccessErrors.Load, 2)
			}
			t.Logf("%v: grants %d, revokes %d, access errors %d", proto, r.cli.Stats().Grants.Load(),
				r.cli.Stats().Revokes.Load(), r.cli.Stats().AccessErrors.Load())
		})
	}
}

// TestAttackReplay: tokens replayed after their request finished (as is
// and widened), and one given back with PutRDMAToken, are dead.
func TestAttackReplay(t *testing.T) {
	for _, proto := range attackProtos {
		t.Run(proto.String(), func(t *testing.T) {
			sdev, cdev := attackDevices(t)
			const regSize, objSize = 64 << 10, 4096
			r := newRig(t, sdev, cdev, regSize, &ClientOptions{Proto: proto}, nil)
			ctx := ctxT(t, 60*time.Second)
			private := pattern(regSize, 3)
			buf := append([]byte(nil), private...)
			if err := r.cli.Register(buf); err != nil {
				t.Fatal(err)
			}
			var sniffed []Token
			r.hook = func(h *Handle, info *RDMAInfo) error {
				sniffed = append(sniffed, info.Token)
				return nil
			}
			r.object = pattern(objSize, 4)
			if n, err := r.cli.Get(ctx, "user", buf[:objSize], 0, 0); err != nil || n != objSize {
				t.Fatalf("Get = %d, %v", n, err)
			}
			if n, err := r.cli.Put(ctx, "user", buf[:objSize], 0, 0); err != nil || n != objSize {
				t.Fatalf("Put = %d, %v", n, err)
			}
			copy(private, r.object) // what buf holds now
			loot, _ := r.srv.AllocHostBuffer(regSize)
			lreg, err := r.srv.RegisterBuffer(loot)
			if err != nil {
				t.Fatal(err)
			}
			get, put := sniffed[0], sniffed[1]
			wideGet, widePut := get, put
			wideGet.Size, widePut.Size = regSize, regSize
			for _, c := range []struct {
				what string
				tok  Token
				put  bool
			}{{"GET token replayed", get, false}, {"GET token replayed widened", wideGet, false},
				{"PUT token replayed", put, true}, {"PUT token replayed widened", widePut, true}} {
				copy(loot, bytes.Repeat([]byte{0xee}, regSize))
				if c.put {
					clear(loot)
				}
				wantDead(t, c.what, r.steal(ctx, lreg, c.tok, c.put))
				if c.put && !bytes.Equal(loot, make([]byte, regSize)) {
					t.Errorf("%s: fetched client memory", c.what)
				}
			}
			if !bytes.Equal(buf, private) {
				t.Error("a replayed GET token changed client memory")
			}
			// A token from GetRDMAToken is live until PutRDMAToken.
			desc, err := r.cli.GetRDMATokenFor(buf, objSize, 0, OpGet, srvIP)
			if err != nil {
				t.Fatal(err)
			}
			tok, _ := ParseToken(desc)
			copy(loot, pattern(objSize, 5))
			if err := r.steal(ctx, lreg, Token{Addr: tok.Addr, Size: objSize, RKey: tok.RKey, LID: tok.LID, QPN: tok.QPN,
				HasGID: true, GID: tok.GID}, false); err != nil {
				t.Fatalf("live token: %v", err)
			}
			if err := r.cli.PutRDMAToken(desc); err != nil {
				t.Fatal(err)
			}
			wantDead(t, "token given back", r.steal(ctx, lreg, tok, false))
			if proto == ProtoRC {
				waitCount(t, "client AccessErrors", r.cli.Stats().AccessErrors.Load, 1)
			}
			st := r.cli.Stats()
			if st.Grants.Load() != st.Revokes.Load() {
				t.Errorf("grants %d, revokes %d: a token outlived its request", st.Grants.Load(), st.Revokes.Load())
			}
		})
	}
}

// dialClient connects to the client's listener from local with a hello
// for endpoint, as a stranger's own RC QP would.
func dialClient(ctx context.Context, t *testing.T, dev *roce.Device, local netip.Addr, to netip.AddrPort, endpoint uint32) (*cm.Conn, error) {
	t.Helper()
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pd.Close() })
	cq, err := dev.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cq.Close() })
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return cm.Dial(dctx, dev, to, cm.DialOptions{
		QP:        cm.QPOptions{PD: pd, SendCQ: cq, RecvCQ: cq, Cap: roce.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}},
		LocalAddr: local, InitiatorDepth: 1, ResponderResources: 1,
		PrivateData: appendHello(nil, ProtoRC, endpoint),
	})
}

// wantRejected checks that a dial was refused with a REJ that says
// nothing: no endpoint, no reason text.
func wantRejected(t *testing.T, what string, c *cm.Conn, err error) {
	t.Helper()
	var rej *mad.RejectError
	if !errors.As(err, &rej) {
		if c != nil {
			c.Close()
		}
		t.Errorf("%s: %v, want a REJ", what, err)
		return
	}
	if !bytes.Equal(rej.PrivateData, make([]byte, len(rej.PrivateData))) || len(rej.ARI) != 0 {
		t.Errorf("%s: the REJ carries %q / ARI %x", what, rej.PrivateData, rej.ARI)
	}
}

// TestAttackListener: the client's listener accepts only the server a
// live token was handed to. A stranger's QP, with the endpoint from a
// sniffed token, is refused while the token lives and after; a REJ tells
// a wrong endpoint nothing; the server itself, once the token is dead,
// is refused too.
func TestAttackListener(t *testing.T) {
	sdev, cdev := attackDevices(t)
	r := newRig(t, sdev, cdev, 4096, nil, nil)
	ctx := ctxT(t, 90*time.Second)
	buf := make([]byte, 4096)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(4096, 6)
	var tok Token
	r.hook = func(h *Handle, info *RDMAInfo) error {
		tok = info.Token
		to := netip.AddrPortFrom(cliIP, tok.LID)
		c, err := dialClient(ctx, t, sdev, strangerIP, to, tok.QPN)
		wantRejected(t, "stranger with a live token's endpoint", c, err)
		c, err = dialClient(ctx, t, sdev, srvIP, to, tok.QPN^1)
		wantRejected(t, "wrong endpoint", c, err)
		return nil
	}
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
		t.Fatalf("legitimate Get = %d, %v", n, err)
	}
	r.hook = nil
	to := netip.AddrPortFrom(cliIP, tok.LID)
	c, err := dialClient(ctx, t, sdev, strangerIP, to, tok.QPN)
	wantRejected(t, "stranger after the request", c, err)
	c, err = dialClient(ctx, t, sdev, srvIP, to, tok.QPN)
	wantRejected(t, "the server's address with no live token", c, err)
	st := r.cli.Stats()
	// At least: a retransmitted REQ may be refused twice.
	if st.Strangers.Load() < 3 || st.Refused.Load() < 4 {
		t.Errorf("strangers %d, refused %d; want 3, 4", st.Strangers.Load(), st.Refused.Load())
	}
	// The legitimate server still works (its connection was accepted
	// while its token lived and is kept).
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 || !bytes.Equal(buf, r.object) {
		t.Fatalf("second Get = %d, %v", n, err)
	}
}
