package cm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// A QP that fails on its own (its peer stops answering and the retries run
// out) is the connection's error: Err returns the QP's error, as an rdma_cm
// user learns it from IBV_EVENT_QP_FATAL.
func TestConnErrQPFatal(t *testing.T) {
	da, db := devPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := Listen(ctx, db, netip.AddrPortFrom(netip.IPv4Unspecified(), 7175), ListenOptions{})
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
	// Packet life time 8 makes the QP's local ACK timeout 9 (about 2 ms).
	cc, err := Dial(ctx, da, netip.AddrPortFrom(devAddrB, 7175), DialOptions{PacketLifeTime: 8, RetryCount: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc := <-acc
	if sc == nil {
		t.FailNow()
	}
	defer sc.Close()
	if err := cc.Err(); err != nil {
		t.Fatalf("healthy connection reports %v", err)
	}

	// The server's QP goes to the error state without a DREQ: it drops
	// what the client sends from now on.
	if err := sc.QP().Modify(ctx, &roce.QPAttr{State: roce.StateErr}, roce.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := sc.Err(); err != nil {
		t.Errorf("a QP moved to ERR by its owner is not a failure, got %v", err)
	}
	buf := make([]byte, 8)
	mr, err := cc.PD().RegisterMR(buf, roce.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	if err := cc.QP().PostSend(&roce.SendWR{ID: 1, Opcode: roce.WRSend, Flags: roce.SendSignaled, SGL: []roce.SGE{mr.SGE(0, 8)}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cc.QP().Failed():
	case <-ctx.Done():
		t.Fatal("the QP did not fail")
	}
	err = cc.Err()
	var qe *roce.QPError
	if !errors.Is(err, roce.ErrQPFailed) || !errors.As(err, &qe) || qe.Status != roce.WCRetryExcErr {
		t.Fatalf("Err() = %v, want a QP error with RETRY_EXC_ERR", err)
	}
}
