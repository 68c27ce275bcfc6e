package rdmacm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/cm"
	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/cm/rping"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/netnstest"
)

// labPeerBr is the bridge side of the veth whose other end is rxeh0: a
// frame sent on it arrives on rxeh0 as from the wire.
const labPeerBr = "rxeh0-br"

type monoClock struct{ start time.Time }

func (c monoClock) Now() time.Duration { return time.Since(c.start) }

// reqFlood writes spoofed rdma_cm REQs onto the wire towards dst: UD
// packets to QP1 from many source addresses, each asking for the longest
// response timeout and most retries, none ever followed by an RTU.
type reqFlood struct {
	fd      int
	dstMAC  net.HardwareAddr
	dst     netip.Addr
	port    uint16
	srcs    []netip.Addr
	eng     *cm.Engine
	n       uint32
	buf     []byte
	created time.Time
}

func newREQFlood(t *testing.T, labNS, ifname string, dstMAC net.HardwareAddr, dst netip.Addr, port uint16, sources int) *reqFlood {
	t.Helper()
	f := &reqFlood{fd: -1, dstMAC: dstMAC, dst: dst, port: port, buf: make([]byte, 2048), created: time.Now()}
	for i := range sources {
		f.srcs = append(f.srcs, netip.AddrFrom4([4]byte{10, 77, byte(4 + i>>8), byte(i)}))
	}
	err := netnstest.InNamedNS(labNS, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		f.fd = fd
		return nil
	})
	if err != nil {
		t.Skipf("no raw socket on %s in the lab: %v", ifname, err)
	}
	t.Cleanup(func() { unix.Close(f.fd) })
	return f
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// send writes one REQ from the next source address.
func (f *reqFlood) send(t *testing.T) error {
	if f.eng == nil || f.n%256 == 0 {
		// A fresh generator now and then: the spoofer's own connection
		// IDs are never looked at again.
		e, err := cm.NewEngine(cm.Config{Clock: monoClock{f.created}, Rand: rand.Uint32, LocalCAGUID: 0x0200_5eff_fe00_0bad, REQRate: -1})
		if err != nil {
			return err
		}
		f.eng = e
	}
	src := f.srcs[int(f.n)%len(f.srcs)]
	f.n++
	pd := make([]byte, mad.CMAHeaderSize)
	mad.CMAHeader(pd).Encode(&mad.CMAHeaderFields{SrcPort: 4242, Src: src, Dst: f.dst})
	if _, err := f.eng.Connect(&cm.ConnectParams{ServiceID: mad.ServiceID(mad.PortSpaceTCP, f.port),
		Path: cm.Path{Local: src, Remote: f.dst}, QPN: f.n%0xFFFFFF + 1, StartingPSN: 1,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PathMTU: ib.MTU1024,
		CMResponseTimeout: 31, MaxCMRetries: 15, PrivateData: pd}); err != nil {
		return err
	}
	o, ok := f.eng.PollOutbound()
	if !ok {
		return fmt.Errorf("the generator sent no REQ")
	}
	spec := ib.FrameSpec{
		Src: src, Dst: f.dst, HopLimit: 64, DontFragment: true, SrcPort: 49152 + uint16(f.n%1024),
		BTH:     ib.BTHFields{Opcode: ib.UDSendOnly, PKey: 0xffff, DestQP: 1, PSN: ib.PSN(f.n) & ib.PSNMask},
		DETH:    &ib.DETHFields{QKey: 0x80010000, SrcQP: 1},
		Payload: o.MAD[:],
	}
	copy(spec.DstMAC[:], f.dstMAC)
	spec.SrcMAC = [6]byte{0x02, 0xfe, 0, 0, byte(f.n >> 8), byte(f.n)}
	binary.BigEndian.PutUint16(spec.SrcMAC[2:], uint16(src.As4()[2])<<8|uint16(src.As4()[3]))
	n, err := ib.Build(f.buf, &spec)
	if err != nil {
		return err
	}
	_, err = unix.Write(f.fd, f.buf[:n])
	return err
}

// run sends at rate REQs a second until ctx ends and returns how many.
func (f *reqFlood) run(ctx context.Context, t *testing.T, rate int) (int, error) {
	start := time.Now()
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	sent := 0
	for {
		select {
		case <-ctx.Done():
			return sent, nil
		case <-tk.C:
		}
		// Catch up if a tick came late on a busy machine.
		for due := int(time.Since(start).Seconds() * float64(rate)); sent < due; sent++ {
			if err := f.send(t); err != nil {
				return sent, err
			}
		}
	}
}

// TestRxeClientDuringREQFlood: while spoofed REQs from 1,024 addresses that
// answer nothing arrive at 1,000 a second (none ever completed, each asking
// for the longest CM timeouts), the real rping client in the guest connects
// to our rping server, pings and checks its data. Three things broke this
// against rxe and not over memlink: the CM's goroutine waited up to 3 s
// for each spoofed address's neighbour before its REJ (QP1 overflowed and
// real RTUs were lost); a slow guest's handshake, REP sent, was displaced
// from the half-open table by newer spoofed ones; and rping's server kept
// one endpoint for every handshake it answered, so the flood's overwrote
// the real connection's.
func TestRxeClientDuringREQFlood(t *testing.T) {
	lab, g, dev := rxeSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const count, port, rate = 3, 7474, 1000
	flood := newREQFlood(t, lab.NS, labPeerBr, lab.PeerMAC, lab.PeerAddr, port, 1024)

	var out strings.Builder
	srv := make(chan error, 1)
	go func() {
		srv <- rping.Server(ctx, dev, netip.AddrPortFrom(lab.PeerAddr, port), rping.Config{Count: count, Verbose: true, Out: &out})
	}()
	before := dev.Counters()
	fctx, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	var wg sync.WaitGroup
	var sent int
	var ferr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sent, ferr = flood.run(fctx, t, rate)
	}()
	// Let the flood fill the listener's half-open table first.
	time.Sleep(3 * time.Second)

	var stdout, stderr []byte
	var code int
	var err error
	var took time.Duration
	for i := 0; i < 20; i++ {
		start := time.Now()
		stdout, stderr, code, err = g.Exec(ctx, "rping", "-c", "-a", lab.PeerAddr.String(), "-p", strconv.Itoa(port), "-C", strconv.Itoa(count), "-v", "-V")
		took = time.Since(start)
		// Until our server listens the guest's rping is rejected (REJ 8).
		if err != nil || code == 0 || !strings.Contains(string(stdout)+string(stderr), "REJECTED, error 8") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != 0 {
		select {
		case err := <-srv:
			t.Logf("our server returned: %v", err)
		default:
		}
	}
	stopFlood()
	wg.Wait()
	after := dev.Counters()
	t.Logf("flood: %d spoofed REQs at %d/s from 1,024 addresses (rcvd_pkts +%d); rping -c -C %d ran %v during it",
		sent, rate, after.RcvdPkts-before.RcvdPkts, count, took.Round(time.Millisecond))
	if ferr != nil {
		t.Fatalf("flood: %v", ferr)
	}
	if err != nil || code != 0 {
		t.Fatalf("rping -c during the flood: exit %d (%v) after %v\n%s%s", code, err, took, stdout, stderr)
	}
	if want := expectedPings("", count); string(stdout) != want {
		t.Errorf("rping -c printed\n%s\nwant\n%s", stdout, want)
	}
	if err := <-srv; err != nil {
		t.Fatalf("server: %v", err)
	}
	if sent < rate {
		t.Errorf("only %d REQs sent: not a flood", sent)
	}
	// rdma_cm retries a lost REQ after about 4 s; a busy machine may cost
	// a few such retries, the flood itself none.
	if took > 30*time.Second {
		t.Errorf("rping took %v during the flood", took)
	}
}
