package cuobj

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

// TestGetPut1GiB moves the largest object, MaxOpSize (1 GiB), once each
// way over a memlink pair in one request, one RDMA WRITE and one RDMA
// READ, with the data checked. The client's buffer is a real 1 GiB; the
// server's side is a scatter-gather list of 8 entries that all alias one
// 128 MiB buffer, so the test holds 1.125 GiB, not 2. The GET's object is
// therefore 8 copies of that buffer, each checked in the client's memory;
// the PUT's 8 slices differ, and since the READ's responses land in order
// the server's buffer ends with the last slice, which is checked.
func TestGetPut1GiB(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB: not in -short")
	}
	const (
		size  = MaxOpSize
		part  = 128 << 20
		parts = size / part
	)
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	srv, err := NewServer(sdev, netip.AddrPortFrom(srvIP, 18515), ServerOptions{Telemetry: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	sbuf, err := srv.AllocHostBuffer(part)
	if err != nil {
		t.Fatal(err)
	}
	fillPattern(sbuf, 1)
	sgl := make([][]byte, parts)
	for i := range sgl {
		sgl[i] = sbuf
	}
	sreg, err := srv.RegisterSG(sgl)
	if err != nil {
		t.Fatal(err)
	}
	if sreg.Size() != size {
		t.Fatalf("server buffer of %d bytes", sreg.Size())
	}
	ch, err := srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	req := func(info *RDMAInfo, n int) *Request {
		return &Request{Key: "1GiB", Local: sreg, RemoteAddr: info.Token.Addr, Size: uint64(n), Token: info.Desc, Channel: ch}
	}
	cli, err := NewClient(cdev, Ops{
		Get: func(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
			n, err := srv.HandleGetObject(h.Context(), req(info, len(chunk)))
			return int(n), err
		},
		Put: func(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
			n, err := srv.HandlePutObject(h.Context(), req(info, len(chunk)))
			return int(n), err
		},
	}, ClientOptions{Telemetry: quiet, Config: ptr(DefaultConfig())})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	buf := make([]byte, size)
	if err := cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 120*time.Second)

	start := time.Now()
	n, err := cli.Get(ctx, "user", buf, 0, 0)
	get := time.Since(start)
	if err != nil || n != size {
		t.Fatalf("Get of 1 GiB: %d, %v", n, err)
	}
	for i := range parts {
		if !bytes.Equal(buf[i*part:(i+1)*part], sbuf) {
			t.Fatalf("Get of 1 GiB: slice %d differs", i)
		}
	}
	if cs := cli.Stats().Callbacks.Load(); cs != 1 {
		t.Errorf("%d callbacks, want one request for the whole object", cs)
	}

	for i := range parts {
		fillPattern(buf[i*part:(i+1)*part], uint64(10+i))
	}
	clear(sbuf)
	start = time.Now()
	n, err = cli.Put(ctx, "user", buf, 0, 0)
	put := time.Since(start)
	if err != nil || n != size {
		t.Fatalf("Put of 1 GiB: %d, %v", n, err)
	}
	if !bytes.Equal(sbuf, buf[(parts-1)*part:]) {
		t.Fatal("Put of 1 GiB: the last slice differs")
	}
	t.Logf("1 GiB over memlink: GET %v (%.0f MB/s), PUT %v (%.0f MB/s)", get.Round(time.Millisecond),
		size/get.Seconds()/1e6, put.Round(time.Millisecond), size/put.Seconds()/1e6)
}

// fillPattern is pattern in place: the test allocates nothing beyond its
// two buffers, so the heap never holds garbage of their size.
func fillPattern(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}
