package mw

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// The guest's buffer: mrLen bytes of fill(i), registered with MW_BIND and
// no remote access; windows cover [wOff, wOff+wLen) of it. goroce's
// window covers the same offsets of its own buffer.
const (
	mrLen = 64 << 10
	wOff  = 16 << 10
	wLen  = 16 << 10
	// ibv_wc_status values the guest reports.
	ibvSuccess      = 0
	ibvRemAccessErr = 10
)

func fill(i uint64) byte                 { return byte(i*131 + (i>>12)*7 + 1) }
func pattern(seed uint64, j uint64) byte { return byte(seed*29 + j*13 + 5) }

// peer drives mwpeer through the guest's share.
type peer struct {
	tb   testing.TB
	dir  string // host path of the step directory
	k    int
	job  *rxelab.Job
	addr uint64 // the guest buffer's address
}

// step hands the guest its next step and returns the outcome: the
// ibv_wc_status (or -errno), the rkey a bind made, and what a read or
// dump got.
func (p *peer) step(ctx context.Context, format string, args ...any) (int, uint32, []byte) {
	p.tb.Helper()
	p.k++
	name := filepath.Join(p.dir, "step."+strconv.Itoa(p.k))
	if err := os.WriteFile(name+".tmp", []byte(fmt.Sprintf(format, args...)+"\n"), 0o644); err != nil {
		p.tb.Fatal(err)
	}
	if err := os.Rename(name+".tmp", name); err != nil {
		p.tb.Fatal(err)
	}
	res := filepath.Join(p.dir, "res."+strconv.Itoa(p.k))
	for {
		b, err := os.ReadFile(res)
		if err == nil {
			var st int
			var rkey uint32
			if _, err := fmt.Sscanf(string(b), "status=%d rkey=%x", &st, &rkey); err != nil {
				p.tb.Fatalf("step %d: %q: %v", p.k, b, err)
			}
			data, _ := os.ReadFile(filepath.Join(p.dir, "data."+strconv.Itoa(p.k)))
			return st, rkey, data
		}
		select {
		case <-p.job.Done():
			out, errOut, code, err := p.job.Wait()
			p.tb.Fatalf("step %d (%s): mwpeer ended: exit %d, %v\n%s%s", p.k, fmt.Sprintf(format, args...), code, err, out, errOut)
		case <-ctx.Done():
			p.tb.Fatalf("step %d (%s): %v", p.k, fmt.Sprintf(format, args...), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// goroce is the host side: a device on the lab's host interface, a PD,
// and the connections to the guest, dialled in order (the guest numbers
// them 1, 2, ...).
type goroce struct {
	tb   testing.TB
	dev  *roce.Device
	pd   *roce.PD
	to   netip.AddrPort
	conn []*cm.Conn
}

// dial makes the next connection and returns its number on the guest.
func (h *goroce) dial(ctx context.Context) (int, *cm.Conn) {
	h.tb.Helper()
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := cm.Dial(dctx, h.dev, h.to, cm.DialOptions{
		QP: cm.QPOptions{PD: h.pd, Cap: roce.QPCap{MaxSendWR: 8, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
			Access: roce.AccessRemoteRead | roce.AccessRemoteWrite},
		InitiatorDepth: 4, ResponderResources: 4})
	if err != nil {
		h.tb.Fatalf("dial %v: %v", h.to, err)
	}
	h.tb.Cleanup(func() { c.Close() })
	h.conn = append(h.conn, c)
	return len(h.conn), c
}

// run posts wr on c, signalled, and returns its completion's status.
func run(ctx context.Context, tb testing.TB, c *cm.Conn, wr *roce.SendWR) roce.WCStatus {
	tb.Helper()
	wr.Flags |= roce.SendSignaled
	if err := c.QP().PostSend(wr); err != nil {
		tb.Fatalf("post %v: %v", wr.Opcode, err)
	}
	var wc [1]roce.WorkCompletion
	for {
		if c.SendCQ().Poll(wc[:]) == 1 {
			return wc[0].Status
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := c.SendCQ().Wait(wctx)
		cancel()
		if err != nil {
			tb.Fatalf("%v: no completion: %v", wr.Opcode, err)
		}
	}
}

func rdma(op roce.WROpcode, mr *roce.MR, off uint64, n uint32, raddr uint64, rkey uint32) *roce.SendWR {
	return &roce.SendWR{Opcode: op, SGL: []roce.SGE{{Addr: mr.Addr() + off, Length: n, LKey: mr.LKey()}}, RemoteAddr: raddr, RKey: rkey}
}

func want(tb testing.TB, what string, got, exp roce.WCStatus) {
	tb.Helper()
	if got != exp {
		tb.Fatalf("%s: %v, want %v", what, got, exp)
	}
	tb.Logf("%s: %v", what, got)
}

func wantGuest(tb testing.TB, what string, got, exp int) {
	tb.Helper()
	if got != exp {
		tb.Fatalf("%s: guest status %d, want %d", what, got, exp)
	}
	tb.Logf("%s: guest status %d", what, got)
}

// TestWindowsOnRxe: type 2 windows, rxe's used by goroce and goroce's used
// by rxe (see the package documentation).
func TestWindowsOnRxe(t *testing.T) {
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/rdma/rdma_cma.h"} {
		if _, err := os.Stat(h); err != nil {
			t.Skipf("needs libibverbs-dev and librdmacm-dev on the host to build cpeer/mwpeer.c (%s)", h)
		}
	}
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	attempt := 0
	lab.Case(t, rxelab.CaseOptions{Timeout: 10 * time.Minute}, func(ctx context.Context, tb testing.TB) {
		attempt++
		windows(ctx, tb, lab, g, 20100+uint16(attempt))
	})
}

func windows(ctx context.Context, tb testing.TB, lab *rxelab.Lab, g *rxelab.Guest, port uint16) {
	share, err := g.Share(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if b, err := exec.Command("cc", "-O2", "-Wall", "-o", filepath.Join(share, "mwpeer"),
		"cpeer/mwpeer.c", "-libverbs", "-lrdmacm").CombinedOutput(); err != nil {
		tb.Fatalf("building mwpeer: %v\n%s", err, b)
	}
	name := "mw-" + strconv.Itoa(int(port))
	dir := filepath.Join(share, name)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var dev *roce.Device
	if err := lab.InPeerNS(func() error {
		var err error
		dev, err = netdev.Open(ctx, lab.PeerIf, netdev.Options{Link: netdev.LinkXDP, Device: roce.Options{Logger: logger}})
		return err
	}); err != nil {
		tb.Fatalf("goroce on %s: %v", lab.PeerIf, err)
	}
	tb.Cleanup(func() { dev.Close() })
	pd, err := dev.AllocPD()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pd.Close() })

	job := g.Start(ctx, "/mnt/lab/files/mwpeer", g.Addr.String(), strconv.Itoa(int(port)), "/mnt/lab/files/"+name)
	p := &peer{tb: tb, dir: dir, job: job}
	stopped := false
	tb.Cleanup(func() {
		if !stopped {
			// The case failed: tell mwpeer to stop (it also ends with
			// the case's context).
			name := filepath.Join(dir, "step."+strconv.Itoa(p.k+1))
			os.WriteFile(name+".tmp", []byte("stop\n"), 0o644)
			os.Rename(name+".tmp", name)
		}
		out, errOut, code, err := job.Wait()
		tb.Logf("mwpeer (exit %d):\n%s%s", code, out, errOut)
		if err != nil || code != 0 {
			tb.Errorf("mwpeer: exit %d, %v", code, err)
		}
	})
	for {
		b, err := os.ReadFile(filepath.Join(dir, "info"))
		if err == nil {
			var n int
			if _, err := fmt.Sscanf(string(b), "addr=%x len=%d", &p.addr, &n); err != nil || n != mrLen {
				tb.Fatalf("info %q: %v", b, err)
			}
			break
		}
		select {
		case <-job.Done():
			out, errOut, code, err := job.Wait()
			tb.Fatalf("mwpeer ended before listening: exit %d, %v\n%s%s", code, err, out, errOut)
		case <-ctx.Done():
			tb.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	h := &goroce{tb: tb, dev: dev, pd: pd, to: netip.AddrPortFrom(g.Addr, port)}
	scratchBuf := make([]byte, 64<<10)
	scratch, err := pd.RegisterMR(scratchBuf, roce.AccessLocalWrite)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { scratch.Close() })
	win := p.addr + wOff

	// rxe's windows, goroce the requester.
	c, c1 := h.dial(ctx)
	st, rk1, _ := p.step(ctx, "bind %d %x %x", c, wOff, wLen)
	wantGuest(tb, "guest binds a type 2 window", st, ibvSuccess)
	want(tb, "READ through rxe's window", run(ctx, tb, c1, rdma(roce.WRRDMARead, scratch, 0, wLen, win, rk1)), roce.WCSuccess)
	scratch.Sync()
	for j := range uint64(wLen) {
		if scratchBuf[j] != fill(wOff+j) {
			tb.Fatalf("READ through rxe's window: byte %d is %#x, want %#x", j, scratchBuf[j], fill(wOff+j))
		}
	}
	for j := range uint64(wLen) {
		scratchBuf[j] = pattern(1, j)
	}
	scratch.Sync()
	want(tb, "WRITE through rxe's window", run(ctx, tb, c1, rdma(roce.WRRDMAWrite, scratch, 0, wLen, win, rk1)), roce.WCSuccess)
	clear(scratchBuf)
	scratch.Sync()
	want(tb, "READ back", run(ctx, tb, c1, rdma(roce.WRRDMARead, scratch, 0, wLen, win, rk1)), roce.WCSuccess)
	scratch.Sync()
	for j := range uint64(wLen) {
		if scratchBuf[j] != pattern(1, j) {
			tb.Fatalf("READ back through rxe's window: byte %d is %#x, want %#x", j, scratchBuf[j], pattern(1, j))
		}
	}
	want(tb, "WRITE through rxe's window past its region", run(ctx, tb, c1, rdma(roce.WRRDMAWrite, scratch, 0, 16, p.addr+mrLen-8, rk1)), roce.WCRemAccessErr)

	c, c2 := h.dial(ctx)
	st, rk2, _ := p.step(ctx, "bind %d %x %x", c, wOff, wLen)
	wantGuest(tb, "guest binds a second window", st, ibvSuccess)
	want(tb, "READ through it", run(ctx, tb, c2, rdma(roce.WRRDMARead, scratch, 0, 64, win, rk2)), roce.WCSuccess)
	st, _, _ = p.step(ctx, "inv %d %x", c, rk2)
	wantGuest(tb, "guest invalidates it (LOCAL_INV)", st, ibvSuccess)
	want(tb, "READ through the invalidated window", run(ctx, tb, c2, rdma(roce.WRRDMARead, scratch, 0, 64, win, rk2)), roce.WCRemAccessErr)

	c, c3 := h.dial(ctx)
	st, rk3, _ := p.step(ctx, "bind %d %x %x", c, wOff, wLen)
	wantGuest(tb, "guest binds a third window", st, ibvSuccess)
	_, c4 := h.dial(ctx)
	want(tb, "READ through another connection's window", run(ctx, tb, c4, rdma(roce.WRRDMARead, scratch, 0, 64, win, rk3)), roce.WCRemAccessErr)
	want(tb, "READ through it on its own connection", run(ctx, tb, c3, rdma(roce.WRRDMARead, scratch, 0, 64, win, rk3)), roce.WCSuccess)
	// Past the window, inside the region: see the package documentation.
	tb.Logf("rxe, READ past its window inside the region (rxe checks the region's range): %v",
		run(ctx, tb, c3, rdma(roce.WRRDMARead, scratch, 0, 16, win+wLen-8, rk3)))

	st, _, mem := p.step(ctx, "dump 0 %x", mrLen+4096)
	wantGuest(tb, "dump", st, ibvSuccess)
	for i := range uint64(len(mem)) {
		exp := fill(i)
		if i >= wOff && i < wOff+wLen {
			exp = pattern(1, i-wOff)
		}
		if mem[i] != exp {
			tb.Fatalf("guest byte %d is %#x, want %#x", i, mem[i], exp)
		}
	}
	if len(mem) != mrLen+4096 {
		tb.Fatalf("dump: %d bytes", len(mem))
	}

	// goroce's windows, rxe the requester.
	gbuf := make([]byte, mrLen)
	for i := range gbuf {
		gbuf[i] = fill(uint64(i)) ^ 0x5a
	}
	orig := append([]byte(nil), gbuf...)
	gmr, err := pd.RegisterMR(gbuf, roce.AccessLocalWrite|roce.AccessMWBind)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { gmr.Close() })
	gwin := gmr.Addr() + wOff
	bind := func(what string, c *cm.Conn) uint32 {
		tb.Helper()
		mw, err := pd.AllocMW(roce.MWType2)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { mw.Close() })
		key := mw.RKey()
		key = key&^0xFF | (key+1)&0xFF
		want(tb, what, run(ctx, tb, c, &roce.SendWR{Opcode: roce.WRBindMW, MW: mw, RKey: key,
			Bind: roce.MWBindInfo{MR: gmr, Addr: gwin, Length: wLen, Access: roce.AccessRemoteRead | roce.AccessRemoteWrite}}), roce.WCSuccess)
		return key
	}
	viol := func() uint64 { return dev.Counters().RKeyViolation }
	v0 := viol()

	c, c5 := h.dial(ctx)
	k5 := bind("goroce binds a type 2 window", c5)
	st, _, data := p.step(ctx, "read %d %x %x %x", c, gwin, wLen, k5)
	wantGuest(tb, "guest READs through goroce's window", st, ibvSuccess)
	if !bytes.Equal(data, gbuf[wOff:wOff+wLen]) {
		tb.Fatalf("guest READ through goroce's window: %d bytes, differ from the window's", len(data))
	}
	st, _, _ = p.step(ctx, "write %d %x %x %x %x", c, gwin+100, 1000, k5, 7)
	wantGuest(tb, "guest WRITEs through goroce's window", st, ibvSuccess)
	gmr.Sync()
	for j := range uint64(1000) {
		orig[wOff+100+j] = pattern(7, j)
	}
	if !bytes.Equal(gbuf, orig) {
		tb.Fatal("guest WRITE through goroce's window: goroce's buffer is not what was written")
	}
	st, _, _ = p.step(ctx, "read %d %x %x %x", c, gwin+wLen-8, 16, k5)
	wantGuest(tb, "guest READs past goroce's window, inside its region", st, ibvRemAccessErr)

	c, c6 := h.dial(ctx)
	k6 := bind("goroce binds a second window", c6)
	c7, _ := h.dial(ctx)
	st, _, _ = p.step(ctx, "read %d %x %x %x", c7, gwin, 64, k6)
	wantGuest(tb, "guest READs goroce's window through another QP", st, ibvRemAccessErr)
	st, _, data = p.step(ctx, "read %d %x %x %x", c, gwin, 64, k6)
	wantGuest(tb, "guest READs it through its own QP", st, ibvSuccess)
	if !bytes.Equal(data, gbuf[wOff:wOff+64]) {
		tb.Fatal("guest READ through goroce's second window: data differs")
	}
	want(tb, "goroce invalidates it (LOCAL_INV)", run(ctx, tb, c6, &roce.SendWR{Opcode: roce.WRLocalInv, InvalidateRKey: k6}), roce.WCSuccess)
	st, _, _ = p.step(ctx, "write %d %x %x %x %x", c, gwin, 64, k6, 8)
	wantGuest(tb, "guest WRITEs through the invalidated window", st, ibvRemAccessErr)
	gmr.Sync()
	if !bytes.Equal(gbuf, orig) {
		tb.Fatal("goroce's buffer changed outside what was written through a live window")
	}
	if v := viol() - v0; v < 3 {
		tb.Errorf("goroce rkey_violation rose by %d, want at least 3", v)
	} else {
		tb.Logf("goroce rkey_violation rose by %d", v)
	}
	if st, _, _ := p.step(ctx, "stop"); st != 0 {
		tb.Fatalf("stop: %d", st)
	}
	stopped = true
	if _, _, code, err := job.Wait(); err != nil || code != 0 {
		tb.Fatalf("mwpeer: exit %d, %v", code, err)
	}
}
