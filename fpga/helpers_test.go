package fpga_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

var (
	hostAddr = netip.MustParseAddr("10.0.0.1")
	fpgaAddr = netip.MustParseAddr("10.0.0.2")
	quiet    = slog.New(slog.NewTextHandler(io.Discard, nil))
)

// memDevices opens the host's and the FPGA's devices over a memlink pair at
// MTU 9000 with the given impairments (host→FPGA, FPGA→host).
func memDevices(t testing.TB, toFPGA, toHost faultnet.Config) (host, fpgaDev *roce.Device) {
	t.Helper()
	la, lb := memlink.PairWithOptions(memlink.Options{AtoB: toFPGA, BtoA: toHost, MTU: 9000})
	var err error
	host, err = roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{hostAddr}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{fpgaAddr: lb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Close() })
	fpgaDev, err = roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{fpgaAddr}, Logger: quiet,
		Neighbours: map[netip.Addr]net.HardwareAddr{hostAddr: la.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fpgaDev.Close() })
	return host, fpgaDev
}

// hostParams are the server's values as PyRogue hands them to the FPGA.
func hostParams(s *fpga.Server) emulator.HostParams {
	return emulator.HostParams{QPN: s.QPN(), GID: s.GID(), RqPSN: s.RqPSN(), SqPSN: s.SqPSN(),
		MRAddr: s.MRAddr(), MRRKey: s.MRRKey(), MaxPayload: s.MaxPayload(), Depth: s.Depth()}
}

// bringUp runs PyRogue's sequence: server, FPGA GID, FPGA setup with the
// host's values, CompleteConnection with the FPGA's.
func bringUp(t testing.TB, host, fdev *roce.Device, maxPayload, depth int, ecfg emulator.Config, rnrTimer uint8) (*fpga.Server, *emulator.Emulator) {
	t.Helper()
	return bringUpAt(t, host, fdev, fpgaAddr, maxPayload, depth, ecfg, rnrTimer)
}

func bringUpAt(t testing.TB, host, fdev *roce.Device, fpgaAddr netip.Addr, maxPayload, depth int, ecfg emulator.Config, rnrTimer uint8) (*fpga.Server, *emulator.Emulator) {
	t.Helper()
	s, err := fpga.NewServer(host, 1, -1, maxPayload, depth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.SetLogger(quiet)
	if err := s.SetFPGAGID(ib.GIDFromAddr(fpgaAddr)); err != nil {
		t.Fatal(err)
	}
	if ecfg.RetryCnt == 0 {
		// A loaded test machine can delay ACKs past several timeouts;
		// the firmware's 3 retries are not what these tests are about.
		ecfg.RetryCnt = 7
	}
	e, err := emulator.New(fdev, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := e.Connect(ctx, hostParams(s))
	if err != nil {
		t.Fatal(err)
	}
	if p.RqPSN != s.SqPSN() {
		t.Fatalf("FPGA reports RqPSN %#x, want the host's SqPSN %#x", p.RqPSN, s.SqPSN())
	}
	if err := s.CompleteConnection(ctx, p.QPN, p.RqPSN, ecfg.PMTU, rnrTimer); err != nil {
		t.Fatal(err)
	}
	return s, e
}

// payload fills b with a pattern identifying frame i.
func payload(b []byte, i int) []byte {
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
	if len(b) >= 4 {
		binary.BigEndian.PutUint32(b, uint32(i))
	}
	return b
}

// frameSize is the size of frame i: 1 byte to max, edges included.
func frameSize(i, max int) int {
	switch i % 8 {
	case 0:
		return 1
	case 1:
		return max
	case 2:
		return max - 1
	case 3:
		return 2 + i%3
	default:
		return 1 + (i*2654435761)%max
	}
}

// checker verifies frames arrive once, in order, byte-exact, on their channel.
type checker struct {
	mu   sync.Mutex
	next int
	max  int
	err  error
	buf  []byte
	got  chan struct{}
	want int
	// counterMod is where the FPGA's counter wraps (gen 1: the depth).
	counterMod uint32
}

func newChecker(max, want int) *checker {
	return &checker{max: max, buf: make([]byte, max), got: make(chan struct{}), want: want, counterMod: 1 << 24}
}

func (c *checker) check(f fpga.Frame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.next
	c.next++
	if c.err == nil {
		want := payload(c.buf[:frameSize(i, c.max)], i)
		switch {
		case f.Channel() != uint8(i%4):
			c.err = fmt.Errorf("frame %d: channel %d, want %d", i, f.Channel(), i%4)
		case f.Counter() != uint32(i)%c.counterMod:
			c.err = fmt.Errorf("frame %d: counter %d, want %d", i, f.Counter(), uint32(i)%c.counterMod)
		case string(f.Data()) != string(want):
			c.err = fmt.Errorf("frame %d: %d bytes differ from the %d sent", i, f.Len(), len(want))
		}
	}
	if c.next == c.want {
		close(c.got)
	}
}

func (c *checker) wait(t testing.TB, s *fpga.Server, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.got:
	case <-time.After(timeout):
		t.Fatalf("got %d of %d frames; server %+v, err %v", c.count(), c.want, s.Stats(), s.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		t.Fatal(c.err)
	}
}

func (c *checker) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next
}

// sendAll sends n frames from the emulator and waits for their ACKs.
func sendAll(t testing.TB, e *emulator.Emulator, n, max int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	buf := make([]byte, max)
	for i := 0; i < n; i++ {
		if err := e.Send(ctx, uint8(i%4), payload(buf[:frameSize(i, max)], i)); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
