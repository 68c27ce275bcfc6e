package roce

import (
	"context"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// The ACK of a message whose completion the receiver has seen leaves even
// when the receiver closes its QP at once. The receive path posts the
// completion under the device lock and transmits after it; here another
// transmit pass holds the transmit slots at that moment (its shard's lock), so the ACK
// is still queued when Close runs. Without the ACK the sender resends into
// a QP that no longer exists until its retry count runs out.
func TestCloseSendsQueuedAck(t *testing.T) {
	queuedAckLeaves(t, func(q *QP) error { return q.Close() })
}

// The same for a move to ERR, as rdma_cm's disconnect makes it after the
// last message of a perftest write-lat run.
func TestModifyToErrSendsQueuedAck(t *testing.T) {
	queuedAckLeaves(t, func(q *QP) error {
		return q.Modify(context.Background(), &QPAttr{State: StateErr}, AttrState)
	})
}

func queuedAckLeaves(t *testing.T, end func(*QP) error) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a, b := newEndpoint(t, da, RC, 4096), newEndpoint(t, db, RC, 4096)
	// No retry, after about 4 s: a lost ACK ends in an error, and the
	// sender does not give up while the test holds the ACK back.
	connect(t, a, b, addrA, addrB, ConnectAttr{Timeout: 20, RetryCnt: 0, NoDefaults: true, RNRRetry: 7, MinRNRTimer: 1})
	if err := b.qp.PostRecv(&RecvWR{ID: 7, SGL: []SGE{b.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	// The pass of b's QP's shard: the one the ACK would leave from.
	tx := &db.shardOf(b.qp.QPN()).mu
	tx.Lock()
	locked := true
	defer func() {
		if locked {
			tx.Unlock()
		}
	}()
	if err := a.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{a.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	wantOK(t, waitWC(t, b.rcq, 5*time.Second), WCRecv)
	closed := make(chan error, 1)
	go func() { closed <- end(b.qp) }()
	// Close may wait for the transmit pass to end; give it the chance
	// to run first if it does not.
	select {
	case err := <-closed:
		closed <- err
	case <-time.After(100 * time.Millisecond):
	}
	tx.Unlock()
	locked = false
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.scq, 5*time.Second)
	if wc.Status != WCSuccess {
		t.Fatalf("the sender's completion: %v, want success (the receiver's ACK was lost with its QP)", wc.Status)
	}
}
