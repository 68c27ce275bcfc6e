package cm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// TestRequestAcceptReject drives a listener through Request: each request
// is inspected and accepted with its own QP access and private data, or
// rejected with private data, as rdma_get_request + rdma_accept/rdma_reject.
func TestRequestAcceptReject(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	laddr := netip.AddrPortFrom(devAddrB, 7210)
	l, err := Listen(ctx, db, laddr, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type answer struct {
		r   *Request
		c   *Conn
		err error
	}
	answers := make(chan answer, 4)
	go func() {
		for {
			r, err := l.Request(ctx)
			if err != nil {
				return
			}
			go func() {
				if bytes.HasPrefix(r.PrivateData(), []byte("reject")) {
					answers <- answer{r, nil, r.Reject(0, []byte("go away"))}
					return
				}
				if bytes.HasPrefix(r.PrivateData(), []byte("ignore")) {
					answers <- answer{r, nil, nil}
					return
				}
				c, err := r.Accept(ctx, AcceptOptions{PrivateData: []byte("per-connection " + r.RemoteAddr().String()),
					QP: QPOptions{Access: roce.AccessRemoteWrite}})
				answers <- answer{r, c, err}
			}()
		}
	}()

	// Rejected with private data.
	_, err = Dial(ctx, da, laddr, DialOptions{PrivateData: []byte("reject me")})
	var rej *mad.RejectError
	if !errors.As(err, &rej) || rej.Reason != mad.RejConsumerDefined || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) {
		t.Fatalf("rejected dial: %v", err)
	}
	a := <-answers
	if a.err != nil {
		t.Fatal(a.err)
	}
	if err := a.r.Reject(0, nil); !errors.Is(err, ErrState) || err != errAnswered {
		t.Errorf("second answer: %v", err)
	}

	// Accepted with per-connection private data and QP access.
	cc, err := Dial(ctx, da, laddr, DialOptions{PrivateData: []byte("hello"), ResponderResources: 4, InitiatorDepth: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	a = <-answers
	if a.err != nil {
		t.Fatal(a.err)
	}
	sc, r := a.c, a.r
	defer sc.Close()
	if r.RemoteAddr() != cc.LocalAddr() || r.LocalAddr() != laddr || !bytes.HasPrefix(r.PrivateData(), []byte("hello")) ||
		r.ResponderResources() != 4 || r.InitiatorDepth() != 2 || r.PathMTU() != IBoEMTU(1500) || r.SIDR() {
		t.Errorf("request from %v to %v: %q, resources %d depth %d MTU %v", r.RemoteAddr(), r.LocalAddr(),
			r.PrivateData()[:5], r.ResponderResources(), r.InitiatorDepth(), r.PathMTU())
	}
	if want := "per-connection " + cc.LocalAddr().String(); !bytes.HasPrefix(cc.PrivateData(), []byte(want)) {
		t.Errorf("REP private data %q, want %q", cc.PrivateData()[:len(want)], want)
	}
	if got := sc.QP().Attr().AccessFlags; got != roce.AccessRemoteWrite {
		t.Errorf("accepted QP access %v, want the option's REMOTE_WRITE", got)
	}
	// The dialer's responder resources are the REP's initiator depth
	// (min(16, 4)): rdma_cm then grants reads and atomics too.
	if got, want := cc.QP().Attr().AccessFlags, roce.AccessRemoteWrite|roce.AccessRemoteRead|roce.AccessRemoteAtomic; got != want {
		t.Errorf("dialed QP access %v, want %v", got, want)
	}
	if err := r.Reject(0, nil); !errors.Is(err, ErrState) || err != errAnswered {
		t.Errorf("reject after accept: %v", err)
	}
	if err := a.r.Reject(0, make([]byte, mad.REJPrivateDataSize+1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("oversized reject data: %v", err)
	}

	// Err: nil while healthy, then why it ended.
	if cc.Err() != nil || sc.Err() != nil {
		t.Errorf("healthy connection errors %v / %v", cc.Err(), sc.Err())
	}
	if err := cc.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	<-sc.Done()
	if !errors.Is(sc.Err(), ErrDisconnected) || !errors.Is(cc.Err(), ErrDisconnected) || sc.Err() == cc.Err() {
		t.Errorf("after a disconnect: server %v, client %v", sc.Err(), cc.Err())
	}
	cc.Close()
	if !errors.Is(cc.Err(), ErrDisconnected) {
		t.Errorf("Close replaced the first cause: %v", cc.Err())
	}

	// A request taken and not answered is rejected when the listener
	// closes.
	go func() {
		<-answers
		l.Close()
	}()
	if _, err := Dial(ctx, da, laddr, DialOptions{PrivateData: []byte("ignore")}); !errors.Is(err, mad.RejConsumerDefined) {
		t.Errorf("dial to a closing listener: %v", err)
	}
}

// TestRequestSIDR answers SIDR requests through Request.
func TestRequestSIDR(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	laddr := netip.AddrPortFrom(devAddrB, 7211)
	l, err := Listen(ctx, db, laddr, ListenOptions{PortSpace: mad.PortSpaceUDP})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conns := make(chan *Conn, 1)
	go func() {
		for {
			r, err := l.Request(ctx)
			if err != nil {
				return
			}
			if !r.SIDR() || r.REQ() != nil {
				t.Error("SIDR request not marked as one")
			}
			if bytes.HasPrefix(r.PrivateData(), []byte("no")) {
				_ = r.Reject(0, []byte("refused"))
				continue
			}
			c, err := r.Accept(ctx, AcceptOptions{PrivateData: []byte("qp here")})
			if err != nil {
				t.Error(err)
			}
			conns <- c
		}
	}()
	if _, err := Dial(ctx, da, laddr, DialOptions{PortSpace: mad.PortSpaceUDP, PrivateData: []byte("no")}); !errors.Is(err, mad.ErrRejected) || !errors.Is(err, mad.SIDRReject) {
		t.Errorf("rejected SIDR: %v", err)
	}
	cc, err := Dial(ctx, da, laddr, DialOptions{PortSpace: mad.PortSpaceUDP, PrivateData: []byte("yes")})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc := <-conns
	defer sc.Close()
	if cc.RemoteQPN() != sc.QP().QPN() || !bytes.HasPrefix(cc.PrivateData(), []byte("qp here")) {
		t.Errorf("SIDR reply QPN %d (server %d), data %q", cc.RemoteQPN(), sc.QP().QPN(), cc.PrivateData()[:7])
	}
}

// TestManager: a Manager owns QP1 until it is closed; the package-level
// functions cannot take it meanwhile.
func TestManager(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res0 := db.Resources()
	m, err := NewManager(db, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Device() != db {
		t.Error("Device")
	}
	if _, err := NewManager(db, ManagerOptions{}); err == nil {
		t.Fatal("a second Manager took QP1")
	}
	if _, err := Listen(ctx, db, netip.AddrPortFrom(devAddrB, 7212), ListenOptions{}); err == nil {
		t.Fatal("the package-level Listen took QP1 from a Manager")
	}
	laddr := netip.AddrPortFrom(devAddrB, 7212)
	l, err := m.Listen(ctx, laddr, ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	accepted := acceptLoop(ctx, l)
	mc, err := NewManager(da, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := mc.Dial(ctx, laddr, DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc := <-accepted
	// Close closes the listener; the connection lives on until closed.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := <-accepted; ok {
		t.Error("Accept still running after the Manager closed")
	}
	if _, err := m.Listen(ctx, laddr, ListenOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Listen on a closed Manager: %v", err)
	}
	if sc.QP().State() != roce.StateRTS || sc.Err() != nil {
		t.Errorf("connection after Manager.Close: %v, %v", sc.QP().State(), sc.Err())
	}
	cc.Close()
	<-sc.Done()
	sc.Close()
	if err := mc.Close(); err != nil {
		t.Fatal(err)
	}
	// Both CMs are gone once their timewaits ended: QP1 is free again.
	if !pollUntil(agentLinger+5*time.Second, func() bool { return db.Resources() == res0 }) {
		t.Fatalf("resources after the Manager closed: %+v, want %+v", db.Resources(), res0)
	}
	m2, err := NewManager(db, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m2.Close()
}
