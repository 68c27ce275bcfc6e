package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
)

// Churn against rxe: several ucmatose runs of churnConns connections each
// (-C 0: connect and disconnect, no messages), in both roles. After them
// goroce must hold nothing more than before (verbs objects, QPNs,
// goroutines), and neither must the guest's rdma_cm (cm_id and QP counts
// of `rdma resource show`).
const (
	churnRounds = 3
	churnConns  = 10
)

// TestRxeChurn: the guest's ucmatose clients against our listener, which
// ends every connection (ucmatose's client waits for the server's DREQ),
// alternately with Disconnect and with Close alone.
func TestRxeChurn(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	base := churnBaseline(t, dev, g)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const port = 7480
	l, err := cm.Listen(ctx, dev, netip.AddrPortFrom(lab.PeerAddr, port), cm.ListenOptions{Backlog: churnConns})
	if err != nil {
		t.Fatal(err)
	}
	var qpns []uint32
	start := time.Now()
	for round := 0; round < churnRounds; round++ {
		job := g.Start(ctx, "ucmatose", "-s", lab.PeerAddr.String(), "-p", strconv.Itoa(port),
			"-c", strconv.Itoa(churnConns), "-C", "0")
		runCtx, runCancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-job.Done():
				runCancel()
			case <-runCtx.Done():
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, churnConns)
		for i := 0; i < churnConns; i++ {
			c, err := l.Accept(runCtx)
			if err != nil {
				runCancel()
				stdout, stderr, code, _ := job.Wait()
				t.Fatalf("round %d: accept %d: %v\nucmatose: exit %d\n%s%s", round, i, err, code, stdout, stderr)
			}
			qpns = append(qpns, c.QP().QPN())
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
					defer dcancel()
					if err := c.Disconnect(dctx); err != nil {
						errs <- fmt.Errorf("disconnect: %w", err)
					}
				}
				if err := c.Close(); err != nil {
					errs <- fmt.Errorf("close: %w", err)
				}
			}()
		}
		wg.Wait()
		stdout, stderr, code, err := job.Wait()
		runCancel()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if err != nil || code != 0 {
			t.Fatalf("round %d: ucmatose -s: exit %d (%v)\n%s%s", round, code, err, stdout, stderr)
		}
	}
	took := time.Since(start)
	l.Close()
	t.Logf("%d connections from rxe in %v (%v each, guest process start included)",
		len(qpns), took.Round(time.Millisecond), took/time.Duration(len(qpns)))
	base.check(t, qpns)
}

// TestRxeChurnDial: the guest's ucmatose servers, our dials; the server
// ends every connection and we Close when Done says so.
func TestRxeChurnDial(t *testing.T) {
	_, g, dev := rxeSetup(t)
	base := churnBaseline(t, dev, g)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const port = 7481
	var qpns []uint32
	start := time.Now()
	for round := 0; round < churnRounds; round++ {
		job := g.Start(ctx, "ucmatose", "-b", g.Addr.String(), "-p", strconv.Itoa(port),
			"-c", strconv.Itoa(churnConns), "-C", "0")
		fail := func(format string, args ...any) {
			t.Helper()
			cancel()
			stdout, stderr, code, err := job.Wait()
			t.Fatalf("round %d: %s\nucmatose: exit %d (%v)\n%s%s", round, fmt.Sprintf(format, args...), code, err, stdout, stderr)
		}
		conns := make([]*cm.Conn, 0, churnConns)
		for len(conns) < churnConns {
			// cmatose's conn_param: one RDMA read each way, retry_count 5.
			c, err := cm.Dial(ctx, dev, netip.AddrPortFrom(g.Addr, port), cm.DialOptions{
				ResponderResources: 1, InitiatorDepth: 1, RetryCount: 5})
			if err == nil {
				conns = append(conns, c)
				qpns = append(qpns, c.QP().QPN())
				continue
			}
			// Until ucmatose listens, rxe's CM answers REJ INVALID_SERVICE_ID.
			if !errors.Is(err, mad.RejInvalidServiceID) || len(conns) > 0 {
				fail("dial %d: %v", len(conns), err)
			}
			select {
			case <-job.Done():
				fail("ucmatose ended before we connected")
			case <-time.After(200 * time.Millisecond):
			}
		}
		for i, c := range conns {
			select {
			case <-c.Done():
			case <-job.Done():
				select {
				case <-c.Done():
				case <-time.After(5 * time.Second):
					fail("connection %d: no DREQ from the server", i)
				}
			}
			if err := c.Close(); err != nil {
				t.Errorf("round %d: connection %d: close: %v", round, i, err)
			}
		}
		stdout, stderr, code, err := job.Wait()
		if err != nil || code != 0 {
			t.Fatalf("round %d: ucmatose: exit %d (%v)\n%s%s", round, code, err, stdout, stderr)
		}
	}
	took := time.Since(start)
	t.Logf("%d connections to rxe in %v (%v each, guest process start included)",
		len(qpns), took.Round(time.Millisecond), took/time.Duration(len(qpns)))
	base.check(t, qpns)
}

// churnState is what a churn test compares its end with.
type churnState struct {
	dev        *roce.Device
	g          *rxelab.Guest
	res        roce.Resources
	goroutines int
	guest      map[string]int // rdma resource show counts of rxe0, nil if unavailable
}

// churnBaseline waits for the CM agent a previous test may have left to
// stop (it lingers a few seconds), then records the state.
func churnBaseline(t *testing.T, dev *roce.Device, g *rxelab.Guest) *churnState {
	t.Helper()
	churnPoll(10*time.Second, func() bool { return dev.Resources() == roce.Resources{} })
	s := &churnState{dev: dev, g: g, res: dev.Resources(), goroutines: runtime.NumGoroutine()}
	s.guest = churnGuestResources(t, g)
	t.Logf("before: goroce %+v, %d goroutines; rxe0 %v", s.res, s.goroutines, s.guest)
	return s
}

// check waits for goroce's CM to stop and compares.
func (s *churnState) check(t *testing.T, qpns []uint32) {
	t.Helper()
	if !churnPoll(15*time.Second, func() bool { return s.dev.Resources() == s.res }) {
		t.Errorf("verbs objects %+v, before %+v", s.dev.Resources(), s.res)
	}
	for _, q := range qpns {
		if s.dev.HasQP(q) {
			t.Errorf("QPN %#x of a closed connection is still in the device's table", q)
		}
	}
	if !churnPoll(5*time.Second, func() bool { return runtime.NumGoroutine() <= s.goroutines }) {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines, before %d:\n%s", runtime.NumGoroutine(), s.goroutines, buf[:runtime.Stack(buf, true)])
	}
	if s.guest == nil {
		return
	}
	// The guest's IDs leave timewait after a few seconds too.
	var after map[string]int
	churnPoll(15*time.Second, func() bool {
		after = churnGuestResources(t, s.g)
		return after["cm_id"] <= s.guest["cm_id"] && after["qp"] <= s.guest["qp"]
	})
	t.Logf("after: goroce %+v; rxe0 %v", s.dev.Resources(), after)
	for _, k := range []string{"cm_id", "qp"} {
		if after[k] > s.guest[k] {
			t.Errorf("rxe0 holds %d %s, before %d", after[k], k, s.guest[k])
		}
	}
}

var churnRdmaRes = regexp.MustCompile(`\b(pd|cq|qp|cm_id|mr|ctx|srq) (\d+)`)

// churnGuestResources returns rxe0's object counts from `rdma resource show`,
// or nil (logged) if the guest has no rdma tool.
func churnGuestResources(t *testing.T, g *rxelab.Guest) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stdout, stderr, code, err := g.Exec(ctx, "rdma", "resource", "show")
	if err != nil || code != 0 {
		t.Logf("rdma resource show: exit %d (%v) %s: not comparing the guest's counts", code, err, stderr)
		return nil
	}
	m := map[string]int{}
	for _, f := range churnRdmaRes.FindAllStringSubmatch(string(stdout), -1) {
		n, _ := strconv.Atoi(f[2])
		m[f[1]] += n
	}
	return m
}

// churnPoll polls cond every 50 ms until it holds or timeout passes.
func churnPoll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}
