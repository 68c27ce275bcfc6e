package s3rdma

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	srvIP = netip.MustParseAddr("10.0.0.1")
	cliIP = netip.MustParseAddr("10.0.0.2")
	quiet = &cuobj.Telemetry{Off: true}
)

func devices(t testing.TB) (*roce.Device, *roce.Device) {
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}, net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{srvIP}, Neighbours: map[netip.Addr]net.HardwareAddr{cliIP: macB}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{cliIP}, Neighbours: map[netip.Addr]net.HardwareAddr{srvIP: macA}, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return da, db
}

type env struct {
	dir  string
	srv  *Server
	http *httptest.Server
	cli  *Client
}

func setup(t *testing.T, withRDMA bool, copt *cuobj.ClientOptions) *env {
	return setupTB(t, withRDMA, copt)
}

func setupB(b *testing.B) *env { return setupTB(b, true, nil) }

func setupTB(t testing.TB, withRDMA bool, copt *cuobj.ClientOptions) *env {
	sdev, cdev := devices(t)
	var rs *cuobj.Server
	if withRDMA {
		var err error
		so := cuobj.ServerOptions{Telemetry: quiet}
		if copt != nil {
			so.Proto = copt.Proto // the client's protocol
		}
		rs, err = cuobj.NewServer(sdev, netip.AddrPortFrom(srvIP, 18515), so)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
	}
	dir := t.TempDir()
	s, err := NewServer(dir, rs, nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	if copt == nil {
		copt = &cuobj.ClientOptions{}
	}
	cfg := cuobj.DefaultConfig()
	copt.Config, copt.Telemetry = &cfg, quiet
	copt.Servers = []netip.Addr{srvIP} // the RDMA server; the HTTP one is on loopback
	c, err := NewClient(cdev, hs.URL, ClientOptions{RDMA: *copt})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := os.Mkdir(filepath.Join(dir, "bucket"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &env{dir: dir, srv: s, http: hs, cli: c}
}

func data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRDMAPutGet(t *testing.T) { rdmaPutGet(t, nil) }

// TestRDMAPutGetDC is TestRDMAPutGet over protocol 1001 (DC).
func TestRDMAPutGetDC(t *testing.T) { rdmaPutGet(t, &cuobj.ClientOptions{Proto: cuobj.ProtoDC}) }

func rdmaPutGet(t *testing.T, copt *cuobj.ClientOptions) {
	e := setup(t, true, copt)
	ctx := ctxT(t)
	for _, size := range []int{1, 4096, 1 << 20, 3<<20 + 5} {
		obj := data(size)
		buf := make([]byte, size)
		copy(buf, obj)
		if err := e.cli.RDMA().Register(buf); err != nil {
			t.Fatal(err)
		}
		byRDMA, err := e.cli.Put(ctx, "bucket", "dir/obj", buf)
		if err != nil || !byRDMA {
			t.Fatalf("Put %d: rdma %v, %v", size, byRDMA, err)
		}
		// The stored object, read with plain HTTP, is what was put.
		resp, err := http.Get(e.http.URL + "/bucket/dir/obj")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Equal(got, obj) {
			t.Fatalf("plain GET of an RDMA PUT of %d bytes differs", size)
		}
		clear(buf)
		n, byRDMA, err := e.cli.Get(ctx, "bucket", "dir/obj", buf)
		if err != nil || !byRDMA || n != int64(size) || !bytes.Equal(buf, obj) {
			t.Fatalf("Get %d: %d, rdma %v, %v", size, n, byRDMA, err)
		}
		e.cli.RDMA().Deregister(buf)
	}
	if e.srv.RDMAGets.Load() != 4 || e.srv.RDMAPuts.Load() != 4 || e.srv.Declined.Load() != 0 {
		t.Errorf("server counters: %d gets %d puts %d declined", e.srv.RDMAGets.Load(), e.srv.RDMAPuts.Load(), e.srv.Declined.Load())
	}
}

// A plain S3 PUT read back by RDMA, a short object into a larger buffer,
// a larger object into a short buffer (206), and chunked GETs (ranges).
func TestPlainAndPartial(t *testing.T) {
	e := setup(t, true, &cuobj.ClientOptions{MaxRequestCallbackSize: 65536})
	ctx := ctxT(t)
	obj := data(200000)
	req, _ := http.NewRequest(http.MethodPut, e.http.URL+"/bucket/plain", bytes.NewReader(obj))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("plain PUT: %v %v", resp, err)
	}
	buf := make([]byte, 300000)
	e.cli.RDMA().Register(buf)
	n, byRDMA, err := e.cli.Get(ctx, "bucket", "plain", buf)
	if err != nil || !byRDMA || n != 200000 || !bytes.Equal(buf[:n], obj) {
		t.Fatalf("chunked GET: %d %v %v", n, byRDMA, err)
	}
	small := make([]byte, 1000)
	e.cli.RDMA().Register(small)
	if n, _, err := e.cli.Get(ctx, "bucket", "plain", small); err != nil || n != 1000 || !bytes.Equal(small, obj[:1000]) {
		t.Fatalf("short buffer: %d %v", n, err)
	}
	if _, _, err := e.cli.Get(ctx, "bucket", "missing", small); err == nil {
		t.Fatal("GET of a missing object")
	}
}

// TestFallback: a server without RDMA answers 501 and the client moves
// the data over HTTP instead.
func TestFallback(t *testing.T) {
	e := setup(t, false, nil)
	ctx := ctxT(t)
	obj := data(100000)
	buf := append([]byte(nil), obj...)
	e.cli.RDMA().Register(buf)
	byRDMA, err := e.cli.Put(ctx, "bucket", "k", buf)
	if err != nil || byRDMA {
		t.Fatalf("fallback PUT: %v %v", byRDMA, err)
	}
	clear(buf)
	n, byRDMA, err := e.cli.Get(ctx, "bucket", "k", buf)
	if err != nil || byRDMA || n != 100000 || !bytes.Equal(buf, obj) {
		t.Fatalf("fallback GET: %d %v %v", n, byRDMA, err)
	}
	if e.srv.Declined.Load() != 2 {
		t.Errorf("%d declined", e.srv.Declined.Load())
	}
}

func TestProtocolErrors(t *testing.T) {
	e := setup(t, true, nil)
	os.WriteFile(filepath.Join(e.dir, "bucket", "o"), []byte("x"), 0o644)
	do := func(method, path string, hdr map[string]string) *http.Response {
		req, _ := http.NewRequest(method, e.http.URL+path, http.NoBody)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct {
		method, path, token string
		status              int
	}{
		{"GET", "/bucket/o", "garbage", 400},
		{"PUT", "/bucket/o", "garbage", 400},
		{"GET", "/bucket/o", strings.Repeat("0", 81), 400},
		{"GET", "/bucket/../etc/passwd", "", 400},
		{"GET", "/bucket/nope", "", 404},
		{"PUT", "/nobucket/o", "", 404},
		{"GET", "/nobucket", "", 404},
		{"POST", "/bucket/o", "", 405},
	} {
		h := map[string]string{}
		if c.token != "" {
			h[HeaderToken] = c.token
		}
		if resp := do(c.method, c.path, h); resp.StatusCode != c.status {
			t.Errorf("%s %s token %q: %d, want %d", c.method, c.path, c.token, resp.StatusCode, c.status)
		}
	}
	// A valid token whose client is not there: the transfer fails, 500.
	tok := cuobj.Token{Addr: 0x1000, Size: 1, LID: 9, QPN: 5, HasGID: true, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.http.URL+"/bucket/o", nil)
	req.Header.Set(HeaderToken, tok.String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(body), errTransferFailed) {
		t.Errorf("unreachable client: %d %s", resp.StatusCode, body)
	}
	// An RDMA PUT larger than the server buffers is refused before any
	// allocation.
	big := cuobj.Token{Addr: 0x1000, Size: cuobj.MaxRegSize, LID: 9, QPN: 5, HasGID: true, GID: tok.GID}
	if resp := do("PUT", "/bucket/big", map[string]string{HeaderToken: big.String()}); resp.StatusCode != 400 {
		t.Errorf("4 GiB RDMA PUT: %d", resp.StatusCode)
	}
	// Listing.
	resp, err = http.Get(e.http.URL + "/bucket?list-type=2")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "<Key>o</Key>") {
		t.Errorf("listing: %s", body)
	}
}

func TestParseRange(t *testing.T) {
	for _, c := range []struct {
		h          string
		start, n   int64
		ranged, ok bool
	}{
		{"", 0, 100, false, true}, {"bytes=0-9", 0, 10, true, true}, {"bytes=90-200", 90, 10, true, true},
		{"bytes=50-", 50, 50, true, true}, {"bytes=100-101", 0, 0, false, false}, {"bytes=5-4", 0, 0, false, false},
		{"bytes=0-1,3-4", 0, 0, false, false}, {"items=0-1", 0, 0, false, false}, {"bytes=-5", 0, 0, false, false},
	} {
		s, n, r, err := parseRange(c.h, 100)
		if (err == nil) != c.ok || (c.ok && (s != c.start || n != c.n || r != c.ranged)) {
			t.Errorf("parseRange(%q) = %d %d %v %v", c.h, s, n, r, err)
		}
	}
}
