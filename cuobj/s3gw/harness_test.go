package s3gw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/cuobj/s3rdma"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	srvIP = netip.MustParseAddr("10.0.0.1")
	cliIP = netip.MustParseAddr("10.0.0.2")
	quiet = &cuobj.Telemetry{Off: true}
	// The test account.
	creds = s3rdma.Credentials{AccessKey: "GRTESTACCESSKEY00001", SecretKey: "test-secret-key-0123456789abcdefghijklmn"}
)

// devices opens a server and a client device on a memlink pair; extra
// addresses are neighbours of the server on the client's link.
func devices(t testing.TB, extra ...netip.Addr) (*roce.Device, *roce.Device) {
	macA, macB := net.HardwareAddr{2, 0, 0, 0, 0, 0xa}, net.HardwareAddr{2, 0, 0, 0, 0, 0xb}
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	lg := slog.New(slog.NewTextHandler(io.Discard, nil))
	nb := map[netip.Addr]net.HardwareAddr{cliIP: macB}
	for _, a := range extra {
		nb[a] = macB
	}
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{srvIP}, Neighbours: nb, Logger: lg})
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

// gateway serves dir on loopback until the test ends; url is its
// endpoint.
func gateway(t testing.TB, o Options) (*Gateway, string) {
	if o.AccessKey == "" {
		o.AccessKey, o.SecretKey = creds.AccessKey, creds.SecretKey
	}
	g, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		g.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Serve(ln) }()
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return g, "http://" + ln.Addr().String()
}

// signer signs requests of the test harness as a client would.
type signer struct {
	url   string
	creds s3rdma.Credentials
	http  *http.Client
}

func (s *signer) client() *http.Client {
	if s.http != nil {
		return s.http
	}
	return http.DefaultClient
}

// do sends a signed request and returns its status and body.
func (s *signer) do(t testing.TB, method, path string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	resp, b, err := s.try(context.Background(), method, path, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (s *signer) try(ctx context.Context, method, path string, body []byte, hdr map[string]string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	sum := sha256.Sum256(body)
	h := hex.EncodeToString(sum[:])
	req.Header.Set("X-Amz-Content-Sha256", h)
	sg := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	if err := sg.SignHTTP(ctx, aws.Credentials{AccessKeyID: s.creds.AccessKey, SecretAccessKey: s.creds.SecretKey},
		req, h, "s3", DefaultRegion, time.Now()); err != nil {
		return nil, nil, err
	}
	resp, err := s.client().Do(req)
	if err != nil {
		return nil, nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b, nil
}

func (s *signer) mustOK(t testing.TB, method, path string, body []byte) []byte {
	t.Helper()
	resp, b := s.do(t, method, path, body, nil)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return b
}

func data(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
