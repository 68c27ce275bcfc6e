package s3rdma

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// TestSigned: every request the client sends is SigV4-signed with the
// token among the signed headers; an RDMA PUT says UNSIGNED-PAYLOAD. The
// server here declines RDMA (501), so the client falls back to HTTP,
// signing that too.
func TestSigned(t *testing.T) {
	la, _ := memlink.PairWithOptions(memlink.Options{})
	dev, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{netip.MustParseAddr("10.0.0.2")},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	var mu sync.Mutex
	var seen []*http.Request
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		if r.Header.Get(HeaderToken) != "" {
			w.WriteHeader(http.StatusNotImplemented)
			return
		}
		io.Copy(io.Discard, r.Body)
	}))
	defer hs.Close()
	cfg := cuobj.DefaultConfig()
	c, err := NewClient(dev, hs.URL, ClientOptions{Credentials: Credentials{AccessKey: "AK", SecretKey: "SK"},
		RDMA: cuobj.ClientOptions{Config: &cfg, Telemetry: &cuobj.Telemetry{Off: true}, Servers: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := []byte("some object")
	if err := c.RDMA().Register(buf); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if byRDMA, err := c.Put(ctx, "b", "k", buf); err != nil || byRDMA {
		t.Fatalf("Put: %v %v", byRDMA, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("%d requests, want the RDMA PUT and its fallback", len(seen))
	}
	for i, r := range seen {
		auth := r.Header.Get("Authorization")
		if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AK/") || !strings.Contains(auth, "/us-east-1/s3/aws4_request") {
			t.Errorf("request %d: Authorization %q", i, auth)
		}
		_, signed, _ := strings.Cut(auth, "SignedHeaders=")
		signed, _, _ = strings.Cut(signed, ",")
		if i == 0 {
			if !strings.Contains(signed, "x-amz-rdma-token") || !strings.Contains(signed, "x-amz-rdma-agent") {
				t.Errorf("the RDMA PUT signs %q", signed)
			}
			if h := r.Header.Get("X-Amz-Content-Sha256"); h != "UNSIGNED-PAYLOAD" {
				t.Errorf("the RDMA PUT's payload hash %q", h)
			}
		} else if h := r.Header.Get("X-Amz-Content-Sha256"); h == "UNSIGNED-PAYLOAD" || len(h) != 64 {
			t.Errorf("the HTTP PUT's payload hash %q", h)
		}
	}
	// No credentials at all: no client.
	t.Setenv(EnvAccessKey, "")
	t.Setenv(EnvSecretKey, "")
	if _, err := NewClient(dev, hs.URL, ClientOptions{}); err == nil {
		t.Error("a client without credentials")
	}
}

func TestGenerateCredentials(t *testing.T) {
	a, err := GenerateCredentials()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateCredentials()
	if len(a.AccessKey) != 20 || len(a.SecretKey) != 40 || a == b {
		t.Errorf("%+v %+v", a, b)
	}
	if !strings.Contains(a.Exports(), "export AWS_SECRET_ACCESS_KEY="+a.SecretKey+"\n") {
		t.Errorf("exports: %s", a.Exports())
	}
}
