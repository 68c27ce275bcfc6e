package naaice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nc "github.com/goroce/goroce/naaice"
	"github.com/goroce/goroce/naaice/mrsp"
	"github.com/goroce/goroce/roce"
)

// cServerPause is the pause a goroce host leaves before each RPC against the
// C software NAA, which misses the host's write if it comes while it still
// handles its own previous completion (a lost wake-up; see doc.go).
const cServerPause = time.Second

// goHostCase is one RPC pattern of a goroce host.
type goHostCase struct {
	name     string
	fn       uint8
	sizes    []int
	internal []uint32
	rpcs     int
	// rpcTimeout, if set, bounds each RPC: one that runs out with every
	// write of the host acknowledged (DATA_RECEIVING) is reported as
	// errCServerStalled.
	rpcTimeout time.Duration
}

// errCServerStalled is the C software NAA's lost wake-up (see doc.go): the
// host's RPC was delivered and acknowledged, and the NAA never answered.
var errCServerStalled = errors.New("the C NAA never answered an RPC it acknowledged (its lost wake-up)")

// runGoHost is the verifying client of naaice_verify.c in Go: all regions
// inputs, region 0 single-send with 2 bytes in the first RPC when there are
// several, the regions from max(1, N/2) on outputs; every byte checked
// after every RPC.
//
// It ends with a DREQ and waits a few seconds for the DREP; whether it came
// is returned as a note: the C software NAA never answers a DREQ (it does
// not call rdma_disconnect, "done by client exclusively"), so a graceful
// Disconnect would wait for the CM's retries, and the C host does not wait.
func runGoHost(ctx context.Context, dev *roce.Device, remote netip.AddrPort, c goHostCase, pause time.Duration) (string, error) {
	add := map[uint8]byte{1: 1, 2: 2, 3: 0}[c.fn]
	n := len(c.sizes)
	params := make([][]byte, n)
	for i, s := range c.sizes {
		params[i] = bytes.Repeat([]byte{byte(10 + i)}, s)
	}
	firstOut := max(1, n/2)
	if n == 1 {
		firstOut = 0
	}
	h, err := nc.NewContext(dev, remote, params, c.internal, c.fn, nc.Options{})
	if err != nil {
		return "", err
	}
	defer h.Close()
	for i := range params {
		h.SetInput(i)
	}
	for i := firstOut; i < n; i++ {
		h.SetOutput(i)
	}
	if n > 1 {
		h.SetSingleSend(0)
		h.SetBytesToSend(0, 2)
	}
	h.SetImmediate([3]byte{1, 2, 3})
	if err := h.Connect(ctx); err != nil {
		return "", err
	}
	if err := h.DoMRSP(ctx); err != nil {
		return "", fmt.Errorf("MRSP: %w", err)
	}
	for r := 1; r <= c.rpcs; r++ {
		if pause > 0 {
			time.Sleep(pause)
		}
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if c.rpcTimeout > 0 {
			rctx, cancel = context.WithTimeout(ctx, c.rpcTimeout)
		}
		err := h.DoRPC(rctx)
		stalled := rctx.Err() != nil && ctx.Err() == nil && h.State() == mrsp.DataReceiving
		cancel()
		if stalled {
			return "", fmt.Errorf("RPC %d: %w", r, errCServerStalled)
		}
		if err != nil {
			return "", fmt.Errorf("RPC %d: %w", r, err)
		}
		h.SetBytesToSend(0, -1)
		for i, p := range params {
			want := byte(10 + i)
			if i >= firstOut {
				want += add * byte(r)
			}
			for j, b := range p {
				if b != want {
					return "", fmt.Errorf("after RPC %d: region %d byte %d is %d, want %d", r, i, j, b, want)
				}
			}
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := h.Disconnect(dctx); err != nil {
		return fmt.Sprintf("no DREP within %v (%v)", time.Since(t0).Round(time.Millisecond), err), nil
	}
	return fmt.Sprintf("DREP after %v", time.Since(t0).Round(time.Millisecond)), nil
}

// TestGoClientCServer: goroce hosts against the C software NAA in the guest,
// a fresh server per case (it leaks connection slots).
func TestGoClientCServer(t *testing.T) {
	_, g, dev := setup(t)
	remote := netip.AddrPortFrom(g.Addr, mrsp.ServerPort)
	for _, c := range []goHostCase{
		{name: "example", fn: 3, sizes: []int{1024, 1024, 1024}, rpcs: 1},
		{name: "add1-repeated", fn: 1, sizes: []int{1024, 1024, 1024}, rpcs: 3},
		{name: "one-region", fn: 2, sizes: []int{7}, rpcs: 2},
		{name: "many-regions-internal", fn: 1, sizes: []int{16, 3, 5000, 64, 100, 4096, 1}, internal: []uint32{4096, 100}, rpcs: 2},
		{name: "4MiB", fn: 2, sizes: []int{64, 4 << 20}, rpcs: 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			// The C NAA's lost wake-up (doc.go) is not covered by the pause
			// before an RPC when it missed its own completion before; that
			// fault alone (every write of the host acknowledged, no answer)
			// is rerun on a fresh server.
			c.rpcTimeout = time.Minute
			for attempt := 1; ; attempt++ {
				note, err := goHostAgainstCServer(g, dev, remote, c)
				if err == nil {
					t.Logf("verified %d RPCs (attempt %d); disconnect: %s", c.rpcs, attempt, note)
					return
				}
				if attempt < 3 && errors.Is(err, errCServerStalled) {
					t.Logf("attempt %d: %v; again with a fresh server", attempt, err)
					continue
				}
				t.Fatalf("goroce host: %v", err)
			}
		})
	}
}

// goServer runs a goroce software NAA on the lab's host side for one test.
func goServer(t *testing.T, dev *roce.Device, addr netip.Addr) (*nc.Server, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	srv := nc.NewServer(dev, nc.ServerOptions{})
	nc.ExampleRoutines(srv)
	done := make(chan error, 1)
	go func() { done <- srv.ListenAndServe(ctx, netip.AddrPortFrom(addr, mrsp.ServerPort)) }()
	return srv, func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("server: %v", err)
		}
	}
}

// TestCClientGoServer: the verifying C host (the library's own calls) and
// the C example client against the goroce software NAA.
func TestCClientGoServer(t *testing.T) {
	lab, g, dev := setup(t)
	srv, stop := goServer(t, dev, lab.PeerAddr)
	defer stop()
	peer := lab.PeerAddr.String()
	for _, c := range []struct {
		name string
		args []string
	}{
		{"example", []string{peer, "3", "1", "1024 1024 1024"}},
		{"add1-repeated", []string{peer, "1", "5", "1024 1024 1024"}},
		{"one-region", []string{peer, "2", "3", "7"}},
		{"many-regions-internal", []string{"-i", "4096 100", peer, "1", "4", "16 3 5000 64 100 4096 1"}},
		{"4MiB", []string{peer, "2", "3", "64 4194304"}},
		{"fast-back-to-back", []string{peer, "1", "20", "64 64"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			stdout, stderr, code, err := g.Exec(ctx, append([]string{guestVerify}, c.args...)...)
			if err != nil || code != 0 || !bytes.Contains(stdout, []byte("\nverified: ")) && !bytes.HasPrefix(stdout, []byte("verified: ")) {
				t.Fatalf("naaice_verify %v: exit %d (%v)\n%s%s\nserver counters %+v", c.args, code, err, stdout, stderr, srv.Counters())
			}
			t.Logf("%s", lastLine(stdout))
		})
	}
	t.Run("example-client", func(t *testing.T) {
		// The library's example client: function 3 (no change), 3 regions,
		// the last one the output; it prints the first bytes of the output.
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		stdout, stderr, code, err := g.Exec(ctx, guestClient, g.Addr.String(), peer, "3", "1024 1024 1024")
		want := "Output of the last MR: 12 12 12 12 12 12 12 12 12 12 12"
		if err != nil || code != 0 || !strings.Contains(string(stdout), want) {
			t.Fatalf("naaice_client: exit %d (%v), want %q\n%s%s", code, err, want, stdout, stderr)
		}
	})
	c := srv.Counters()
	if c.MRSPErrors+c.OutOfOrder+c.CompletionErrors+c.HostAborts+c.Disconnects != 0 {
		t.Errorf("server counters %+v", c)
	}
	t.Logf("server counters %+v", c)
}

// TestAP2Client: the library's AP2 (middleware) example client runs all
// 100 of its RPCs against the goroce software NAA (against the C server it
// stalls after a few). Its own check expects regions 0 and 1 unchanged
// although they are outputs, so the test reads the values it prints.
func TestAP2Client(t *testing.T) {
	lab, g, dev := setup(t)
	srv, stop := goServer(t, dev, lab.PeerAddr)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	spec := fmt.Sprintf("NAA_SPEC=%s:%d:1:4 NAA_LOCAL_IP=%s exec %s 4 '64 64 64 64'", lab.PeerAddr, mrsp.ServerPort, g.Addr, guestAP2)
	stdout, stderr, code, err := g.Exec(ctx, "sh", "-c", spec)
	if err != nil || code != 0 {
		t.Fatalf("naaice_client_ap2: exit %d (%v)\n%s%s", code, err, stdout, stderr)
	}
	out := string(stdout)
	if n := strings.Count(out, "RPC Return code: 0"); n != 100 {
		t.Errorf("%d of 100 RPCs returned code 0\n%s", n, out)
	}
	if !strings.Contains(out, "Bytes received: 64, RPC Return code: 0") {
		t.Errorf("no 64-byte final write reported")
	}
	// Inputs 0-3, outputs 0, 1, 3, function code 1: each output gains 1
	// per RPC, input 2 is never written back.
	re := regexp.MustCompile(`Parameter (\d): first element: (\d+)`)
	got := map[int]int{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(m[1])
		v, _ := strconv.Atoi(m[2])
		got[i] = v
	}
	if want := map[int]int{0: 100, 1: 101, 2: 2, 3: 103}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("first elements %v, want %v\n%s", got, want, out)
	}
	// The NAA counts an RPC when its write-back's ACK came.
	for deadline := time.Now().Add(10 * time.Second); srv.Counters().RPCs < 100 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if c := srv.Counters(); c.RPCs != 100 {
		t.Errorf("server counters %+v", c)
	}
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
