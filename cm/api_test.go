package cm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	devAddrA = netip.MustParseAddr("10.0.0.1")
	devAddrB = netip.MustParseAddr("10.0.0.2")
)

// devPair opens two devices joined by an in-memory link.
func devPair(t testing.TB, ab, ba faultnet.Config, capA *bytes.Buffer) (*roce.Device, *roce.Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: ab, BtoA: ba})
	oa := roce.Options{Addrs: []netip.Addr{devAddrA}, Neighbours: map[netip.Addr]net.HardwareAddr{devAddrB: lb.HardwareAddr()}}
	if capA != nil {
		oa.Capture = capA
	}
	da, err := roce.OpenLink(la, oa)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{devAddrB}, Neighbours: map[netip.Addr]net.HardwareAddr{devAddrA: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

func waitWC(t testing.TB, cq *roce.CQ) roce.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wc [1]roce.WorkCompletion
	for {
		if cq.Poll(wc[:]) == 1 {
			if wc[0].Status != roce.WCSuccess {
				t.Fatalf("completion %+v", wc[0])
			}
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func TestDialAcceptSendWrite(t *testing.T) {
	var capA bytes.Buffer
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, &capA)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(netip.IPv4Unspecified(), 7174), ListenOptions{PrivateData: []byte("srv")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		c   *Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx)
		acc <- res{c, err}
	}()
	cc, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{PrivateData: []byte("cli")})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	sc := r.c
	defer sc.Close()
	if !bytes.HasPrefix(cc.PrivateData(), []byte("srv")) || !bytes.HasPrefix(sc.PrivateData(), []byte("cli")) {
		t.Errorf("private data %q / %q", cc.PrivateData()[:3], sc.PrivateData()[:3])
	}
	if sc.RemoteAddr() != cc.LocalAddr() || cc.RemoteAddr().Addr() != devAddrB {
		t.Errorf("addresses: server sees %v, client is %v", sc.RemoteAddr(), cc.LocalAddr())
	}
	for _, c := range []*Conn{cc, sc} {
		if c.QP().State() != roce.StateRTS {
			t.Fatalf("QP state %v", c.QP().State())
		}
	}
	if a := cc.QP().Attr(); a.DestQPN != sc.QP().QPN() || a.Timeout != 19 || a.PathMTU != IBoEMTU(1500) {
		t.Errorf("client QP attr %+v", a)
	}

	// A SEND and an RDMA WRITE over the CM-made connection.
	sbuf, rbuf := make([]byte, 64), make([]byte, 64)
	copy(sbuf, "rdma-ping-0: ABCDEFGHIJ")
	smr, err := cc.PD().RegisterMR(sbuf, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rmr, err := sc.PD().RegisterMR(rbuf, roce.AccessLocalWrite|roce.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := sc.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{rmr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if err := cc.QP().PostSend(&roce.SendWR{ID: 2, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{smr.SGE(0, 23)}}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, cc.SendCQ())
	if wc := waitWC(t, sc.RecvCQ()); wc.ByteLen != 23 || !bytes.Equal(rbuf[:23], sbuf[:23]) {
		t.Fatalf("received %d bytes %q", wc.ByteLen, rbuf[:23])
	}
	copy(sbuf, "written")
	if err := cc.QP().PostSend(&roce.SendWR{ID: 3, Opcode: roce.WRRDMAWrite, Flags: roce.SendSignaled,
		SGL: []roce.SGE{smr.SGE(0, 7)}, RemoteAddr: rmr.Addr() + 32, RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, cc.SendCQ())
	if !bytes.Equal(rbuf[32:39], []byte("written")) {
		t.Fatalf("write landed as %q", rbuf[32:39])
	}

	// Graceful disconnect: the server sees it.
	if err := cc.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sc.Done():
	case <-ctx.Done():
		t.Fatal("server never saw the DREQ")
	}
	_ = smr.Close()
	_ = rmr.Close()

	// The capture holds the CM exchange as rxe would send it.
	if err := da.FlushCapture(); err != nil {
		t.Fatal(err)
	}
	checkCaptureCM(t, capA.Bytes())
}

func TestDialNoListener(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// B runs a CM (a listener on another port) but nothing on 7175.
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7175), DialOptions{})
	if !errors.Is(err, mad.RejInvalidServiceID) {
		t.Fatalf("dial without listener: %v", err)
	}
	// A listener nobody accepts on: the request waits in the backlog and
	// the dial ends with its context (cancelling the REQ with a REJ).
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if _, err = Dial(short, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial to a listener that never accepts: %v", err)
	}
}

func TestDialCancel(t *testing.T) {
	// B's device has no CM at all: the REQ is never answered.
	da, _ := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("dial: %v after %v", err, time.Since(start))
	}
}

func TestDialSIDR(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{PortSpace: mad.PortSpaceUDP})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan *Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		acc <- c
	}()
	cc, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{PortSpace: mad.PortSpaceUDP})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc := <-acc
	if sc == nil {
		t.FailNow()
	}
	defer sc.Close()
	if cc.RemoteQPN() != sc.QP().QPN() || cc.RemoteQKey() != mad.UDPQKey {
		t.Fatalf("SIDR gave QPN %d qkey %#x; server QP %d", cc.RemoteQPN(), cc.RemoteQKey(), sc.QP().QPN())
	}
	// A datagram from client to server.
	rbuf := make([]byte, roce.GRHSize+64)
	rmr, _ := sc.PD().RegisterMR(rbuf, roce.AccessLocalWrite)
	defer rmr.Close()
	_ = sc.QP().PostRecv(&roce.RecvWR{ID: 1, SGL: []roce.SGE{rmr.SGE(0, len(rbuf))}})
	if err := cc.QP().PostSend(&roce.SendWR{Opcode: roce.WRSend, Flags: roce.SendInline | roce.SendSignaled,
		Inline: []byte("datagram"), AH: cc.AH(), RemoteQPN: cc.RemoteQPN(), RemoteQKey: cc.RemoteQKey()}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, cc.SendCQ())
	waitWC(t, sc.RecvCQ())
	if !bytes.Equal(rbuf[roce.GRHSize:roce.GRHSize+8], []byte("datagram")) {
		t.Fatalf("got %q", rbuf[roce.GRHSize:roce.GRHSize+8])
	}
}

// TestDialLossy connects through a network that loses and duplicates CM
// MADs: the retransmission timers must still bring the connections up.
func TestDialLossy(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for CM retransmission timers")
	}
	da, db := devPair(t, faultnet.Config{Seed: 3, Loss: 0.3, Duplicate: 0.2}, faultnet.Config{Seed: 4, Loss: 0.3, Duplicate: 0.2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Done(); c.Close() }()
		}
	}()
	for i := 0; i < 3; i++ {
		c, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{PacketLifeTime: 10})
		if err != nil {
			registry.Lock()
			for d, a := range registry.m {
				a.mu.Lock()
				t.Logf("%v: %+v ids %d %+v", d.Info().Name, a.eng.Stats(), len(a.eng.conns), d.Counters())
				for _, c := range a.eng.conns {
					t.Logf("  %#x %v active=%v", c.id, c.state, c.active)
				}
				a.mu.Unlock()
			}
			registry.Unlock()
			t.Fatal(i, err)
		}
		c.Close()
	}
}

func checkCaptureCM(t *testing.T, pcap []byte) {
	t.Helper()
	// Classic pcap: 24-byte header, then 16-byte record headers.
	if len(pcap) < 24 {
		t.Fatal("empty capture")
	}
	seen := map[mad.AttrID]bool{}
	for off := 24; off+16 <= len(pcap); {
		n := int(uint32(pcap[off+8]) | uint32(pcap[off+9])<<8 | uint32(pcap[off+10])<<16 | uint32(pcap[off+11])<<24)
		frame := pcap[off+16 : off+16+n]
		off += 16 + n
		if n != 322 {
			continue
		}
		// Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + DETH 8 = 62.
		sport := uint16(frame[34])<<8 | uint16(frame[35])
		if frame[42] != 0x64 || frame[54] != 0x80 || frame[61] != 1 || sport != 0xD872 {
			continue
		}
		m, err := mad.ParseCM(frame[62:])
		if err != nil {
			t.Errorf("CM frame: %v", err)
			continue
		}
		seen[m.AttrID()] = true
	}
	for _, a := range []mad.AttrID{mad.AttrREQ, mad.AttrREP, mad.AttrRTU, mad.AttrDREQ, mad.AttrDREP} {
		if !seen[a] {
			t.Errorf("capture has no %v (saw %v)", a, seen)
		}
	}
}

// TestDialIPv6AndBoundListener connects over IPv6 (cma_hdr version 6,
// GIDs = the addresses) and checks that a listener bound to one address
// refuses requests for another address of the same device, as rdma_cm's
// listener lookup does (REJ CONSUMER_DEFINED).
func TestDialIPv6AndBoundListener(t *testing.T) {
	a6, b6, b6other := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::3")
	la, lb := memlink.PairWithOptions(memlink.Options{})
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a6},
		Neighbours: map[netip.Addr]net.HardwareAddr{b6: lb.HardwareAddr(), b6other: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{b6, b6other}, Neighbours: map[netip.Addr]net.HardwareAddr{a6: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(b6other, 7174), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	if _, err := Dial(ctx, da, netip.AddrPortFrom(b6, 7174), DialOptions{}); !errors.Is(err, mad.RejConsumerDefined) {
		t.Fatalf("dial to an address the listener is not bound to: %v", err)
	}
	c, err := Dial(ctx, da, netip.AddrPortFrom(b6other, 7174), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.LocalAddr().Addr() != a6 || c.QP().Attr().AV.DGID.Addr() != b6other {
		t.Errorf("local %v, AV %+v", c.LocalAddr(), c.QP().Attr().AV)
	}
}

// TestAgentStops checks that the CM gives QP1 back once its last user is
// gone and pending disconnections have finished, and that a new user gets
// a fresh agent.
func TestAgentStops(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(ctx)
		acc <- c
	}()
	c, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	c.Close()
	<-sc.Done()
	sc.Close()
	l.Close()
	for _, d := range []*roce.Device{da, db} {
		deadline := time.Now().Add(agentLinger + 3*time.Second)
		for {
			registry.Lock()
			_, running := registry.m[d]
			registry.Unlock()
			if !running {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent of %s still running", d.Info().Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// QP1 is free again: a new listener takes it.
	l2, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l2.Close()
}

// TestConcurrentDials runs many dials at once against one listener whose
// accepted connections close themselves, then checks that every engine
// table drains.
func TestConcurrentDials(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{Backlog: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() { <-c.Done(); c.Close() }()
		}
	}()
	const n = 24
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			c, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{})
			if err == nil {
				err = c.Disconnect(ctx)
				c.Close()
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Errorf("dial %d: %v", i, err)
		}
	}
	for _, d := range []*roce.Device{da, db} {
		registry.Lock()
		a := registry.m[d]
		registry.Unlock()
		if a == nil {
			continue
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			a.mu.Lock()
			ids, _ := a.eng.Len()
			a.mu.Unlock()
			if ids == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d IDs left", d.Info().Name, ids)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestPrepareErrors: a failing Prepare aborts a dial before any MAD, and on
// the passive side turns into a REJ the active side sees.
func TestPrepareErrors(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	boom := errors.New("boom")
	if _, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{QP: QPOptions{Prepare: func(*Conn) error { return boom }}}); !errors.Is(err, boom) {
		t.Fatalf("dial: %v", err)
	}
	l, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7174), ListenOptions{QP: QPOptions{Prepare: func(*Conn) error { return boom }}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() {
		actx, acancel := context.WithTimeout(ctx, 2*time.Second)
		defer acancel()
		_, err := l.Accept(actx)
		acc <- err
	}()
	if _, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7174), DialOptions{}); !errors.Is(err, mad.RejConsumerDefined) {
		t.Fatalf("dial to a listener whose Prepare fails: %v", err)
	}
	if err := <-acc; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("accept: %v", err)
	}
}
