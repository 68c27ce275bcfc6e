package cuobj

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/looppair"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// The attacks of issue #28 on tokens and the client's listener, over
// memlink and over the kernel UDP link on loopback. The exhaustion
// attacks on the server are in s3gw (they need its HTTP front end).

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

// attackNet is the server's and the client's device an attack runs on,
// and the addresses it uses: the server's device holds srv and stranger.
type attackNet struct {
	sdev, cdev         *roce.Device
	srv, cli, stranger netip.Addr
}

// attackLink opens the devices of an attack over one kind of link.
type attackLink struct {
	name string
	open func(t *testing.T) attackNet
}

// attackLinks are the links every attack runs over.
var attackLinks = []attackLink{
	{"memlink", func(t *testing.T) attackNet {
		sdev, cdev := attackDevices(t)
		return attackNet{sdev: sdev, cdev: cdev, srv: srvIP, cli: cliIP, stranger: strangerIP}
	}},
	{"udp", udpAttackNet},
}

// forAttackLinks runs fn in a subtest for each of attackLinks.
func forAttackLinks(t *testing.T, fn func(t *testing.T, lk attackLink)) {
	for _, lk := range attackLinks {
		t.Run(lk.name, func(t *testing.T) { fn(t, lk) })
	}
}

// udpAttackNet opens the devices on the kernel UDP link on loopback: the
// server's serves 127.R.S.1 and the stranger's .3, the client's .2.
func udpAttackNet(t *testing.T) attackNet {
	t.Helper()
	b := looppair.Prefix()
	b[3] = 1
	n := attackNet{srv: netip.AddrFrom4(b)}
	b[3] = 2
	n.cli = netip.AddrFrom4(b)
	b[3] = 3
	n.stranger = netip.AddrFrom4(b)
	n.sdev, n.cdev = looppair.Pair(t, []netip.Addr{n.srv, n.stranger}, n.cli)
	return n
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
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		for _, proto := range attackProtos {
			t.Run(proto.String(), func(t *testing.T) {
				pair := lk.open(t)
				const regSize, objSize = 64 << 10, 4096
				r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, regSize, &ClientOptions{Proto: proto}, nil)
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
	})
}

// TestAttackReplay: tokens replayed after their request finished (as is
// and widened), and one given back with PutRDMAToken, are dead.
func TestAttackReplay(t *testing.T) {
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		for _, proto := range attackProtos {
			t.Run(proto.String(), func(t *testing.T) {
				pair := lk.open(t)
				const regSize, objSize = 64 << 10, 4096
				r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, regSize, &ClientOptions{Proto: proto}, nil)
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
				desc, err := r.cli.GetRDMATokenFor(buf, objSize, 0, OpGet, pair.srv)
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
	})
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
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		pair := lk.open(t)
		r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, 4096, nil, nil)
		ctx := ctxT(t, 90*time.Second)
		buf := make([]byte, 4096)
		if err := r.cli.Register(buf); err != nil {
			t.Fatal(err)
		}
		r.object = pattern(4096, 6)
		var tok Token
		r.hook = func(h *Handle, info *RDMAInfo) error {
			tok = info.Token
			to := netip.AddrPortFrom(pair.cli, tok.LID)
			c, err := dialClient(ctx, t, pair.sdev, pair.stranger, to, tok.QPN)
			wantRejected(t, "stranger with a live token's endpoint", c, err)
			c, err = dialClient(ctx, t, pair.sdev, pair.srv, to, tok.QPN^1)
			wantRejected(t, "wrong endpoint", c, err)
			return nil
		}
		if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
			t.Fatalf("legitimate Get = %d, %v", n, err)
		}
		r.hook = nil
		to := netip.AddrPortFrom(pair.cli, tok.LID)
		c, err := dialClient(ctx, t, pair.sdev, pair.stranger, to, tok.QPN)
		wantRejected(t, "stranger after the request", c, err)
		c, err = dialClient(ctx, t, pair.sdev, pair.srv, to, tok.QPN)
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
	})
}

// stealOn is steal on a given server channel.
func (r *rig) stealOn(ctx context.Context, ch uint16, loot *Buffer, tok Token, put bool) error {
	req := &Request{Key: "attack", Local: loot, RemoteAddr: tok.Addr, Size: uint64(tok.Size), Token: tok.String(), Channel: ch}
	var err error
	if put {
		_, err = r.srv.HandlePutObject(ctx, req)
	} else {
		_, err = r.srv.HandleGetObject(ctx, req)
	}
	return err
}

// TestAttackWindows: by default an RC token is a type 2 window bound
// through the server's connection and naming it by its QPN. A window
// works in range on that connection; replayed after its request or after
// PutRDMAToken (the window invalidated), widened, or used through another
// connection of the same server (another QP), it gets a remote access
// error, counted by the client and its device, and client memory is
// untouched.
func TestAttackWindows(t *testing.T) {
	forAttackLinks(t, func(t *testing.T, lk attackLink) {
		pair := lk.open(t)
		const regSize, objSize, off = 64 << 10, 4096, 8192
		r := newRigAt(t, pair.sdev, pair.cdev, pair.srv, regSize, &ClientOptions{Proto: ProtoRC}, nil)
		ctx := ctxT(t, 90*time.Second)
		private := pattern(regSize, 7)
		buf := append([]byte(nil), private...)
		if err := r.cli.Register(buf); err != nil {
			t.Fatal(err)
		}
		reg := r.cli.regions[uintptrOf(buf)]
		loot, err := r.srv.AllocHostBuffer(regSize)
		if err != nil {
			t.Fatal(err)
		}
		lreg, err := r.srv.RegisterBuffer(loot)
		if err != nil {
			t.Fatal(err)
		}
		st := r.cli.Stats()
		wantGrants := func(step string, windows, regions uint64) {
			t.Helper()
			if w, g := st.WindowGrants.Load(), st.RegionGrants.Load(); w != windows || g != regions {
				t.Fatalf("%s: %d window grants, %d region grants; want %d, %d", step, w, g, windows, regions)
			}
		}
		// connect serves a Get: with no live connection of the server's, its
		// token is a region, and the server (re)connects through channel 0.
		seed := uint64(100)
		connect := func(step string, windows, regions uint64) {
			t.Helper()
			seed++
			r.object = pattern(objSize, seed)
			if n, err := r.cli.Get(ctx, "user", buf[:objSize], 0, 0); err != nil || n != objSize {
				t.Fatalf("%s: Get = %d, %v", step, n, err)
			}
			copy(private, r.object)
			wantGrants(step, windows, regions)
			// The client records the connection once the CM handshake is
			// over, which may be after the server's WRITE.
			deadline := time.Now().Add(20 * time.Second)
			for r.cli.idleConns(r.cli.rails[0], pair.srv) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no live connection of the server's", step)
				}
				time.Sleep(time.Millisecond)
			}
		}
		untouched := func(what string) {
			t.Helper()
			if !bytes.Equal(buf, private) {
				t.Errorf("%s changed client memory", what)
			}
		}
		lootClean := func(what string) {
			t.Helper()
			if !bytes.Equal(loot, make([]byte, regSize)) {
				t.Errorf("%s fetched client memory", what)
			}
		}
		violations := func() uint64 { return pair.cdev.Counters().RKeyViolation }
		v0 := violations()

		connect("first Get", 0, 1)
		ch0 := r.channel() // the channel whose connection serves the client
		r.chans <- ch0

		// A callback's token is a window bound through that connection.
		var sniffed Token
		r.hook = func(h *Handle, info *RDMAInfo) error { sniffed = info.Token; return nil }
		r.object = pattern(objSize, 9)
		if n, err := r.cli.Get(ctx, "user", buf[off:off+objSize], 0, 0); err != nil || n != objSize {
			t.Fatalf("Get through a window = %d, %v", n, err)
		}
		r.hook = nil
		copy(private[off:], r.object)
		untouched("Get through a window") // and it wrote the object
		wantGrants("Get through a window", 1, 1)
		if mr := reg.mrs[0]; sniffed.RKey == mr.RKey() || sniffed.Addr != mr.Addr()+off || sniffed.Size != objSize {
			t.Fatalf("window token %+v: the registration's rkey %#x or the wrong range", sniffed, mr.RKey())
		}

		// Replayed after its request: the window was invalidated.
		ch := r.channel()
		if ch != ch0 {
			t.Fatalf("channel %d, want %d", ch, ch0)
		}
		wantAccessError(t, "window token replayed", r.stealOn(ctx, ch0, lreg, sniffed, false))
		r.chans <- ch0
		untouched("a replayed window token")

		// A live window (GetRDMATokenFor) works in range through its
		// connection alone, and not beyond its range.
		connect("reconnect", 1, 2)
		desc, err := r.cli.GetRDMATokenFor(buf, objSize, off, OpPut, pair.srv)
		if err != nil {
			t.Fatal(err)
		}
		wantGrants("GetRDMATokenFor", 2, 2)
		tok, _ := ParseToken(desc)
		if err := r.stealOn(ctx, ch0, lreg, tok, true); err != nil {
			t.Fatalf("READ through a live window: %v", err)
		}
		if !bytes.Equal(loot[:objSize], buf[off:off+objSize]) {
			t.Fatal("READ through a live window: data differs")
		}
		if tok.QPN == r.cli.Endpoint() {
			t.Fatalf("window token names the endpoint %#x, not its connection's QPN", tok.QPN)
		}
		clear(loot)
		// Through another QP: the token's qp field set to the client's
		// endpoint makes a fresh channel connect anew.
		other, err := r.srv.AllocateChannel()
		if err != nil {
			t.Fatal(err)
		}
		viaOther := tok
		viaOther.QPN = r.cli.Endpoint()
		wantAccessError(t, "window token through another QP", r.stealOn(ctx, other, lreg, viaOther, true))
		r.srv.FreeChannel(other)
		lootClean("a window token through another QP")
		wide := tok
		wide.Size = regSize - off
		wantAccessError(t, "widened window token", r.stealOn(ctx, ch0, lreg, wide, true))
		lootClean("a widened window token")
		if err := r.cli.PutRDMAToken(desc); err != nil {
			t.Fatal(err)
		}

		// A window given back (PutRDMAToken: LOCAL_INV) is dead on its own
		// connection.
		connect("reconnect again", 2, 3)
		desc, err = r.cli.GetRDMATokenFor(buf, objSize, off, OpGet, pair.srv)
		if err != nil {
			t.Fatal(err)
		}
		wantGrants("GetRDMATokenFor GET", 3, 3)
		tok, _ = ParseToken(desc)
		if err := r.cli.PutRDMAToken(desc); err != nil {
			t.Fatal(err)
		}
		copy(loot, bytes.Repeat([]byte{0xee}, regSize))
		wantAccessError(t, "window token given back", r.stealOn(ctx, ch0, lreg, tok, false))
		untouched("a window token given back")

		// A callback that hands its token to another server than the one the
		// window is bound through gets a region instead (AllowServer).
		connect("reconnect for AllowServer", 3, 4)
		var bound, given Token
		r.hook = func(h *Handle, info *RDMAInfo) error {
			bound = info.Token
			info.AllowServer(pair.stranger)
			given = info.Token
			return nil
		}
		r.object = pattern(objSize, 10)
		if n, err := r.cli.Get(ctx, "user", buf[off:off+objSize], 0, 0); err != nil || n != objSize {
			t.Fatalf("Get handed to another server = %d, %v", n, err)
		}
		r.hook = nil
		copy(private[off:], r.object)
		untouched("Get handed to another server")
		wantGrants("Get handed to another server", 4, 5)
		if given.RKey == bound.RKey || given.Addr != bound.Addr || given.Size != bound.Size {
			t.Errorf("AllowServer of another server: token %+v, was %+v; want a region over the same range", given, bound)
		}

		// Deregister invalidates the live windows over the registration.
		if _, err := r.cli.GetRDMATokenFor(buf, objSize, off, OpGet, pair.srv); err != nil {
			t.Fatal(err)
		}
		wantGrants("GetRDMATokenFor before Deregister", 5, 5)
		if err := r.cli.Deregister(buf); err != nil {
			t.Fatalf("Deregister with a live window: %v", err)
		}

		waitCount(t, "client AccessErrors", st.AccessErrors.Load, 4)
		if v := violations() - v0; v < 4 {
			t.Errorf("client device rkey_violation rose by %d, want at least 4", v)
		}
		if st.Grants.Load() != st.Revokes.Load() {
			t.Errorf("grants %d, revokes %d: a window outlived its token", st.Grants.Load(), st.Revokes.Load())
		}
	})
}

// writeTrap, once armed, drops the first RDMA WRITE its device receives,
// and every later packet to the same QP, and reports it on hit.
type writeTrap struct {
	link.Link
	armed atomic.Bool
	qpn   atomic.Uint32 // the trapped QP, once hit
	hit   chan struct{}
}

func (l *writeTrap) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	return l.Link.ReadBatch(ctx, func(frames [][]byte) {
		if !l.armed.Load() && l.qpn.Load() == 0 {
			fn(frames)
			return
		}
		var p ib.Packet
		kept := make([][]byte, 0, len(frames))
		for _, f := range frames {
			if ib.Parse(f, &p) == nil {
				if q := l.qpn.Load(); q != 0 && p.BTH.DestQP() == q {
					continue
				}
				if op := p.BTH.Opcode(); (op == ib.RCWriteOnly || op == ib.RCWriteFirst) && l.armed.CompareAndSwap(true, false) {
					l.qpn.Store(p.BTH.DestQP())
					close(l.hit)
					continue
				}
			}
			kept = append(kept, f)
		}
		fn(kept)
	})
}

// TestClientHangsUpMidRequest: a client that ends its connection while
// the server's RDMA WRITE on it is in flight does not hold the server's
// channel until the request's context ends. The server's QP would retry
// for ever at retry_cnt 7, as rxe's does; the waiting request sees the
// peer gone, resets the connection so that the WRITE flushes, and the
// client's retry gets the object over a new connection.
func TestClientHangsUpMidRequest(t *testing.T) {
	trap := &writeTrap{hit: make(chan struct{})}
	sdev, cdev := memDevicesWrapped(t, nil, func(l link.Link) link.Link { trap.Link = l; return trap })
	r := newRig(t, sdev, cdev, 4096, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	buf := make([]byte, 4096)
	if err := r.cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	r.object = pattern(4096, 3)
	if n, err := r.cli.Get(ctx, "user", buf, 0, 0); err != nil || n != 4096 {
		t.Fatalf("first Get = %d, %v", n, err)
	}
	trap.armed.Store(true)
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	clear(buf)
	go func() {
		n, err := r.cli.Get(ctx, "user", buf, 0, 0)
		done <- result{n, err}
	}()
	select {
	case <-trap.hit:
	case <-ctx.Done():
		t.Fatal("the server's WRITE never came")
	}
	// The WRITE is outstanding at the server: the client hangs up. The
	// server posts it once it has the REP, so it can arrive before the
	// client's Accept has returned and listed the connection: wait for it.
	var conns []*cm.Conn
	for len(conns) == 0 {
		r.cli.mu.Lock()
		for c := range r.cli.conns {
			conns = append(conns, c)
		}
		r.cli.mu.Unlock()
		if len(conns) > 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the client never listed the connection the WRITE came on")
		case <-time.After(time.Millisecond):
		}
	}
	for _, c := range conns {
		c.Close()
	}
	res := <-done
	if res.err != nil || res.n != 4096 || !bytes.Equal(buf, r.object) {
		t.Fatalf("Get whose connection the client ended mid-WRITE = %d, %v (server %+v)", res.n, res.err, r.srv.Stats())
	}
	if r.srv.Stats().Resets.Load() == 0 || r.cli.Stats().Retries.Load() == 0 {
		t.Errorf("server resets %d, client retries %d: want the WRITE flushed and retried",
			r.srv.Stats().Resets.Load(), r.cli.Stats().Retries.Load())
	}
}

// staleRead records the last RDMA READ request the client's device
// receives and, once armed, delivers a copy of it again ahead of the next
// frames: a duplicate the network kept back until after the PUT it belongs
// to was over.
type staleRead struct {
	link.Link
	mu       sync.Mutex
	last     []byte
	armed    atomic.Bool
	replayed atomic.Bool
}

func (l *staleRead) ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error) {
	return l.Link.ReadBatch(ctx, func(frames [][]byte) {
		var p ib.Packet
		for _, f := range frames {
			if ib.Parse(f, &p) == nil && p.BTH.Opcode() == ib.RCReadRequest {
				l.mu.Lock()
				l.last = bytes.Clone(f)
				l.mu.Unlock()
			}
		}
		if l.armed.CompareAndSwap(true, false) {
			l.mu.Lock()
			stale := l.last
			l.mu.Unlock()
			if stale != nil {
				l.replayed.Store(true)
				frames = append([][]byte{stale}, frames...)
			}
		}
		fn(frames)
	})
}

// TestStaleDuplicateReadFailsClientQP: a duplicate of a PUT's READ request
// that arrives after the client deregistered the buffer draws a remote
// access error NAK, and the client's QP fails, as rxe's does. The server
// takes the NAK for a PSN long completed and never learns: its next GET's
// WRITE would be resent for ever into a QP that drops everything. The
// client therefore ends a connection whose QP failed, and the GET goes
// through over a new one.
func TestStaleDuplicateReadFailsClientQP(t *testing.T) {
	trap := &staleRead{}
	sdev, cdev := memDevicesWrapped(t, nil, func(l link.Link) link.Link { trap.Link = l; return trap })
	r := newRig(t, sdev, cdev, 4096, nil, nil)
	ctx := ctxT(t, 60*time.Second)
	r.roundTrip(ctx, 4096, 7) // a GET and a PUT; the buffer is deregistered after
	trap.mu.Lock()
	recorded := trap.last != nil
	trap.mu.Unlock()
	if !recorded {
		t.Fatal("the PUT's READ request was not seen")
	}
	trap.armed.Store(true)
	start := time.Now()
	r.roundTrip(ctx, 4096, 9)
	if !trap.replayed.Load() {
		t.Fatal("the stale READ request was never delivered")
	}
	st := r.cli.Stats()
	if st.Failures.Load() != 1 {
		t.Errorf("client Failures = %d, want 1 (the connection whose QP failed)", st.Failures.Load())
	}
	if c := cdev.Counters(); c.RKeyViolation != 1 {
		t.Errorf("client device RKeyViolation = %d, want 1", c.RKeyViolation)
	}
	t.Logf("the GET after the stale READ took %v (client retries %d, server resets %d)",
		time.Since(start).Round(time.Millisecond), st.Retries.Load(), r.srv.Stats().Resets.Load())
}
