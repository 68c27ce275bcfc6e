package rdmacm

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// udaddyPort is the rdma_cm port udaddy always uses (it has no option to
// change it; its -p selects the port space).
const udaddyPort = 7174

// TestRxeSIDRServer runs librdmacm's udaddy as the SIDR client in the
// guest against a cm.Listen in the UDP port space, and plays udaddy's
// server part over the resolved UD QPs: every connection receives the
// client's -C datagrams of -S bytes, each carrying the sender's QPN as
// immediate data, and answers with as many datagrams addressed from the
// GRH and the immediate data, with the Q_Key of our own QP. udaddy's
// client waits for -C receive completions per connection, so it only exits
// 0 when every reply reached the right QP with the right Q_Key.
func TestRxeSIDRServer(t *testing.T) {
	lab, g, _ := rxeSetup(t)
	t.Run("IPv4", func(t *testing.T) {
		runSIDRServer(t, udaddyRun{local: lab.PeerAddr, remote: g.Addr, conns: 3, count: 4, size: 100})
	})
	t.Run("IPv6", func(t *testing.T) {
		if !lab.PeerAddr6.IsValid() || !g.Addr6.IsValid() {
			t.Skip("lab without IPv6")
		}
		// The largest message udaddy allows: the port's active MTU.
		runSIDRServer(t, udaddyRun{local: lab.PeerAddr6, remote: g.Addr6, conns: 2, count: 3, size: g.ActiveMTU})
	})
	// The check is only as good as udaddy's wait: replies with a wrong
	// Q_Key are dropped by rxe, and udaddy must still be waiting for them.
	t.Run("WrongQKey", func(t *testing.T) {
		runSIDRServer(t, udaddyRun{local: lab.PeerAddr, remote: g.Addr, conns: 1, count: 2, size: 100, qkey: mad.UDPQKey ^ 1})
	})
}

type udaddyRun struct {
	local, remote netip.Addr
	conns, count  int
	size          int
	// qkey, if set, is a wrong Q_Key for the replies: udaddy must not
	// complete.
	qkey uint32
}

// udaddyConn is one resolved SIDR connection and what arrived on it.
type udaddyConn struct {
	conn   *cm.Conn
	slab   *roce.RecvSlab
	srcQPN uint32 // udaddy's QPN: the immediate data and the DETH source
	grhSrc netip.Addr
	grhDst netip.Addr
}

func runSIDRServer(t *testing.T, r udaddyRun) {
	_, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var mu sync.Mutex
	slabs := map[*cm.Conn]*roce.RecvSlab{}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range slabs {
			s.Close()
		}
	}()
	// Receives go up before the SIDR_REP: udaddy sends as soon as it has
	// resolved every connection.
	opts := cm.ListenOptions{PortSpace: mad.PortSpaceUDP, QP: cm.QPOptions{Prepare: func(c *cm.Conn) error {
		s, err := c.PD().NewRecvSlab(c.QP(), r.count, r.size)
		if err != nil {
			return err
		}
		mu.Lock()
		slabs[c] = s
		mu.Unlock()
		return nil
	}}}
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(r.local, udaddyPort), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	jobCtx, cancelJob := context.WithCancel(ctx)
	args := []string{"udaddy", "-s", r.local.String(), "-b", r.remote.String(),
		"-c", strconv.Itoa(r.conns), "-C", strconv.Itoa(r.count), "-S", strconv.Itoa(r.size)}
	job := g.Start(jobCtx, args...)
	defer func() {
		cancelJob()
		job.Wait()
	}()
	// Until udaddy has sent everything, its end is a failure: stop waiting.
	live, stopLive := context.WithCancel(ctx)
	defer stopLive()
	go func() {
		select {
		case <-job.Done():
			stopLive()
		case <-live.Done():
		}
	}()
	fatal := func(format string, a ...any) {
		t.Helper()
		stopLive()
		cancelJob()
		stdout, stderr, code, _ := job.Wait()
		t.Fatalf("%s\n%s: exit %d\n%s%s\ncounters %+v", fmt.Sprintf(format, a...), strings.Join(args, " "), code, stdout, stderr, dev.Counters())
	}

	conns := make([]*udaddyConn, 0, r.conns)
	for len(conns) < r.conns {
		c, err := l.Accept(live)
		if err != nil {
			fatal("accept %d of %d: %v", len(conns)+1, r.conns, err)
		}
		defer c.Close()
		mu.Lock()
		s := slabs[c]
		mu.Unlock()
		if s == nil {
			fatal("connection %d has no receive slab", len(conns))
		}
		if c.RemoteAddr().Addr() != r.remote || c.LocalAddr() != netip.AddrPortFrom(r.local, udaddyPort) || c.AH() == nil {
			fatal("connection %d: local %v remote %v AH %v", len(conns), c.LocalAddr(), c.RemoteAddr(), c.AH())
		}
		conns = append(conns, &udaddyConn{conn: c, slab: s})
	}

	// udaddy's client: -C sends of -S bytes per connection, immediate data
	// = its QPN, one UD QP per connection.
	seen := map[uint32]int{}
	for i, u := range conns {
		err := pollN(live, u.conn.RecvCQ(), r.count, func(wc *roce.WorkCompletion) error {
			if wc.Status != roce.WCSuccess || wc.Opcode != roce.WCRecv || !u.slab.Owns(wc) {
				return fmt.Errorf("receive completion %+v", *wc)
			}
			if wc.Flags&roce.WCWithImm == 0 || wc.Flags&roce.WCWithGRH == 0 || wc.Imm != wc.SrcQP {
				return fmt.Errorf("completion %+v: want a GRH and immediate data equal to the source QPN", *wc)
			}
			if int(wc.ByteLen) != roce.GRHSize+r.size || len(u.slab.Bytes(wc)) != r.size {
				return fmt.Errorf("received %d bytes, want the GRH area and %d", wc.ByteLen, r.size)
			}
			src, dst := grhAddrs(u.slab.GRH(wc), r.remote.Is4())
			if src != r.remote || dst != r.local {
				return fmt.Errorf("GRH from %v to %v, want %v to %v", src, dst, r.remote, r.local)
			}
			if u.srcQPN == 0 {
				u.srcQPN, u.grhSrc, u.grhDst = wc.SrcQP, src, dst
			} else if wc.SrcQP != u.srcQPN {
				return fmt.Errorf("datagram from QP %#x, earlier ones from %#x", wc.SrcQP, u.srcQPN)
			}
			return nil
		})
		if err != nil {
			fatal("connection %d (our QP %#x): %v", i, u.conn.QP().QPN(), err)
		}
		if j, dup := seen[u.srcQPN]; dup {
			fatal("connections %d and %d both got udaddy's QP %#x", j, i, u.srcQPN)
		}
		seen[u.srcQPN] = i
	}
	stopLive()

	// udaddy's server part: an AH from the GRH, the immediate data as the
	// destination QPN, our own QP's Q_Key, and our QPN as immediate data.
	qkey := uint32(mad.UDPQKey)
	if r.qkey != 0 {
		qkey = r.qkey
	}
	msg := bytes.Repeat([]byte{0x5A}, r.size)
	for i, u := range conns {
		mr, err := u.conn.PD().RegisterMR(msg, 0)
		if err != nil {
			fatal("%v", err)
		}
		defer mr.Close()
		ah, err := u.conn.PD().CreateAH(ctx, roce.AddressVector{DGID: ib.GIDFromAddr(u.grhSrc), SGID: ib.GIDFromAddr(u.grhDst)})
		if err != nil {
			fatal("reply AH for connection %d: %v", i, err)
		}
		defer ah.Close()
		for k := 0; k < r.count; k++ {
			if err := u.conn.QP().PostSend(&roce.SendWR{ID: uint64(k), Opcode: roce.WRSendWithImm, Imm: u.conn.QP().QPN(),
				Flags: roce.SendSignaled, SGL: []roce.SGE{mr.SGE(0, r.size)}, AH: ah, RemoteQPN: u.srcQPN, RemoteQKey: qkey}); err != nil {
				fatal("reply %d on connection %d: %v", k, i, err)
			}
		}
		if err := pollN(ctx, u.conn.SendCQ(), r.count, func(wc *roce.WorkCompletion) error {
			if wc.Status != roce.WCSuccess || wc.Opcode != roce.WCSend {
				return fmt.Errorf("send completion %+v", *wc)
			}
			return nil
		}); err != nil {
			fatal("connection %d: %v", i, err)
		}
	}

	if r.qkey != 0 {
		// Long enough for udaddy to finish many times over had the replies
		// been accepted (it takes well under a second after the last one).
		select {
		case <-job.Done():
			stdout, stderr, code, _ := job.Wait()
			t.Fatalf("udaddy ended (exit %d) although every reply had Q_Key %#x instead of %#x\n%s%s", code, qkey, uint32(mad.UDPQKey), stdout, stderr)
		case <-time.After(10 * time.Second):
		}
		cancelJob()
		stdout, _, code, _ := job.Wait()
		if strings.Contains(string(stdout), "data transfers complete") {
			t.Fatalf("udaddy completed (exit %d) with every reply's Q_Key wrong\n%s", code, stdout)
		}
		t.Logf("with Q_Key %#x udaddy was still waiting for its replies after 10 s (exit %d once cancelled)", qkey, code)
		return
	}
	select {
	case <-job.Done():
	case <-time.After(time.Minute):
		fatal("udaddy has not finished a minute after our %d replies per connection", r.count)
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 || !strings.Contains(string(stdout), "data transfers complete") || !strings.Contains(string(stdout), "return status 0") {
		t.Fatalf("%s: exit %d (%v)\n%s%s", strings.Join(args, " "), code, err, stdout, stderr)
	}
	for i, u := range conns {
		t.Logf("connection %d: our QP %#x, udaddy's QP %#x from %v (cma port %d)", i, u.conn.QP().QPN(), u.srcQPN, u.grhSrc, u.conn.RemoteAddr().Port())
	}
	t.Logf("%s:\n%s", strings.Join(args, " "), stdout)
}

// pollN waits for n completions on cq and checks each.
func pollN(ctx context.Context, cq *roce.CQ, n int, check func(*roce.WorkCompletion) error) error {
	var wc [8]roce.WorkCompletion
	for got := 0; got < n; {
		k := cq.Poll(wc[:min(len(wc), n-got)])
		for i := 0; i < k; i++ {
			if err := check(&wc[i]); err != nil {
				return err
			}
		}
		got += k
		if got == n {
			break
		}
		if err := cq.Wait(ctx); err != nil {
			return fmt.Errorf("%d of %d completions: %w", got, n, err)
		}
	}
	return nil
}

// grhAddrs reads the source and destination of a UD receive's GRH area:
// the IPv6 header, or 20 zero bytes and the IPv4 header.
func grhAddrs(grh []byte, v4 bool) (src, dst netip.Addr) {
	if len(grh) < roce.GRHSize {
		return netip.Addr{}, netip.Addr{}
	}
	if v4 {
		h := ib.IPv4(grh[20:roce.GRHSize])
		return h.Src(), h.Dst()
	}
	h := ib.IPv6(grh)
	return h.Src(), h.Dst()
}
