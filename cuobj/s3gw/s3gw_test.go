package s3gw

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3rdma"
)

type env struct {
	dir string
	g   *Gateway
	url string
	cli *s3rdma.Client
	s   *signer // signed plain HTTP as the test account
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
	g, url := gateway(t, Options{Dir: dir, RDMA: rs})
	if copt == nil {
		copt = &cuobj.ClientOptions{}
	}
	cfg := cuobj.DefaultConfig()
	copt.Config, copt.Telemetry = &cfg, quiet
	copt.Servers = []netip.Addr{srvIP} // the RDMA server; the HTTP one is on loopback
	c, err := s3rdma.NewClient(cdev, url, s3rdma.ClientOptions{RDMA: *copt, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e := &env{dir: dir, g: g, url: url, cli: c, s: &signer{url: url, creds: creds}}
	e.s.mustOK(t, "PUT", "/bucket", nil)
	return e
}

func TestRDMAPutGet(t *testing.T) { rdmaPutGet(t, nil) }

// TestRDMAPutGetDC is TestRDMAPutGet over protocol 1001 (DC).
func TestRDMAPutGetDC(t *testing.T) { rdmaPutGet(t, &cuobj.ClientOptions{Proto: cuobj.ProtoDC}) }

func rdmaPutGet(t *testing.T, copt *cuobj.ClientOptions) {
	e := setup(t, true, copt)
	ctx := ctxT(t)
	// The last two fill the buffer more than once: its pieces are reused,
	// one ends inside a piece.
	sizes := []int{1, 4096, 1 << 20, 3<<20 + 5, chunkSize + 4097, 2*chunkSize + pieceSize/2 + 3}
	for _, size := range sizes {
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
		// The stored object, read with plain HTTP and in the directory,
		// is what was put.
		if got := e.s.mustOK(t, "GET", "/bucket/dir/obj", nil); !bytes.Equal(got, obj) {
			t.Fatalf("plain GET of an RDMA PUT of %d bytes differs", size)
		}
		if got, err := os.ReadFile(filepath.Join(e.dir, "bucket", "dir", "obj")); err != nil || !bytes.Equal(got, obj) {
			t.Fatalf("the file of an RDMA PUT of %d bytes differs: %v", size, err)
		}
		clear(buf)
		n, byRDMA, err := e.cli.Get(ctx, "bucket", "dir/obj", buf)
		if err != nil || !byRDMA || n != int64(size) || !bytes.Equal(buf, obj) {
			t.Fatalf("Get %d: %d, rdma %v, %v", size, n, byRDMA, err)
		}
		e.cli.RDMA().Deregister(buf)
	}
	st := e.g.Stats()
	if st.RDMAGets.Load() != uint64(len(sizes)) || st.RDMAPuts.Load() != uint64(len(sizes)) || st.Declined.Load() != 0 {
		t.Errorf("server counters: %d gets %d puts %d declined", st.RDMAGets.Load(), st.RDMAPuts.Load(), st.Declined.Load())
	}
	// An empty object goes by plain HTTP.
	if byRDMA, err := e.cli.Put(ctx, "bucket", "empty", nil); err != nil || byRDMA {
		t.Fatalf("empty Put: rdma %v, %v", byRDMA, err)
	}
	if n, err := e.cli.Head(ctx, "bucket", "empty"); err != nil || n != 0 {
		t.Fatalf("Head of the empty object: %d %v", n, err)
	}
}

// A plain S3 PUT read back by RDMA, a short object into a larger buffer,
// a larger object into a short buffer (206), and chunked GETs (ranges).
func TestPlainAndPartial(t *testing.T) {
	e := setup(t, true, &cuobj.ClientOptions{MaxRequestCallbackSize: 65536})
	ctx := ctxT(t)
	obj := data(200000)
	e.s.mustOK(t, "PUT", "/bucket/plain", obj)
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
	if d := e.g.Stats().Declined.Load(); d != 2 {
		t.Errorf("%d declined", d)
	}
}

func TestProtocolErrors(t *testing.T) {
	e := setup(t, true, nil)
	e.s.mustOK(t, "PUT", "/bucket/o", []byte("x"))
	for _, c := range []struct {
		method, path, token string
		status              int
	}{
		{"GET", "/bucket/o", "garbage", 400},
		{"PUT", "/bucket/o", "garbage", 400},
		{"GET", "/bucket/o", strings.Repeat("0", 81), 400},
		{"GET", "/bucket/nope", "", 404},
		{"PUT", "/nobucket/o", "", 404},
		{"GET", "/nobucket", "", 404},
	} {
		h := map[string]string{}
		if c.token != "" {
			h[s3rdma.HeaderToken] = c.token
		}
		if resp, body := e.s.do(t, c.method, c.path, nil, h); resp.StatusCode != c.status {
			t.Errorf("%s %s token %q: %d, want %d: %s", c.method, c.path, c.token, resp.StatusCode, c.status, body)
		}
	}
	if got := e.s.mustOK(t, "GET", "/bucket/o", nil); string(got) != "x" {
		t.Errorf("the object is now %q", got)
	}
	// A valid token whose client is not there: the transfer fails.
	tok := cuobj.Token{Addr: 0x1000, Size: 1, LID: 9, QPN: 5, HasGID: true, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 2}}
	resp, body := e.s.do(t, "GET", "/bucket/o", nil, map[string]string{s3rdma.HeaderToken: tok.String()})
	if resp.StatusCode/100 != 5 || !strings.Contains(string(body), errTransferFailed) {
		t.Errorf("unreachable client: %d %s", resp.StatusCode, body)
	}
	// An RDMA PUT larger than the server buffers is refused before any
	// allocation.
	big := cuobj.Token{Addr: 0x1000, Size: cuobj.MaxRegSize, LID: 9, QPN: 5, HasGID: true, GID: tok.GID}
	if resp, body := e.s.do(t, "PUT", "/bucket/big", nil, map[string]string{s3rdma.HeaderToken: big.String()}); resp.StatusCode != 400 {
		t.Errorf("4 GiB RDMA PUT: %d %s", resp.StatusCode, body)
	}
	// Listing.
	if body := e.s.mustOK(t, "GET", "/bucket?list-type=2", nil); !strings.Contains(string(body), "<Key>o</Key>") {
		t.Errorf("listing: %s", body)
	}
}

// TestAuth: a wrong secret or no signature at all is 403 and stores
// nothing, by RDMA or not.
func TestAuth(t *testing.T) {
	e := setup(t, true, nil)
	bad := s3rdma.Credentials{AccessKey: creds.AccessKey, SecretKey: "wrong-secret-0123456789abcdefghijklmnopq"}
	wrong := &signer{url: e.url, creds: bad}
	if resp, body := wrong.do(t, "PUT", "/bucket/w1", []byte("data"), nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("PUT with a wrong secret: %d %s", resp.StatusCode, body)
	}
	unknown := &signer{url: e.url, creds: s3rdma.Credentials{AccessKey: "GRNOSUCHKEY000000000", SecretKey: creds.SecretKey}}
	// versitygw says 404 XAdminUserNotFound where S3 says 403.
	if resp, body := unknown.do(t, "PUT", "/bucket/w2", []byte("data"), nil); resp.StatusCode/100 != 4 {
		t.Errorf("PUT with an unknown key: %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest("PUT", e.url+"/bucket/w3", strings.NewReader("data"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("unsigned PUT: %d", resp.StatusCode)
	}
	// An RDMA PUT with a valid token but a wrong secret: refused before
	// the server reaches the client.
	buf := data(4096)
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	tok, err := e.cli.RDMA().GetRDMATokenFor(buf, 4096, 0, cuobj.OpPut, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := wrong.do(t, "PUT", "/bucket/w4", nil, map[string]string{s3rdma.HeaderToken: tok}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("RDMA PUT with a wrong secret: %d %s", resp.StatusCode, body)
	}
	_ = e.cli.RDMA().PutRDMAToken(tok)
	for _, k := range []string{"w1", "w2", "w3", "w4"} {
		if _, err := os.Stat(filepath.Join(e.dir, "bucket", k)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s stored: %v", k, err)
		}
	}
	if st := e.g.Stats(); st.RDMAPuts.Load() != 0 || st.PlainPuts.Load() != 0 {
		t.Errorf("puts done: %d RDMA, %d plain", st.RDMAPuts.Load(), st.PlainPuts.Load())
	}
}

// TestOperations: operations that are not object writes change no
// object's bytes; one the gateway does not know is an error.
func TestOperations(t *testing.T) {
	e := setup(t, false, nil)
	obj := data(5000)
	e.s.mustOK(t, "PUT", "/bucket/o", obj)
	e.s.mustOK(t, "PUT", "/bucket/o?tagging", []byte(`<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>`))
	if b := e.s.mustOK(t, "GET", "/bucket/o?tagging", nil); !strings.Contains(string(b), "<Key>k</Key>") {
		t.Errorf("tags: %s", b)
	}
	// An ACL, supported or not, is no write of the object.
	e.s.do(t, "PUT", "/bucket/o?acl", []byte(`<AccessControlPolicy/>`), map[string]string{"x-amz-acl": "private"})
	e.s.mustOK(t, "PUT", "/bucket/copy", nil)
	if resp, body := e.s.do(t, "PUT", "/bucket/copy", nil, map[string]string{"X-Amz-Copy-Source": "/bucket/o"}); resp.StatusCode != 200 {
		t.Errorf("CopyObject: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/bucket/o"},             // no such operation
		{"POST", "/bucket/o?restore"},     // no archive to restore from
		{"PUT", "/bucket?replication"},    // not implemented
		{"PATCH", "/bucket/o"},            // no such method
		{"PUT", "/bucket/o?x-unknown-op"}, // an unknown query is a plain PUT of an empty body: checked below
	} {
		resp, body := e.s.do(t, c.method, c.path, []byte("junk"), nil)
		t.Logf("%s %s: %d %s", c.method, c.path, resp.StatusCode, firstLine(body))
		if c.path != "/bucket/o?x-unknown-op" && resp.StatusCode/100 == 2 {
			t.Errorf("%s %s: %d", c.method, c.path, resp.StatusCode)
		}
		if c.path == "/bucket/o?x-unknown-op" && resp.StatusCode/100 == 2 {
			obj = []byte("junk") // a PUT it took as such
		}
	}
	if got := e.s.mustOK(t, "GET", "/bucket/o", nil); !bytes.Equal(got, obj) {
		t.Errorf("the object changed: %d bytes", len(got))
	}
	if got := e.s.mustOK(t, "GET", "/bucket/copy", nil); len(got) != 5000 {
		t.Errorf("the copy: %d bytes", len(got))
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

// TestSymlinkOut: a symbolic link in DIR to a file or a directory outside
// it does not serve what is outside.
func TestSymlinkOut(t *testing.T) {
	e := setup(t, false, nil)
	outside := t.TempDir()
	secret := []byte("outside the served directory")
	os.WriteFile(filepath.Join(outside, "secret"), secret, 0o644)
	if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(e.dir, "bucket", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(e.dir, "bucket", "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(e.dir, "linkbucket")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/bucket/link", "/bucket/dirlink/secret", "/linkbucket/secret"} {
		resp, body := e.s.do(t, "GET", p, nil, nil)
		if resp.StatusCode == 200 || bytes.Contains(body, secret) {
			t.Errorf("GET %s: %d %q", p, resp.StatusCode, firstLine(body))
		}
	}
	// Listings do not walk into them.
	if b := e.s.mustOK(t, "GET", "/bucket?list-type=2", nil); bytes.Contains(b, []byte("secret")) {
		t.Errorf("the listing shows what is outside: %s", b)
	}
	// Writes through them land nowhere outside.
	for _, p := range []string{"/bucket/dirlink/new", "/linkbucket/new"} {
		e.s.do(t, "PUT", p, []byte("in"), nil)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Error("a PUT wrote outside the served directory")
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); !bytes.Equal(b, secret) {
		t.Error("the file outside changed")
	}
}

// TestSlowClientsCut: a client that sends its header too slowly, or keeps
// a connection idle, is disconnected.
func TestSlowClientsCut(t *testing.T) {
	dir := t.TempDir()
	_, url := gateway(t, Options{Dir: dir, HeaderTimeout: time.Second, IdleTimeout: time.Second})
	addr := strings.TrimPrefix(url, "http://")
	closed := func(c net.Conn) bool {
		// Generous: the server closes after about a second; a busy
		// machine may take longer, never a minute.
		c.SetReadDeadline(time.Now().Add(60 * time.Second))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		return err == nil || !(errors.As(err, &ne) && ne.Timeout())
	}
	// Half a header, then silence.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /bucket/o HTTP/1.1\r\nHost: x\r\n")
	if !closed(c) {
		t.Error("a half-sent header held the connection for a minute")
	}
	// A whole request, answered, then an idle kept-alive connection.
	d, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	io.WriteString(d, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if !closed(d) {
		t.Error("an idle connection was kept a minute")
	}
	// A client that keeps its connection busy is not cut: the timeouts
	// are per request.
	s := &signer{url: url, creds: creds, http: &http.Client{}}
	s.mustOK(t, "PUT", "/bucket", nil)
	for range 3 {
		s.mustOK(t, "GET", "/bucket?list-type=2", nil)
	}
}

// TestCloseWithUnusedConnection: a connection that never sent a request
// (a client's transport may open one it does not use) does not hold Close
// up: fasthttp counts it as busy for its first 5 s, past Close's grace.
func TestCloseWithUnusedConnection(t *testing.T) {
	g, url := gateway(t, Options{Dir: t.TempDir()})
	s := &signer{url: url, creds: creds, http: &http.Client{}}
	s.mustOK(t, "PUT", "/bucket", nil) // the server is serving
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Wait until the server has accepted it (a fresh connection counts
	// from then on).
	for i := 0; ; i++ {
		if g.fresh.unused() > 0 {
			break
		}
		if i == 2000 {
			t.Fatal("the server never accepted the connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := g.Close(); err != nil { // the cleanup's Close returns nil then
		t.Errorf("Close with an unused connection open: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the unused connection is still open")
	}
}

// TestRDMAUploadPart: the parts of a multipart upload sent by RDMA (a
// token, no body) make the object, byte for byte.
func TestRDMAUploadPart(t *testing.T) {
	e := setup(t, true, nil)
	part1, part2 := data(5<<20), data(70000) // all parts but the last are 5 MiB at least
	b := e.s.mustOK(t, "POST", "/bucket/mp?uploads", nil)
	id := between(string(b), "<UploadId>", "</UploadId>")
	if id == "" {
		t.Fatalf("CreateMultipartUpload: %s", b)
	}
	var etags []string
	for i, p := range [][]byte{part1, part2} {
		if err := e.cli.RDMA().Register(p); err != nil {
			t.Fatal(err)
		}
		tok, err := e.cli.RDMA().GetRDMATokenFor(p, uint64(len(p)), 0, cuobj.OpPut, srvIP)
		if err != nil {
			t.Fatal(err)
		}
		resp, body := e.s.do(t, "PUT", "/bucket/mp?partNumber="+string(rune('1'+i))+"&uploadId="+id, nil, map[string]string{s3rdma.HeaderToken: tok})
		_ = e.cli.RDMA().PutRDMAToken(tok)
		if resp.StatusCode != 200 || resp.Header.Get(s3rdma.HeaderReply) != "200" {
			t.Fatalf("UploadPart %d: %d %q %s", i+1, resp.StatusCode, resp.Header.Get(s3rdma.HeaderReply), body)
		}
		etags = append(etags, resp.Header.Get("ETag"))
	}
	done := "<CompleteMultipartUpload>"
	for i, et := range etags {
		done += "<Part><PartNumber>" + string(rune('1'+i)) + "</PartNumber><ETag>" + et + "</ETag></Part>"
	}
	done += "</CompleteMultipartUpload>"
	e.s.mustOK(t, "POST", "/bucket/mp?uploadId="+id, []byte(done))
	if got := e.s.mustOK(t, "GET", "/bucket/mp", nil); !bytes.Equal(got, append(append([]byte(nil), part1...), part2...)) {
		t.Fatalf("the object of two RDMA parts differs (%d bytes)", len(got))
	}
	if st := e.g.Stats(); st.RDMAPuts.Load() != 2 || st.RDMABytes.Load() != uint64(len(part1)+len(part2)) {
		t.Errorf("%d RDMA puts, %d bytes", st.RDMAPuts.Load(), st.RDMABytes.Load())
	}
}

func between(s, a, b string) string {
	_, s, ok := strings.Cut(s, a)
	if !ok {
		return ""
	}
	s, _, _ = strings.Cut(s, b)
	return s
}

// TestSideCar: with a sidecar directory the metadata lives there, not in
// extended attributes, and the gateway works the same.
func TestSideCar(t *testing.T) {
	dir, side := t.TempDir(), t.TempDir()
	_, url := gateway(t, Options{Dir: dir, SideCarDir: side})
	s := &signer{url: url, creds: creds}
	s.mustOK(t, "PUT", "/bucket", nil)
	s.mustOK(t, "PUT", "/bucket/o", []byte("with a sidecar"))
	s.mustOK(t, "PUT", "/bucket/o?tagging", []byte(`<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>`))
	if b := s.mustOK(t, "GET", "/bucket/o?tagging", nil); !strings.Contains(string(b), "<Value>v</Value>") {
		t.Errorf("tags: %s", b)
	}
	if got := s.mustOK(t, "GET", "/bucket/o", nil); string(got) != "with a sidecar" {
		t.Errorf("object: %q", got)
	}
	ents, _ := os.ReadDir(side)
	if len(ents) == 0 {
		t.Error("nothing in the sidecar directory")
	}
}

// TestTransferFailsMidway: a token that claims more than its client
// granted (its rkey covers the first 4 MiB of 12): the pieces in flight
// past the grant fail with a remote access error, the request with 500,
// and the channel and the budget come back once the rest has drained; the
// next request works.
func TestTransferFailsMidway(t *testing.T) {
	e := setup(t, true, nil)
	ctx := ctxT(t)
	const granted, claimed = 4 << 20, 3 * 4 << 20
	e.s.mustOK(t, "PUT", "/bucket/big", data(claimed))
	reg := data(granted)
	if err := e.cli.RDMA().Register(reg); err != nil {
		t.Fatal(err)
	}
	rs := e.g.be.rdma
	for _, c := range []struct {
		method string
		op     cuobj.OpType
	}{{"PUT", cuobj.OpPut}, {"GET", cuobj.OpGet}} {
		desc, err := e.cli.RDMA().GetRDMATokenFor(reg, granted, 0, c.op, srvIP)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := cuobj.ParseToken(desc)
		if err != nil {
			t.Fatal(err)
		}
		tok.Size = claimed
		resp, body, err := e.s.try(ctx, c.method, "/bucket/big", nil, map[string]string{s3rdma.HeaderToken: tok.String()})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), errTransferFailed) {
			t.Errorf("%s past the grant: %s %s", c.method, resp.Status, body)
		}
		if err := e.cli.RDMA().PutRDMAToken(desc); err != nil {
			t.Error(err)
		}
		if h, ch := rs.HeldBytes(), rs.ChannelsInUse(); h != 0 || ch != 0 {
			t.Errorf("after the failed %s: %d bytes held, %d channels in use", c.method, h, ch)
		}
	}
	if n := e.cli.RDMA().Stats().AccessErrors.Load(); n == 0 {
		t.Error("the client saw no access error")
	}
	// The object is what was there: a failed PUT stores nothing.
	obj := data(claimed)
	buf := make([]byte, claimed)
	copy(buf, obj)
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	if byRDMA, err := e.cli.Put(ctx, "bucket", "big", buf); err != nil || !byRDMA {
		t.Fatalf("Put after the failures: %v %v", byRDMA, err)
	}
	clear(buf)
	if n, byRDMA, err := e.cli.Get(ctx, "bucket", "big", buf); err != nil || !byRDMA || n != claimed || !bytes.Equal(buf, obj) {
		t.Fatalf("Get after the failures: %d %v %v", n, byRDMA, err)
	}
}

// A request of chunkSize or more keeps its registered buffer for the
// next one when it ends clean, never after a failed transfer, and the
// gateway's Close deregisters what it kept.
func TestBufferReuse(t *testing.T) {
	e := setup(t, true, nil)
	ctx := ctxT(t)
	idle := func() []hostBuf {
		e.g.be.idle.mu.Lock()
		defer e.g.be.idle.mu.Unlock()
		return append([]hostBuf(nil), e.g.be.idle.bufs...)
	}
	const size = 2*chunkSize + 3
	a, b := data(size), data(size)
	buf := make([]byte, size)
	if err := e.cli.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	for i, obj := range [][]byte{a, b} {
		copy(buf, obj)
		if byRDMA, err := e.cli.Put(ctx, "bucket", string(rune('a'+i)), buf); err != nil || !byRDMA {
			t.Fatalf("Put: %v %v", byRDMA, err)
		}
	}
	kept := idle()
	if len(kept) != 1 {
		t.Fatalf("%d buffers kept after two PUTs one after the other, want 1", len(kept))
	}
	for i, obj := range [][]byte{a, b} {
		clear(buf)
		if n, byRDMA, err := e.cli.Get(ctx, "bucket", string(rune('a'+i)), buf); err != nil || !byRDMA || n != size || !bytes.Equal(buf, obj) {
			t.Fatalf("Get %d: %d %v %v", i, n, byRDMA, err)
		}
		if k := idle(); len(k) != 1 || k[0].reg != kept[0].reg {
			t.Fatalf("after GET %d: %d buffers kept, not the same one", i, len(k))
		}
	}
	// A GET past its grant fails midway: its buffer is not kept.
	desc, err := e.cli.RDMA().GetRDMATokenFor(buf, 4<<20, 0, cuobj.OpGet, srvIP)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := cuobj.ParseToken(desc)
	if err != nil {
		t.Fatal(err)
	}
	tok.Size = size
	resp, body, err := e.s.try(ctx, "GET", "/bucket/a", nil, map[string]string{s3rdma.HeaderToken: tok.String()})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("GET past the grant: %s %s", resp.Status, body)
	}
	_ = e.cli.RDMA().PutRDMAToken(desc)
	if k := idle(); len(k) != 0 {
		t.Fatalf("%d buffers kept after a failed transfer", len(k))
	}
	if err := e.g.be.rdma.DeregisterBuffer(kept[0].reg); err == nil {
		t.Error("the failed transfer's buffer was still registered")
	}
	clear(buf)
	if n, byRDMA, err := e.cli.Get(ctx, "bucket", "b", buf); err != nil || !byRDMA || n != size || !bytes.Equal(buf, b) {
		t.Fatalf("Get after the failure: %d %v %v", n, byRDMA, err)
	}
	kept = idle()
	if len(kept) != 1 {
		t.Fatalf("%d buffers kept after a clean GET", len(kept))
	}
	if err := e.g.Close(); err != nil {
		t.Fatal(err)
	}
	if k := idle(); len(k) != 0 {
		t.Errorf("%d buffers kept after Close", len(k))
	}
	if err := e.g.be.rdma.DeregisterBuffer(kept[0].reg); err == nil {
		t.Error("Close left the kept buffer registered")
	}
}
