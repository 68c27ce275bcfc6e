package cuobj

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
)

func TestClientFailures(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, nil, nil)
	c := r.cli
	if !c.IsConnected() {
		t.Fatal("not connected")
	}
	buf := make([]byte, 1<<16)
	// cuMemObjGetDescriptor failure cases.
	regCases := []struct {
		name string
		buf  []byte
		typ  MemoryType
		want error
	}{
		{"nil", nil, MemorySystem, ErrInvalid},
		{"size 0", buf[:0], MemorySystem, ErrInvalid},
		{"CUDA device", buf, MemoryCUDADevice, ErrUnsupported},
		{"CUDA managed", buf, MemoryCUDAManaged, ErrUnsupported},
		{"unknown type", buf, MemoryUnknown, ErrUnsupported},
	}
	for _, rc := range regCases {
		if err := c.RegisterMemory(rc.buf, rc.typ); !errors.Is(err, rc.want) {
			t.Errorf("Register %s: %v, want %v", rc.name, err, rc.want)
		}
	}
	if err := c.RegisterMemory(buf, MemoryCUDADevice); !errors.Is(err, syscall.ENOTSUP) {
		t.Errorf("CUDA: %v", err)
	}
	if MemoryTypeOf(nil) != MemoryInvalid || MemoryTypeOf(buf) != MemorySystem {
		t.Error("MemoryTypeOf")
	}
	// The size limit, checked on address space with no memory behind it.
	if err := c.Register(reserve(t, MaxRegSize+1)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Register of 4 GiB − 64 KiB + 1: %v", err)
	}
	if c.MaxRequestCallbackSize(buf) != -1 || c.MaxRequestCallbackSize(nil) != -1 {
		t.Error("MaxRequestCallbackSize of unregistered memory is not -1")
	}
	if err := c.Register(buf); err != nil {
		t.Fatal(err)
	}
	if err := c.Register(buf[100:200]); !errors.Is(err, ErrInvalid) {
		t.Errorf("overlapping registration: %v", err)
	}
	if got := c.MaxRequestCallbackSize(buf); got != 1<<16 {
		t.Errorf("MaxRequestCallbackSize = %d", got)
	}
	if got := c.MaxRequestCallbackSize(buf[1000:]); got != 1<<16-1000 {
		t.Errorf("MaxRequestCallbackSize inside = %d", got)
	}
	// cuMemObjGetRDMAToken failure cases.
	tokCases := []struct {
		name         string
		buf          []byte
		size, offset uint64
		op           OpType
		want         error
	}{
		{"invalid op", buf, 10, 0, OpInvalid, ErrInvalid},
		{"op 2", buf, 10, 0, OpType(2), ErrInvalid},
		{"unregistered", make([]byte, 10), 10, 0, OpGet, ErrNotRegistered},
		{"not the start", buf[1:], 10, 0, OpGet, ErrNotRegistered},
		{"nil", nil, 10, 0, OpGet, ErrInvalid},
		{"size 0", buf, 0, 0, OpGet, ErrRange},
		{"past the end", buf, 1 << 16, 1, OpPut, ErrRange},
		{"offset past the end", buf, 1, 1<<16 + 1, OpPut, ErrRange},
		{"overflow", buf, ^uint64(0), 2, OpPut, ErrRange},
	}
	for _, tc := range tokCases {
		if s, err := c.GetRDMAToken(tc.buf, tc.size, tc.offset, tc.op); !errors.Is(err, tc.want) || s != "" {
			t.Errorf("GetRDMAToken %s: %q, %v; want %v", tc.name, s, err, tc.want)
		}
	}
	desc, err := c.GetRDMAToken(buf, 4096, 1024, OpGet)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ParseToken(desc)
	if err != nil || tok.Addr != uint64(uintptrOf(buf))+1024 || tok.Size != 4096 || tok.LID != c.Addr().Port() ||
		tok.QPN != c.Endpoint() || !tok.HasGID {
		t.Fatalf("token %+v, %v", tok, err)
	}
	if err := c.PutRDMAToken(desc); err != nil {
		t.Fatal(err)
	}
	if err := c.PutRDMAToken(desc); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutRDMAToken twice: %v", err)
	}
	if err := c.PutRDMAToken("nonsense"); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutRDMAToken of a foreign string: %v", err)
	}
	// cuObjGet/cuObjPut pre-submission failures: no callback runs.
	ctx := ctxT(t, 10*time.Second)
	ioCases := []struct {
		name        string
		user        any
		buf         []byte
		off, bufOff int64
		want        error
	}{
		{"nil ctx", nil, buf, 0, 0, ErrInvalid},
		{"nil buffer", "u", nil, 0, 0, ErrInvalid},
		{"size 0", "u", buf[:0], 0, 0, ErrInvalid},
		{"negative offset", "u", buf, -1, 0, ErrInvalid},
		{"negative buffer offset", "u", buf, 0, -1, ErrInvalid},
		{"buffer offset past the end", "u", buf, 0, 1 << 16, ErrInvalid},
		{"unregistered", "u", make([]byte, 10), 0, 0, ErrNotRegistered},
		{"partly registered", "u", append(buf[1<<16-1:], 0), 0, 0, ErrNotRegistered},
	}
	before := c.Stats().Callbacks.Load()
	for _, ic := range ioCases {
		for _, f := range []func(context.Context, any, []byte, int64, int64) (int64, error){c.Get, c.Put} {
			if n, err := f(ctx, ic.user, ic.buf, ic.off, ic.bufOff); n != 0 || !errors.Is(err, ic.want) {
				t.Errorf("%s: %d, %v; want %v", ic.name, n, err, ic.want)
			}
		}
	}
	if c.Stats().Callbacks.Load() != before {
		t.Error("a callback ran for an invalid request")
	}
	// Missing callback.
	c2, err := NewClient(cdev, Ops{}, ClientOptions{Telemetry: quiet, Config: ptr(DefaultConfig())})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	b2 := make([]byte, 10)
	c2.Register(b2)
	if _, err := c2.Get(ctx, "u", b2, 0, 0); !errors.Is(err, ErrNoCallback) {
		t.Errorf("no GET callback: %v", err)
	}
	// Deregister.
	if err := c.Deregister(nil); err != nil {
		t.Errorf("Deregister(nil): %v", err)
	}
	if err := c.Deregister(buf[1:]); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("Deregister not at the start: %v", err)
	}
	if err := c.Deregister(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(cdev, Ops{}, ClientOptions{Proto: 7, Telemetry: quiet}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("protocol 7 client: %v", err)
	}
	c.Close()
	if c.IsConnected() {
		t.Error("connected after Close")
	}
	if GetCtx(nil) != nil {
		t.Error("GetCtx(nil)")
	}
}

// TestChunksAndCallbacks: requests larger than the callback size are cut
// into chunks, each callback runs on another goroutine with the user's
// context and its own token, and the data is right.
func TestChunksAndCallbacks(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, &ClientOptions{MaxRequestCallbackSize: 100000, Parallel: 3}, nil)
	var mu sync.Mutex
	var chunks []string
	type key struct{}
	r.hook = func(h *Handle, info *RDMAInfo) error {
		if GetCtx(h) != "user" || h.Context().Value(key{}) != "v" {
			return fmt.Errorf("callback context %v %v", GetCtx(h), h.Context().Value(key{}))
		}
		mu.Lock()
		chunks = append(chunks, fmt.Sprintf("%d@%x", info.Token.Size, info.Token.Addr))
		mu.Unlock()
		return nil
	}
	ctx := context.WithValue(ctxT(t, 30*time.Second), key{}, "v")
	const size = 1<<20 - 3
	r.object = pattern(size, 9)
	buf := make([]byte, size)
	r.cli.Register(buf)
	if got := r.cli.MaxRequestCallbackSize(buf); got != 100000 {
		t.Fatalf("callback size %d", got)
	}
	n, err := r.cli.Get(ctx, "user", buf, 0, 0)
	if err != nil || n != size || !bytes.Equal(buf, r.object) {
		t.Fatalf("chunked Get: %d, %v", n, err)
	}
	if len(chunks) != 11 {
		t.Fatalf("%d callbacks, want 11: %v", len(chunks), chunks)
	}
	// A buffer offset starts the request inside the buffer.
	clear(buf)
	if n, err := r.cli.Get(ctx, "user", buf, 0, 4096); err != nil || n != size-4096 || !bytes.Equal(buf[4096:], r.object[:size-4096]) {
		t.Fatalf("Get with buffer offset: %d, %v", n, err)
	}
}

// TestRetries: retryable callback errors are retried up to
// rdma_io_retry_count times, others are not.
func TestRetries(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	cfg := DefaultConfig()
	cfg.Properties.IORetryCount, cfg.Properties.IORetryDelayMS = 3, 1
	r := newRig(t, sdev, cdev, 1<<16, &ClientOptions{Config: &cfg}, nil)
	ctx := ctxT(t, 30*time.Second)
	buf := make([]byte, 4096)
	r.cli.Register(buf)
	r.object = pattern(4096, 1)
	for _, errno := range RetryableErrnos {
		var calls atomic.Int32
		r.hook = func(*Handle, *RDMAInfo) error {
			if calls.Add(1) <= 2 {
				return errno
			}
			return nil
		}
		if n, err := r.cli.Get(ctx, "u", buf, 0, 0); err != nil || n != 4096 || calls.Load() != 3 {
			t.Errorf("%v twice then success: %d, %v after %d calls", errno, n, err, calls.Load())
		}
	}
	for _, c := range []struct {
		err   error
		calls int32
	}{
		{syscall.ETIMEDOUT, 4},                      // 1 + 3 retries
		{fmt.Errorf("wrapped: %w", syscall.EIO), 4}, // wrapped errno
		{syscall.ENOTSUP, 1},                        // never retried
		{syscall.ENOENT, 1},                         // not in the list
		{errors.New("no errno"), 1},
	} {
		var calls atomic.Int32
		r.hook = func(*Handle, *RDMAInfo) error { calls.Add(1); return c.err }
		_, err := r.cli.Get(ctx, "u", buf, 0, 0)
		if err == nil || calls.Load() != c.calls || !errors.Is(err, c.err) {
			t.Errorf("%v: %v after %d calls, want %d", c.err, err, calls.Load(), c.calls)
		}
	}
	var calls atomic.Int32
	r.hook = func(*Handle, *RDMAInfo) error { calls.Add(1); return syscall.ENOTSUP }
	if _, err := r.cli.Put(ctx, "u", buf, 0, 0); !errors.Is(err, syscall.ENOTSUP) || calls.Load() != 1 {
		t.Errorf("Put ENOTSUP: %v", err)
	}
}

// TestManyChannels: 128 channels GET and PUT in parallel, each its own
// connection to the client, data checked.
func TestManyChannels(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const chans, size = 128, 16384
	// 128 connection setups at once on a loaded test machine may take
	// longer than the default connect timeout, which is not under test.
	tun := DefaultTunables()
	tun.ConnectTimeout = time.Minute
	r := newRig(t, sdev, cdev, chans*size, nil, &tun)
	manyChannels(t, r, chans, size)
	// The client counts a connection when its accept returns, which may
	// be after the server's first request on it completed.
	deadline := time.Now().Add(10 * time.Second)
	for r.cli.Stats().Connections.Load() < chans && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := r.cli.Stats().Connections.Load(); got != chans {
		t.Errorf("%d connections, want one per channel", got)
	}
}

// TestLossyPath: GET and PUT over a path that drops, duplicates and
// reorders packets both ways.
func TestLossyPath(t *testing.T) {
	imp := func(seed uint64) faultnet.Config {
		return faultnet.Config{Seed: seed, Loss: 0.02, Duplicate: 0.01, Reorder: 0.02}
	}
	sdev, cdev := memDevices(t, imp(1), imp(2))
	tn := tun(func(t *Tunables) { t.Timeout = 8 }) // ~1 ms: recover quickly
	r := newRig(t, sdev, cdev, 4<<20, nil, &tn)
	ctx := ctxT(t, 120*time.Second)
	for i, size := range []int{1, 4096, 100000, 1 << 20} {
		r.roundTrip(ctx, size, uint64(100+i))
	}
}

// manyChannels allocates every channel of r's server and runs GETs and
// PUTs on all of them in parallel, each channel on its own slice of one
// registered client buffer; the data is checked both ways and one channel
// more than chans is refused.
func manyChannels(t *testing.T, r *rig, chans int, size uint64) {
	t.Helper()
	s := r.srv
	ctx := ctxT(t, 120*time.Second)
	cbuf := make([]byte, uint64(chans)*size)
	if err := r.cli.Register(cbuf); err != nil {
		t.Fatal(err)
	}
	getTok, _ := r.cli.GetRDMAToken(cbuf, uint64(len(cbuf)), 0, OpGet)
	putTok, _ := r.cli.GetRDMAToken(cbuf, uint64(len(cbuf)), 0, OpPut)
	gt, _ := ParseToken(getTok)
	want := pattern(len(cbuf), 5)
	copy(r.sbuf, want)
	var wg sync.WaitGroup
	errs := make(chan error, chans)
	for range chans {
		ch, err := s.AllocateChannel()
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := uint64(ch) * size
			for i := range 4 {
				if _, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, LocalOffset: off, RemoteAddr: gt.Addr + off, Size: size, Token: getTok, Channel: ch}); err != nil {
					errs <- fmt.Errorf("channel %d GET %d: %w", ch, i, err)
					return
				}
				if _, err := s.HandlePutObject(ctx, &Request{Local: r.sreg, LocalOffset: off, RemoteAddr: gt.Addr + off, Size: size, Token: putTok, Channel: ch}); err != nil {
					errs <- fmt.Errorf("channel %d PUT %d: %w", ch, i, err)
					return
				}
			}
		}()
	}
	if _, err := s.AllocateChannel(); !errors.Is(err, ErrNoChannel) {
		t.Errorf("129th channel: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if !bytes.Equal(cbuf, want) || !bytes.Equal(r.sbuf, want) {
		t.Fatal("data differs")
	}
}
