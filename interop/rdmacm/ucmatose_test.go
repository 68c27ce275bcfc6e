package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/roce"
)

// ucmatose (librdmacm's cmatose) defaults.
const (
	ucmatosePort  = 7471
	ucmatoseCount = 10
	ucmatoseSize  = 100
)

// toseCase is one ucmatose run: -c connections, -C count, -S size, -p port.
type toseCase struct {
	name               string
	conns, count, size int
	port               uint16
}

// args are the ucmatose flags that differ from its defaults, so the
// default case runs the bare command.
func (c toseCase) args() []string {
	var a []string
	if c.conns != 1 {
		a = append(a, "-c", strconv.Itoa(c.conns))
	}
	if c.count != ucmatoseCount {
		a = append(a, "-C", strconv.Itoa(c.count))
	}
	if c.size != ucmatoseSize {
		a = append(a, "-S", strconv.Itoa(c.size))
	}
	if c.port != ucmatosePort {
		a = append(a, "-p", strconv.Itoa(int(c.port)))
	}
	return a
}

var toseCases = []toseCase{
	{"default", 1, ucmatoseCount, ucmatoseSize, ucmatosePort},
	{"c2", 2, ucmatoseCount, ucmatoseSize, ucmatosePort},
	// Messages of several packets at the lab's path MTU of 1024, on
	// another port.
	{"S3000p7475", 1, 5, 3000, 7475},
}

// toseNode is our side of one ucmatose connection: count receive slots
// and one send slot of size bytes, posted like cmatose's post_recvs
// before the connection is up.
type toseNode struct {
	conn         *cm.Conn
	buf          []byte
	mr           *roce.MR
	count, size  int
	sends, recvs int
	wc           [8]roce.WorkCompletion
}

func (n *toseNode) prepare(c *cm.Conn) error {
	n.conn = c
	n.buf = make([]byte, (n.count+1)*n.size)
	for i := range n.buf {
		n.buf[i] = byte(i)
	}
	var err error
	if n.mr, err = c.PD().RegisterMR(n.buf, roce.AccessLocalWrite); err != nil {
		return err
	}
	for i := 0; i < n.count; i++ {
		if err := c.QP().PostRecv(&roce.RecvWR{ID: uint64(i), SGL: []roce.SGE{n.mr.SGE((i+1)*n.size, n.size)}}); err != nil {
			return err
		}
	}
	return nil
}

func (n *toseNode) close() {
	if n.mr != nil {
		_ = n.mr.Close()
		n.mr = nil
	}
}

func (n *toseNode) qpOptions() cm.QPOptions {
	return cm.QPOptions{Cap: roce.QPCap{MaxSendWR: n.count, MaxRecvWR: n.count, MaxSendSGE: 1, MaxRecvSGE: 1},
		Prepare: n.prepare}
}

func (n *toseNode) postSends() error {
	for i := 0; i < n.count; i++ {
		if err := n.conn.QP().PostSend(&roce.SendWR{ID: uint64(i), Opcode: roce.WRSend, Flags: roce.SendSignaled,
			SGL: []roce.SGE{n.mr.SGE(0, n.size)}}); err != nil {
			return err
		}
	}
	return nil
}

// await polls both CQs until sends and recvs completions have been seen;
// every completion must succeed and every receive carry size bytes.
func (n *toseNode) await(ctx context.Context, sends, recvs int) error {
	scq, rcq := n.conn.SendCQ(), n.conn.RecvCQ()
	for n.sends < sends || n.recvs < recvs {
		for _, cq := range []*roce.CQ{scq, rcq} {
			k := cq.Poll(n.wc[:])
			for _, wc := range n.wc[:k] {
				if wc.Status != roce.WCSuccess {
					return fmt.Errorf("completion %+v (after %d sends, %d receives)", wc, n.sends, n.recvs)
				}
				switch wc.Opcode {
				case roce.WCSend:
					n.sends++
				case roce.WCRecv:
					if int(wc.ByteLen) != n.size {
						return fmt.Errorf("received %d bytes, want %d", wc.ByteLen, n.size)
					}
					n.recvs++
				default:
					return fmt.Errorf("unexpected completion %+v", wc)
				}
			}
		}
		if n.sends >= sends && n.recvs >= recvs {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d/%d sends, %d/%d receives: %w", n.sends, sends, n.recvs, recvs, ctx.Err())
		case <-scq.Ready():
		case <-rcq.Ready():
		}
	}
	if n.sends != sends || n.recvs != recvs {
		return fmt.Errorf("%d sends, %d receives completed, want %d and %d", n.sends, n.recvs, sends, recvs)
	}
	return nil
}

// TestUcmatoseServer: our listener, the guest's ucmatose -s client. As
// cmatose's server does, we send count messages on every connection,
// complete them and the client's count replies, then disconnect (the
// client waits for our DREQ).
func TestUcmatoseServer(t *testing.T) {
	for _, c := range toseCases {
		t.Run(c.name, func(t *testing.T) { ucmatoseServer(t, c) })
	}
}

func ucmatoseServer(t *testing.T, c toseCase) {
	lab, g, dev := rxeSetup(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var nodes []*toseNode
	qpo := cm.QPOptions{Cap: roce.QPCap{MaxSendWR: c.count, MaxRecvWR: c.count, MaxSendSGE: 1, MaxRecvSGE: 1},
		Prepare: func(conn *cm.Conn) error {
			n := &toseNode{count: c.count, size: c.size}
			mu.Lock()
			nodes = append(nodes, n)
			mu.Unlock()
			return n.prepare(conn)
		}}
	defer func() {
		for _, n := range nodes {
			n.close()
		}
	}()
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(lab.PeerAddr, c.port), cm.ListenOptions{QP: qpo})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	job := g.Start(ctx, append([]string{"ucmatose", "-s", lab.PeerAddr.String()}, c.args()...)...)
	// Everything below waits on runCtx, which ends if ucmatose exits early.
	runCtx, runCancel := context.WithCancel(ctx)
	defer runCancel()
	go func() {
		select {
		case <-job.Done():
			runCancel()
		case <-runCtx.Done():
		}
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		runCancel()
		stdout, stderr, code, err := job.Wait()
		t.Fatalf("%s\nucmatose -s: exit %d (%v)\n%s%s\ncounters %+v", fmt.Sprintf(format, args...), code, err, stdout, stderr, dev.Counters())
	}

	var conns []*cm.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	for i := 0; i < c.conns; i++ {
		conn, err := l.Accept(runCtx)
		if err != nil {
			fail("accept %d: %v", i, err)
		}
		conns = append(conns, conn)
	}
	l.Close()
	byConn := func(conn *cm.Conn) *toseNode {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range nodes {
			if n.conn == conn {
				return n
			}
		}
		return nil
	}
	for i, conn := range conns {
		n := byConn(conn)
		if n == nil {
			fail("connection %d: Prepare never saw it", i)
		}
		if err := n.postSends(); err != nil {
			fail("connection %d: post sends: %v", i, err)
		}
	}
	for i, conn := range conns {
		if err := byConn(conn).await(runCtx, c.count, c.count); err != nil {
			fail("connection %d: %v", i, err)
		}
	}
	exchanged := time.Since(start)
	for i, conn := range conns {
		dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := conn.Disconnect(dctx)
		dcancel()
		if err != nil {
			fail("connection %d: disconnect: %v", i, err)
		}
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 {
		t.Fatalf("ucmatose -s: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	for i, conn := range conns {
		if n := byConn(conn); n.sends != c.count || n.recvs != c.count {
			t.Errorf("connection %d: %d sends, %d receives, want %d each", i, n.sends, n.recvs, c.count)
		}
	}
	t.Logf("%d connection(s) x %d messages of %d bytes each way: exchanged in %v, done in %v\nucmatose -s:\n%s%s",
		c.conns, c.count, c.size, exchanged.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), stdout, stderr)
}

// TestUcmatoseClient: the guest's ucmatose server, our connections. As
// cmatose's client does, we receive count messages on every connection,
// then send count replies, then wait for the server's DREQ.
func TestUcmatoseClient(t *testing.T) {
	for _, c := range toseCases {
		t.Run(c.name, func(t *testing.T) { ucmatoseClient(t, c) })
	}
}

func ucmatoseClient(t *testing.T, c toseCase) {
	_, g, dev := rxeSetup(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	job := g.Start(ctx, append([]string{"ucmatose", "-b", g.Addr.String()}, c.args()...)...)
	runCtx, runCancel := context.WithCancel(ctx)
	defer runCancel()
	go func() {
		select {
		case <-job.Done():
			runCancel()
		case <-runCtx.Done():
		}
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		runCancel()
		stdout, stderr, code, err := job.Wait()
		t.Fatalf("%s\nucmatose: exit %d (%v)\n%s%s\ncounters %+v", fmt.Sprintf(format, args...), code, err, stdout, stderr, dev.Counters())
	}

	nodes := make([]*toseNode, c.conns)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				if n.conn != nil {
					n.conn.Close()
				}
				n.close()
			}
		}
	}()
	for i := range nodes {
		n := &toseNode{count: c.count, size: c.size}
		nodes[i] = n
		for {
			// cmatose's conn_param: one RDMA read each way, retry_count 5.
			conn, err := cm.Dial(runCtx, dev, netip.AddrPortFrom(g.Addr, c.port), cm.DialOptions{QP: n.qpOptions(),
				ResponderResources: 1, InitiatorDepth: 1, RetryCount: 5})
			if err == nil {
				n.conn = conn
				break
			}
			n.close()
			n.conn = nil
			// Until ucmatose listens, rxe's CM answers REJ INVALID_SERVICE_ID.
			if !errors.Is(err, mad.RejInvalidServiceID) {
				fail("dial %d: %v", i, err)
			}
			select {
			case <-runCtx.Done():
				fail("dial %d: %v", i, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	for i, n := range nodes {
		if err := n.await(runCtx, 0, c.count); err != nil {
			fail("connection %d: receiving: %v", i, err)
		}
		if err := n.postSends(); err != nil {
			fail("connection %d: post sends: %v", i, err)
		}
		if err := n.await(runCtx, c.count, c.count); err != nil {
			fail("connection %d: sending: %v", i, err)
		}
	}
	exchanged := time.Since(start)
	for i, n := range nodes {
		select {
		case <-n.conn.Done():
		case <-ctx.Done():
			fail("connection %d: no DREQ from ucmatose: %v", i, ctx.Err())
		}
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 {
		t.Fatalf("ucmatose: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	for i, n := range nodes {
		if n.sends != c.count || n.recvs != c.count {
			t.Errorf("connection %d: %d sends, %d receives, want %d each", i, n.sends, n.recvs, c.count)
		}
	}
	t.Logf("%d connection(s) x %d messages of %d bytes each way: exchanged in %v, done in %v\nucmatose:\n%s%s",
		c.conns, c.count, c.size, exchanged.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), stdout, stderr)
}
