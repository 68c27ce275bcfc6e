package cuobj

import (
	"bytes"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// TestAsyncAndPoll submits GETs and PUTs asynchronously, a synchronous
// request among them, and collects them with Poll (at most 16 at a time).
func TestAsyncAndPoll(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, nil, nil)
	s := r.srv
	ctx := ctxT(t, 30*time.Second)
	cbuf := make([]byte, 40*4096)
	if err := r.cli.Register(cbuf); err != nil {
		t.Fatal(err)
	}
	getTok, _ := r.cli.GetRDMAToken(cbuf, uint64(len(cbuf)), 0, OpGet)
	putTok, _ := r.cli.GetRDMAToken(cbuf, uint64(len(cbuf)), 0, OpPut)
	gt, _ := ParseToken(getTok)
	obj := pattern(len(cbuf), 3)
	copy(r.sbuf, obj)
	ch, _ := s.AllocateChannel()
	const n = 40
	for i := range n {
		off := uint64(i * 4096)
		k, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, LocalOffset: off, RemoteAddr: gt.Addr + off, Size: 4096,
			Token: getTok, Channel: ch, Async: i})
		if k != 0 || err != nil {
			t.Fatalf("async submit %d: %d, %v", i, k, err)
		}
		if i == 20 {
			// A synchronous PUT on the same channel leaves the
			// asynchronous completions it meets for Poll.
			if k, err := s.HandlePutObject(ctx, &Request{Local: r.sreg, LocalOffset: 1 << 19, RemoteAddr: gt.Addr, Size: 1,
				Token: putTok, Channel: ch}); k != 1 || err != nil {
				t.Fatalf("sync PUT among async: %d, %v", k, err)
			}
		}
	}
	seen := map[int]bool{}
	events := make([]AsyncEvent, 32)
	for len(seen) < n {
		k, err := s.PollWait(ctx, ch, events)
		if err != nil {
			t.Fatal(err)
		}
		if k > MaxPollEvents {
			t.Fatalf("Poll returned %d events, cap 16", k)
		}
		for _, ev := range events[:k] {
			if ev.Status != roce.WCSuccess || seen[ev.Handle.(int)] {
				t.Fatalf("event %+v", ev)
			}
			seen[ev.Handle.(int)] = true
		}
	}
	if !bytes.Equal(cbuf, obj) {
		t.Fatal("async GETs: data differs")
	}
	if k, err := s.Poll(ch, events); k != 0 || err != nil {
		t.Fatalf("Poll after all: %d, %v", k, err)
	}
}

// TestCompletionFailures: requests that reach the client and fail there
// report EIO with the completion status, the connection is reset, and the
// channel works again afterwards.
func TestCompletionFailures(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	r := newRig(t, sdev, cdev, 1<<20, nil, nil)
	s := r.srv
	ctx := ctxT(t, 60*time.Second)
	cbuf := make([]byte, 8192)
	if err := r.cli.Register(cbuf); err != nil {
		t.Fatal(err)
	}
	getTok, _ := r.cli.GetRDMAToken(cbuf, 8192, 0, OpGet)
	putTok, _ := r.cli.GetRDMAToken(cbuf, 8192, 0, OpPut)
	gt, _ := ParseToken(getTok)
	ch, _ := s.AllocateChannel()
	good := func() {
		t.Helper()
		if n, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 8192, Token: getTok, Channel: ch}); n != 8192 || err != nil {
			t.Fatalf("GET after a failure: %d, %v", n, err)
		}
	}
	good()
	forged := gt
	forged.RKey ^= 0x100
	cases := []struct {
		name   string
		put    bool
		tok    string
		status roce.WCStatus
	}{
		// A GET token's rkey allows WRITE only, a PUT token's READ only.
		{"READ with a GET token", true, getTok, roce.WCRemAccessErr},
		{"WRITE with a PUT token", false, putTok, roce.WCRemAccessErr},
		{"forged rkey", false, forged.String(), roce.WCRemAccessErr},
	}
	for _, c := range cases {
		h := s.HandleGetObject
		if c.put {
			h = s.HandlePutObject
		}
		n, err := h(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 8192, Token: c.tok, Channel: ch})
		st, has := CompletionStatus(err)
		if n != 0 || !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrCompletion) || !has || st != c.status {
			t.Errorf("%s: %d, %v (status %v %v), want EIO with %v", c.name, n, err, st, has, StatusName(c.status))
		}
		good()
	}
	// Asynchronous failure: Poll returns EIO with the status filled in.
	if _, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 8192, Token: putTok, Channel: ch, Async: "bad"}); err != nil {
		t.Fatal(err)
	}
	ev := make([]AsyncEvent, 16)
	n, err := s.PollWait(ctx, ch, ev)
	if n != 1 || !errors.Is(err, syscall.EIO) || ev[0].Handle != "bad" || ev[0].Status != roce.WCRemAccessErr {
		t.Fatalf("Poll of a failed request: %d, %v, %+v", n, err, ev[0])
	}
	good()
	if s.Stats().Resets.Load() < 4 {
		t.Errorf("%d resets, want one per failure", s.Stats().Resets.Load())
	}
	// A stale token: the client at that address and port is another one.
	stale := gt
	stale.QPN = gt.QPN ^ 1
	ch2, _ := s.AllocateChannel()
	n2, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 1, Token: stale.String(), Channel: ch2})
	if n2 != 0 || !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrSubmit) {
		t.Fatalf("stale token: %d, %v", n2, err)
	}
	if r.cli.Stats().Refused.Load() != 1 {
		t.Errorf("client refused %d connections, want 1", r.cli.Stats().Refused.Load())
	}
	// Deregistered client memory: remote access error, nothing written.
	if err := r.cli.Deregister(cbuf); err != nil {
		t.Fatal(err)
	}
	clear(cbuf)
	for i := range 8192 {
		r.sbuf[i] = 0xAA
	}
	n2, err = s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 8192, Token: getTok, Channel: ch})
	if st, _ := CompletionStatus(err); n2 != 0 || st != roce.WCRemAccessErr {
		t.Fatalf("GET into deregistered memory: %d, %v", n2, err)
	}
	if bytes.IndexByte(cbuf, 0xAA) >= 0 {
		t.Fatal("data written into deregistered memory")
	}
}

// TestResetOff: without qp_reset_on_failure the connection stays in the
// error state and later requests to that client on the channel fail.
func TestResetOff(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	tn := tun(func(t *Tunables) { t.QPResetOnFailure = false })
	r := newRig(t, sdev, cdev, 1<<20, nil, &tn)
	s := r.srv
	ctx := ctxT(t, 30*time.Second)
	cbuf := make([]byte, 4096)
	r.cli.Register(cbuf)
	getTok, _ := r.cli.GetRDMAToken(cbuf, 4096, 0, OpGet)
	putTok, _ := r.cli.GetRDMAToken(cbuf, 4096, 0, OpPut)
	gt, _ := ParseToken(getTok)
	ch, _ := s.AllocateChannel()
	if _, err := s.HandlePutObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 1, Token: getTok, Channel: ch}); !errors.Is(err, syscall.EIO) {
		t.Fatal(err)
	}
	_, err := s.HandlePutObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 1, Token: putTok, Channel: ch})
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("request on an errored QP without reset: %v", err)
	}
	if s.Stats().Resets.Load() != 0 {
		t.Fatal("reset with QPResetOnFailure off")
	}
}

// TestPeerVanishes: the client's device goes away; the request ends with
// a retry or flush status within the transport timeout, no hang.
func TestPeerVanishes(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	tn := tun(func(t *Tunables) { t.Timeout = 10; t.RetryCount = 2 })
	r := newRig(t, sdev, cdev, 1<<20, nil, &tn)
	s := r.srv
	ctx := ctxT(t, 60*time.Second)
	cbuf := make([]byte, 1<<20)
	r.cli.Register(cbuf)
	getTok, _ := r.cli.GetRDMAToken(cbuf, 1<<20, 0, OpGet)
	gt, _ := ParseToken(getTok)
	ch, _ := s.AllocateChannel()
	if _, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 1 << 20, Token: getTok, Channel: ch}); err != nil {
		t.Fatal(err)
	}
	cdev.Close()
	start := time.Now()
	_, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 1 << 20, Token: getTok, Channel: ch})
	st, has := CompletionStatus(err)
	if !errors.Is(err, syscall.EIO) || (has && st != roce.WCRetryExcErr && st != roce.WCWRFlushErr) {
		t.Fatalf("GET to a vanished client: %v", err)
	}
	t.Logf("failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	// The server is still usable.
	if !s.IsConnected() {
		t.Fatal("server not connected")
	}
	_ = netip.Addr{}
}

// TestDeregisterDuringTransfer: the client deregisters its memory while
// large asynchronous GETs and PUTs run into it: each ends with success or
// a remote access error, nothing panics, and the channel serves the next
// registration.
func TestDeregisterDuringTransfer(t *testing.T) {
	sdev, cdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	const size = 16 << 20
	r := newRig(t, sdev, cdev, size, nil, nil)
	s := r.srv
	ctx := ctxT(t, 60*time.Second)
	ch, _ := s.AllocateChannel()
	for round := range 3 {
		cbuf := make([]byte, size)
		if err := r.cli.Register(cbuf); err != nil {
			t.Fatal(err)
		}
		getTok, _ := r.cli.GetRDMAToken(cbuf, size, 0, OpGet)
		putTok, _ := r.cli.GetRDMAToken(cbuf, size, 0, OpPut)
		gt, _ := ParseToken(getTok)
		for i := range 4 {
			tok, h := getTok, s.HandleGetObject
			if i%2 == 1 {
				tok, h = putTok, s.HandlePutObject
			}
			if _, err := h(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: size, Token: tok, Channel: ch, Async: i}); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.cli.Deregister(cbuf); err != nil {
			t.Fatal(err)
		}
		got := 0
		ev := make([]AsyncEvent, 16)
		for got < 4 {
			n, err := s.PollWait(ctx, ch, ev)
			for _, e := range ev[:n] {
				if e.Status != roce.WCSuccess && e.Status != roce.WCRemAccessErr && e.Status != roce.WCWRFlushErr {
					t.Fatalf("round %d: status %v", round, StatusName(e.Status))
				}
			}
			if n == 0 && err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	// A fresh registration works on the same channel.
	cbuf := make([]byte, 4096)
	r.cli.Register(cbuf)
	tok, _ := r.cli.GetRDMAToken(cbuf, 4096, 0, OpGet)
	gt, _ := ParseToken(tok)
	if n, err := s.HandleGetObject(ctx, &Request{Local: r.sreg, RemoteAddr: gt.Addr, Size: 4096, Token: tok, Channel: ch}); n != 4096 || err != nil {
		t.Fatalf("after the deregistrations: %d, %v", n, err)
	}
}
