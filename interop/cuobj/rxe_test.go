package cuobj

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	co "github.com/goroce/goroce/cuobj"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

// The plan cuobjpeer.c checks: its buffer starts as fill(i); GET k writes
// get(k, j) for j < getPlan[k].size at getPlan[k].off. PUTs read from
// [0, 1 MiB), which no GET touches.
func fill(i uint64) byte       { return byte(i*131 + (i>>12)*7 + 1) }
func getByte(k, j uint64) byte { return byte(k*29 + j*13 + 5) }

type span struct{ off, size uint64 }

var (
	getPlan = []span{{1<<20 + 17, 1}, {1<<20 + 8192, 4097}, {2 << 20, 1 << 20}}
	putPlan = []span{{100, 1}, {12289, 4097}, {0, 1 << 20}}
)

// peerInfo is what cuobjpeer reports once listening.
type peerInfo struct {
	addr       uint64
	size       uint32
	wkey, rkey uint32
}

func readInfo(ctx context.Context, path string, job interface{ Done() <-chan struct{} }) (peerInfo, error) {
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			var pi peerInfo
			if _, err := fmt.Sscanf(string(b), "addr=%x len=%d wkey=%x rkey=%x", &pi.addr, &pi.size, &pi.wkey, &pi.rkey); err != nil {
				return pi, fmt.Errorf("%s: %q: %v", path, b, err)
			}
			return pi, nil
		}
		select {
		case <-job.Done():
			return peerInfo{}, errors.New("cuobjpeer ended before listening")
		case <-ctx.Done():
			return peerInfo{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestServerOpsOnRxe: a goroce cuObject server GETs into and PUTs from an
// rxe guest's registered memory, over IPv4 and IPv6.
func TestServerOpsOnRxe(t *testing.T) {
	_, g, _, _ := setup(t)
	t.Run("IPv4", func(t *testing.T) { serverOps(t, g.Addr, 20001) })
	t.Run("IPv6", func(t *testing.T) {
		if !g.Addr6.IsValid() {
			t.Skip("lab without IPv6")
		}
		serverOps(t, g.Addr6, 20002)
	})
}

func serverOps(t *testing.T, peer netip.Addr, port uint16) {
	_, g, dev, share := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const endpoint = 0x5a17
	name := "cuobjpeer-" + strconv.Itoa(int(port))
	info, stop := filepath.Join(share, name+".info"), filepath.Join(share, name+".stop")
	os.Remove(info)
	os.Remove(stop)
	job := g.Start(ctx, guestPeer, peer.String(), strconv.Itoa(int(port)), strconv.Itoa(endpoint),
		"/mnt/lab/files/"+name+".info", "/mnt/lab/files/"+name+".stop")
	stopped := false
	defer func() {
		if !stopped {
			os.WriteFile(stop, nil, 0o644)
			job.Wait()
		}
	}()
	pi, err := readInfo(ctx, info, job)
	if err != nil {
		out, errOut, code, _ := job.Wait()
		stopped = true
		t.Fatalf("%v (exit %d)\n%s%s", err, code, out, errOut)
	}
	t.Logf("guest MR: %d bytes at %#x, GET rkey %#x, PUT rkey %#x", pi.size, pi.addr, pi.wkey, pi.rkey)

	srv, err := co.NewServer(dev, netip.AddrPortFrom(netip.IPv4Unspecified(), 18515),
		co.ServerOptions{Telemetry: &co.Telemetry{Writer: testWriter{t}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	local, err := srv.AllocHostBuffer(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := srv.RegisterBuffer(local)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := srv.AllocateChannel()
	if err != nil {
		t.Fatal(err)
	}
	tok := co.Token{Addr: pi.addr, Size: pi.size, RKey: pi.wkey, LID: port, QPN: endpoint, HasGID: true, GID: ib.GID(peer.As16())} // IPv4: mapped, as a client prints it
	getTok := tok.String()
	tok.RKey = pi.rkey
	putTok := tok.String()

	for k, sp := range getPlan {
		loff := uint64(k)*4096 + uint64(k)
		for j := range sp.size {
			local[loff+j] = getByte(uint64(k), j)
		}
		t0 := time.Now()
		n, err := srv.HandleGetObject(ctx, &co.Request{Key: fmt.Sprintf("get%d", k), Local: buf, LocalOffset: loff,
			RemoteAddr: pi.addr + sp.off, Size: sp.size, Token: getTok, Channel: ch})
		if err != nil || n != int64(sp.size) {
			t.Fatalf("GET of %d bytes at +%d: %d, %v", sp.size, sp.off, n, err)
		}
		t.Logf("GET %7d bytes into the guest's MR at +%d: %v", sp.size, sp.off, time.Since(t0).Round(time.Millisecond))
	}
	for _, sp := range putPlan {
		const loff = 7
		for i := range local {
			local[i] = 0xEE
		}
		t0 := time.Now()
		n, err := srv.HandlePutObject(ctx, &co.Request{Key: "put", Local: buf, LocalOffset: loff,
			RemoteAddr: pi.addr + sp.off, Size: sp.size, Token: putTok, Channel: ch})
		if err != nil || n != int64(sp.size) {
			t.Fatalf("PUT of %d bytes at +%d: %d, %v", sp.size, sp.off, n, err)
		}
		d := time.Since(t0)
		want := make([]byte, sp.size)
		for j := range want {
			want[j] = fill(sp.off + uint64(j))
		}
		if got := local[loff : loff+sp.size]; !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			t.Fatalf("PUT of %d bytes at +%d: byte %d is %#x, want %#x", sp.size, sp.off, i, got[i], want[i])
		}
		if local[loff-1] != 0xEE || local[loff+sp.size] != 0xEE {
			t.Fatalf("PUT of %d bytes wrote outside [%d, %d) of the local buffer", sp.size, loff, loff+sp.size)
		}
		t.Logf("PUT %7d bytes from the guest's MR at +%d: %v", sp.size, sp.off, d.Round(time.Millisecond))
	}

	// A range past the token is the server's to refuse: nothing is sent.
	end := pi.addr + uint64(pi.size)
	_, err = srv.HandleGetObject(ctx, &co.Request{Key: "past-token", Local: buf, RemoteAddr: end - 100, Size: 4096, Token: getTok, Channel: ch})
	if !errors.Is(err, syscall.EIO) || !errors.Is(err, co.ErrRange) {
		t.Fatalf("GET past the token: %v, want EIO and ErrRange", err)
	}

	// A token naming another endpoint at the guest's port (a stale one):
	// cuobjpeer refuses the connection, as a cuObject client does.
	stale := co.Token{Addr: pi.addr, Size: pi.size, RKey: pi.wkey, LID: port, QPN: endpoint + 1, HasGID: true, GID: ib.GID(peer.As16())}
	if _, err := srv.HandleGetObject(ctx, &co.Request{Key: "stale", Local: buf, RemoteAddr: pi.addr + 1<<20 + 17, Size: 1, Token: stale.String(), Channel: ch}); !errors.Is(err, syscall.EIO) || !errors.Is(err, co.ErrSubmit) {
		t.Fatalf("GET with a stale token: %v, want EIO and ErrSubmit", err)
	}

	// A forged token claiming 1 MiB more than the guest registered: the
	// server sends, rxe refuses the range with a remote access error.
	forged := co.Token{Addr: pi.addr, Size: pi.size + 1<<20, LID: port, QPN: endpoint, HasGID: true, GID: ib.GID(peer.As16())}
	for _, op := range []struct {
		name   string
		rkey   uint32
		handle func(context.Context, *co.Request) (int64, error)
	}{{"GET", pi.wkey, srv.HandleGetObject}, {"PUT", pi.rkey, srv.HandlePutObject}} {
		forged.RKey = op.rkey
		n, err := op.handle(ctx, &co.Request{Key: "forged", Local: buf, RemoteAddr: end - 100, Size: 4096, Token: forged.String(), Channel: ch})
		st, has := co.CompletionStatus(err)
		if n != 0 || !errors.Is(err, syscall.EIO) || !errors.Is(err, co.ErrCompletion) || !has || st != roce.WCRemAccessErr {
			t.Fatalf("%s past the guest's MR: %d, %v; want EIO with %v", op.name, n, err, roce.WCRemAccessErr)
		}
		t.Logf("%s past the guest's MR: %v", op.name, err)
	}
	// The failed connection was reset; the next request connects again.
	for i := range local {
		local[i] = 0
	}
	if n, err := srv.HandlePutObject(ctx, &co.Request{Key: "after", Local: buf, RemoteAddr: pi.addr + 4095, Size: 2, Token: putTok, Channel: ch}); err != nil || n != 2 ||
		local[0] != fill(4095) || local[1] != fill(4096) {
		t.Fatalf("PUT after the failures: %d, %v, % x", n, err, local[:2])
	}
	st := srv.Stats()
	t.Logf("server: %d GETs (%d bytes), %d PUTs (%d bytes), %d failed, %d resets, %d refused",
		st.Gets.Load(), st.GetBytes.Load(), st.Puts.Load(), st.PutBytes.Load(), st.Failed.Load(), st.Resets.Load(), st.Refused.Load())
	if st.Gets.Load() != 3 || st.Puts.Load() != 4 || st.Failed.Load() != 2 || st.Resets.Load() < 2 || st.Refused.Load() != 2 {
		t.Errorf("server stats do not match the requests")
	}
	if err := srv.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code, err := job.Wait()
	stopped = true
	t.Logf("cuobjpeer:\n%s%s", out, errOut)
	if err != nil || code != 0 || !bytes.Contains(out, []byte("verified")) {
		t.Fatalf("cuobjpeer: exit %d, %v", code, err)
	}
	if !bytes.Contains(out, []byte("accepted 3, rejected 1")) {
		t.Errorf("cuobjpeer accepted other than 3 connections (first, after the GET failure, after the PUT failure) or rejected other than the stale token's")
	}
}
