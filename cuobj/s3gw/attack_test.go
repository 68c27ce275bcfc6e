package s3gw

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3rdma"
)

// The exhaustion attacks of issue #28 on the gateway: many RDMA requests
// whose token names a client that never answers, sent (signed: the
// attacker holds a key) from an HTTP address of their own, while a
// legitimate client keeps working; over memlink and over the kernel UDP
// link on loopback (attacklink_test.go).

// phantomIP is a client that does not exist on memlink: the server's
// device sends to the client's MAC, whose device drops what is not for
// its address, so the server's connection request goes unanswered.
var phantomIP = netip.MustParseAddr("10.0.0.9")

type attackEnv struct {
	rs           *cuobj.Server
	g            *Gateway
	srv, phantom netip.Addr
	url          string
	cli          *s3rdma.Client
	dir          string
	tun          cuobj.Tunables
	attack       []*signer // HTTP from 127.0.0.2 …: the attacker's own addresses
}

func newAttackEnv(t *testing.T, lk attackLink) *attackEnv {
	n := lk.open(t)
	e := &attackEnv{tun: cuobj.DefaultTunables(), dir: t.TempDir(), srv: n.srv, phantom: n.phantom}
	// The connect timeout is what the attack costs; 2 s keeps the test
	// short. The budget is small enough that an attack which held
	// buffers would meet it.
	e.tun.ConnectTimeout = 2 * time.Second
	e.tun.MaxHeldBytes = 64 << 20
	var err error
	if e.rs, err = cuobj.NewServer(n.sdev, netip.AddrPortFrom(n.srv, 18515), cuobj.ServerOptions{Tunables: &e.tun, Telemetry: quiet}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.rs.Close() })
	e.tun = e.rs.Tunables()
	e.g, e.url = gateway(t, Options{Dir: e.dir, RDMA: e.rs})
	cfg := cuobj.DefaultConfig()
	// 503s are retried (EAGAIN) up to 10 times, 500 ms apart: a client
	// that waits about as long as Retry-After says.
	cfg.Properties.IORetryCount, cfg.Properties.IORetryDelayMS = 10, 500
	if e.cli, err = s3rdma.NewClient(n.cdev, e.url, s3rdma.ClientOptions{Credentials: creds, RDMA: cuobj.ClientOptions{Config: &cfg, Telemetry: quiet,
		Servers: []netip.Addr{n.srv}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.cli.Close() })
	(&signer{url: e.url, creds: creds}).mustOK(t, "PUT", "/bucket", nil)
	for i := range 5 {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))}}
		c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 256}}
		t.Cleanup(c.CloseIdleConnections)
		e.attack = append(e.attack, &signer{url: e.url, creds: creds, http: c})
	}
	return e
}

// phantomToken names the phantom client, at an IPv4 address.
func phantomToken(size uint32, phantom netip.Addr) string {
	a := phantom.As4()
	tok := cuobj.Token{Addr: 0x10000, Size: size, RKey: 0x1234, LID: 4791, QPN: 0x42, HasGID: true,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: a[0], 13: a[1], 14: a[2], 15: a[3]}}
	return tok.String()
}

// peak samples what the server holds while an attack runs, and the
// test process's RSS (the server runs in it).
type peak struct {
	held, chans, rss atomic.Int64
	stop             chan struct{}
	done             sync.WaitGroup
}

func watch(rs *cuobj.Server) *peak {
	p := &peak{stop: make(chan struct{})}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		tk := time.NewTicker(2 * time.Millisecond)
		defer tk.Stop()
		for i := 0; ; i++ {
			if i%5 == 0 {
				if r, _, ok := procStatus(); ok && r > p.rss.Load() {
					p.rss.Store(r)
				}
			}
			if h := rs.HeldBytes(); h > p.held.Load() {
				p.held.Store(h)
			}
			if c := int64(rs.ChannelsInUse()); c > p.chans.Load() {
				p.chans.Store(c)
			}
			select {
			case <-p.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return p
}

func (p *peak) end() { close(p.stop); p.done.Wait() }

// flood sends n RDMA requests naming the phantom client at once and
// returns their statuses by code, and how many 503s had a Retry-After.
func (e *attackEnv) flood(ctx context.Context, t *testing.T, n, addrs int, method string, size uint32) (map[int]int, int) {
	var mu sync.Mutex
	codes, retryAfter := map[int]int{}, 0
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/bucket/obj" + map[bool]string{true: "", false: "-put"}[method == "GET"]
			resp, _, err := e.attack[i%addrs].try(ctx, method, path, nil, map[string]string{s3rdma.HeaderToken: phantomToken(size, e.phantom)})
			if err != nil {
				t.Errorf("attack request: %v", err)
				return
			}
			mu.Lock()
			codes[resp.StatusCode]++
			if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
				retryAfter++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return codes, retryAfter
}

// mib formats bytes in MiB for the figures.
func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }

// spread is the min, median and max of the legitimate client's requests.
func spread(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	d = slices.Clone(d)
	slices.Sort(d)
	r := func(x time.Duration) time.Duration { return x.Round(100 * time.Microsecond) }
	return fmt.Sprintf("%d requests, min %v, median %v, max %v", len(d), r(d[0]), r(d[len(d)/2]), r(d[len(d)-1]))
}

// TestAttackExhaustion: each pattern runs while the legitimate client
// repeats its request until the attack ends; the log gives the figures
// (the test process's RSS before, at its peak and after; the channels
// the attack held; the legitimate requests' times).
func TestAttackExhaustion(t *testing.T) {
	forAttackLinks(t, testAttackExhaustion)
}

func testAttackExhaustion(t *testing.T, lk attackLink) {
	e := newAttackEnv(t, lk)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	const objSize = 8 << 20
	obj := data(objSize)
	if err := e.cli.RDMA().Register(obj); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Put(ctx, "bucket", "obj", obj); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, objSize)
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name   string
		method string
		n      int
		addrs  int // HTTP addresses the attack comes from
		size   uint32
	}{
		{"GETs of an 8 MiB object", "GET", 24, 1, objSize},
		{"one-byte PUTs", "PUT", 130, 1, 1},
		// From 5 addresses the attack can take every channel: the
		// legitimate client gets 503s and retries until the connect
		// timeout frees them.
		{"one-byte PUTs from 5 addresses", "PUT", 160, 5, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := e.rs.Stats()
			timeouts0, refused0, noChan0 := st.ConnectTimeouts.Load(), st.RefusedClientChannels.Load(), st.RefusedNoChannel.Load()
			debug.FreeOSMemory() // a baseline of what is live, not the last pattern's garbage
			hwmReset := resetHWM()
			rssBefore, _, haveRSS := procStatus()
			p := watch(e.rs)
			var codes map[int]int
			var retryAfter int
			done := make(chan struct{})
			go func() {
				defer close(done)
				codes, retryAfter = e.flood(ctx, t, c.n, c.addrs, c.method, c.size)
			}()
			// Let the attack take what it can before the client starts.
			deadline := time.Now().Add(10 * time.Second)
			for e.rs.ChannelsInUse() < min(c.n, c.addrs*e.tun.MaxChannelsPerClient, e.tun.NumDCIs) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			attackChans := e.rs.ChannelsInUse()
			rssHeld, _, _ := procStatus() // the attack alone, its channels taken
			// The legitimate client repeats its request until the attack
			// has its answers (at least once).
			var waits []time.Duration
			for attacking := true; attacking; {
				start := time.Now()
				var err error
				if c.method == "GET" {
					clear(buf)
					var n int64
					if n, _, err = e.cli.Get(ctx, "bucket", "obj", buf); err == nil && (n != objSize || !bytes.Equal(buf, obj)) {
						t.Errorf("legitimate GET: %d bytes, data differs: %v", n, !bytes.Equal(buf, obj))
					}
				} else {
					_, err = e.cli.Put(ctx, "bucket", "legit", obj)
				}
				waits = append(waits, time.Since(start))
				if err != nil {
					t.Fatalf("legitimate %s %d during the attack: %v", c.method, len(waits), err)
				}
				select {
				case <-done:
					attacking = false
				default:
				}
			}
			p.end()
			rssAfter, hwm, _ := procStatus()
			rssPeak := p.rss.Load()
			if hwmReset && hwm > rssPeak {
				rssPeak = hwm
			}
			t.Logf("%s: %d attacking %s (%d addresses): channels held by the attack %d (peak %d of %d, cap per address %d); peak bytes held for RDMA %d (budget %d); attack answers %v (%d with Retry-After); connect timeouts %d, refused per address %d, no channel %d",
				lk.name, c.n, c.name, c.addrs, attackChans, p.chans.Load(), e.tun.NumDCIs, e.tun.MaxChannelsPerClient, p.held.Load(), e.tun.MaxHeldBytes,
				codes, retryAfter, st.ConnectTimeouts.Load()-timeouts0, st.RefusedClientChannels.Load()-refused0, st.RefusedNoChannel.Load()-noChan0)
			t.Logf("%s: legitimate %s meanwhile: %s", lk.name, c.method, spread(waits))
			if haveRSS {
				t.Logf("%s: test process RSS (the gateway and its server run in it, beside the client): before %s, with the attack's channels taken %s, peak with the legitimate requests %s (VmHWM reset: %v), after %s",
					lk.name, mib(rssBefore), mib(rssHeld), mib(rssPeak), hwmReset, mib(rssAfter))
				// The attack should cost no buffers: the growth is the
				// legitimate requests' 8 MiB buffers on both sides and
				// the garbage collector's slack (under 100 MiB
				// measured), and the attack's channels (about 10 MiB
				// for 128). The bound, three budgets (192 MiB), is
				// generous, and an attack whose GETs each took their
				// object's buffer outside the budget would add 24 × 8
				// MiB, as much again, by itself. The race detector
				// multiplies memory, so the bound is for normal builds
				// only.
				if !raceEnabled && rssPeak-rssBefore > 3*e.tun.MaxHeldBytes {
					t.Errorf("RSS grew by %s during the attack, more than three times the budget %s", mib(rssPeak-rssBefore), mib(e.tun.MaxHeldBytes))
				}
			}
			// The attack never reaches its client, so it holds no memory:
			// the peak is the legitimate request's object at most.
			if p.held.Load() > objSize {
				t.Errorf("peak held %d bytes, more than the legitimate %d", p.held.Load(), objSize)
			}
			if c.addrs == 1 && p.chans.Load() > int64(e.tun.MaxChannelsPerClient)+4 { // + the legitimate client's
				t.Errorf("peak %d channels, cap per address %d", p.chans.Load(), e.tun.MaxChannelsPerClient)
			}
			if slices.Max(waits) > 60*time.Second {
				t.Errorf("the legitimate client waited %v", slices.Max(waits))
			}
			if c.n > c.addrs*e.tun.MaxChannelsPerClient && codes[http.StatusServiceUnavailable] == 0 {
				t.Errorf("no 503 for %d requests from one address: %v", c.n, codes)
			}
			if retryAfter != codes[http.StatusServiceUnavailable] {
				t.Errorf("%d of %d 503s had Retry-After", retryAfter, codes[http.StatusServiceUnavailable])
			}
			if codes[http.StatusOK] != 0 {
				t.Errorf("attack answers %v", codes)
			}
			if e.rs.HeldBytes() != 0 || e.rs.ChannelsInUse() != 0 {
				t.Errorf("after the attack: %d bytes held, %d channels", e.rs.HeldBytes(), e.rs.ChannelsInUse())
			}
		})
	}
	st := e.rs.Stats()
	t.Logf("%s: server: connect timeouts %d, refused per-client %d, no channel %d, memory %d; front end: overloaded %d, timeouts %d",
		lk.name, st.ConnectTimeouts.Load(), st.RefusedClientChannels.Load(), st.RefusedNoChannel.Load(), st.RefusedMemory.Load(),
		e.g.Stats().Overloaded.Load(), e.g.Stats().ConnectTimeouts.Load())
	if st.ConnectTimeouts.Load() == 0 || st.RefusedClientChannels.Load() == 0 {
		t.Error("refusals not counted")
	}
}

// TestBudget: a request past MaxHeldBytes is 503 SlowDown with
// Retry-After, before any buffer is allocated.
func TestBudget(t *testing.T) {
	forAttackLinks(t, testBudget)
}

func testBudget(t *testing.T, lk attackLink) {
	e := newAttackEnv(t, lk)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	release, err := e.rs.Reserve(e.tun.MaxHeldBytes - 100)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	small := data(100)
	if err := e.cli.RDMA().Register(small); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Put(ctx, "bucket", "small", small); err != nil {
		t.Fatalf("a PUT within the budget: %v", err)
	}
	if _, err := e.rs.Reserve(101); err == nil {
		t.Fatal("Reserve past the budget succeeded")
	}
	buf := make([]byte, 4096)
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	tok, err := e.cli.RDMA().GetRDMATokenFor(buf, 4096, 0, cuobj.OpPut, e.srv)
	if err != nil {
		t.Fatal(err)
	}
	resp, _, err := (&signer{url: e.url, creds: creds}).try(ctx, "PUT", "/bucket/big", nil, map[string]string{s3rdma.HeaderToken: tok})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("PUT past the budget: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e.rs.Stats().RefusedMemory.Load() < 2 || e.g.Stats().Overloaded.Load() != 1 {
		t.Errorf("refused memory %d, overloaded %d", e.rs.Stats().RefusedMemory.Load(), e.g.Stats().Overloaded.Load())
	}
	_ = e.cli.RDMA().PutRDMAToken(tok)
}
