//go:build linux

package cuobj

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/netnstest"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// TestMultipathFailover: a client with two devices, each on its own veth
// pair to a server device of its own (four namespaces, the kernel UDP
// link). The primary's link goes down in its namespace in the middle of a
// GET: the chunk in flight fails on the server's side, its retry and the
// chunks after it go to the backup, and the GET completes with the right
// data. When the link comes back the health check fails back to the
// primary, which then carries a PUT. Over RC and DC.
func TestMultipathFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("four namespaces; not in -short")
	}
	for _, proto := range []Proto{ProtoRC, ProtoDC} {
		t.Run(proto.String(), func(t *testing.T) { multipathFailover(t, proto) })
	}
}

func multipathFailover(t *testing.T, proto Proto) {
	type side struct {
		pair *netnstest.Pair
		sdev *roce.Device
		cdev *roce.Device
		srv  *Server
		sbuf []byte
		sreg *Buffer
		ch   uint16
	}
	open := func(v *netnstest.Veth) *roce.Device {
		var d *roce.Device
		err := v.NS.Do(func() (err error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			d, err = netdev.Open(ctx, v.Name, netdev.Options{Link: netdev.LinkUDP, Device: roce.Options{Logger: quietLog()}})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	const size = 16 << 20
	tun := DefaultTunables()
	// goroce's QPs read retry_cnt 7 (the default) as "retry for ever":
	// with 6, a request on the dead path fails after 7 ACK timeouts of
	// 67 ms (not of 268 ms), and a live path never loses 7 in a row,
	// however busy the machine.
	tun.Timeout, tun.RetryCount = 14, 6
	var sides [2]*side
	for i, net := range []string{"10.98.1.", "10.98.2."} {
		p := netnstest.NewPairConfig(t, netnstest.VethConfig{MTU: 9000,
			Addr: netip.MustParsePrefix(net + "1/24"), PeerAddr: netip.MustParsePrefix(net + "2/24")})
		p.Resolve(t)
		s := &side{pair: p, sdev: open(p.VethA), cdev: open(p.VethB)}
		var err error
		if s.srv, err = NewServer(s.sdev, netip.AddrPortFrom(p.VethA.Addr.Addr(), 18515), ServerOptions{Proto: proto, Tunables: &tun, Telemetry: quiet}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.srv.Close() })
		if s.sbuf, err = s.srv.AllocHostBuffer(size); err != nil {
			t.Fatal(err)
		}
		if s.sreg, err = s.srv.RegisterBuffer(s.sbuf); err != nil {
			t.Fatal(err)
		}
		if s.ch, err = s.srv.AllocateChannel(); err != nil {
			t.Fatal(err)
		}
		sides[i] = s
	}
	object := pattern(size, 7)
	for _, s := range sides {
		copy(s.sbuf, object) // both storage endpoints serve the same object
	}
	// The control path: the token's address says which of the server's
	// endpoints reaches the client's device.
	serverFor := func(info *RDMAInfo) *side {
		a, _ := info.Token.IPAddr()
		if sides[1].pair.VethB.Addr.Contains(a) {
			return sides[1]
		}
		return sides[0]
	}
	var calls atomic.Int32
	var hook func(n int32)
	get := func(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
		if hook != nil {
			hook(calls.Add(1))
		}
		s := serverFor(info)
		n, err := s.srv.HandleGetObject(h.Context(), &Request{Key: "get", Local: s.sreg, LocalOffset: uint64(off),
			RemoteAddr: info.Token.Addr, Size: uint64(len(chunk)), Token: info.Desc, Channel: s.ch})
		return int(n), err
	}
	put := func(h *Handle, chunk []byte, off int64, info *RDMAInfo) (int, error) {
		s := serverFor(info)
		n, err := s.srv.HandlePutObject(h.Context(), &Request{Key: "put", Local: s.sreg, LocalOffset: uint64(off),
			RemoteAddr: info.Token.Addr, Size: uint64(len(chunk)), Token: info.Desc, Channel: s.ch})
		return int(n), err
	}
	cfg := DefaultConfig()
	p := &cfg.Properties
	p.MultipathEnabled = true
	p.DevAddrList = []string{"10.98.1.2", "10.98.2.2"}
	p.IORetryCount, p.IORetryDelayMS = 5, 20
	p.HealthCheckInterval, p.FailbackDelayMS = 100, 200
	// The backup is given first: rdma_dev_addr_list decides the order.
	cli, err := NewClient(sides[1].cdev, Ops{Get: get, Put: put}, ClientOptions{Proto: proto, Config: &cfg, Telemetry: quiet,
		Backups: []*roce.Device{sides[0].cdev}, MaxRequestCallbackSize: 1 << 20, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	primary, backup := sides[0].pair.VethB, sides[1].pair.VethB
	if a := cli.ActiveAddr().Addr(); a != primary.Addr.Addr() {
		t.Fatalf("active device %v, want the list's first, %v", a, primary.Addr.Addr())
	}
	buf := make([]byte, size)
	if err := cli.Register(buf); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 60*time.Second)

	setLink := func(up bool) {
		l, err := primary.Link()
		if err != nil {
			t.Error(err)
			return
		}
		nl := primary.NS.Netlink()
		if up {
			err = nl.LinkSetUp(l)
		} else {
			err = nl.LinkSetDown(l)
		}
		if err != nil {
			t.Error(err)
		}
	}
	// Down before the fifth chunk's request: that chunk is in flight on
	// the primary when its path dies.
	hook = func(n int32) {
		if n == 5 {
			setLink(false)
		}
	}
	start := time.Now()
	n, err := cli.Get(ctx, "user", buf, 0, 0)
	el := time.Since(start)
	hook = nil
	if err != nil || n != size || !bytes.Equal(buf, object) {
		t.Fatalf("Get across the failover: %d, %v (data equal %v)", n, err, bytes.Equal(buf, object))
	}
	st := cli.Stats()
	g0, g1 := sides[0].srv.Stats().Gets.Load(), sides[1].srv.Stats().Gets.Load()
	s0 := sides[0].srv.Stats()
	t.Logf("16 MiB GET with the primary down after 4 chunks: %v; chunks via primary %d, via backup %d; %d retries, %d failovers; primary's server: %d failed, %d refused",
		el.Round(time.Millisecond), g0, g1, st.Retries.Load(), st.Failovers.Load(), s0.Failed.Load(), s0.Refused.Load())
	// The fifth chunk fails on the primary's server: a failed completion
	// (the WRITE's retries ran out), or a refusal when that server
	// already saw the connection go (its next request dials again, which
	// the dead link does not answer).
	if st.Failovers.Load() != 1 || st.Retries.Load() < 1 || g0+g1 != 16 || g0 > 4 || s0.Failed.Load()+s0.Refused.Load() < 1 {
		t.Errorf("want 1 failover, at least 1 retry, at most 4 chunks via the primary (then a failure) and the rest via the backup")
	}
	if a := cli.ActiveAddr().Addr(); a != backup.Addr.Addr() {
		t.Fatalf("active device %v after the failover, want %v", a, backup.Addr.Addr())
	}

	// Failback: the primary's link returns; after the failback delay the
	// health check moves the client back.
	setLink(true)
	if err := primary.WaitReady(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	netnstest.Resolve(t, sides[0].pair.VethA, primary, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for cli.ActiveAddr().Addr() != primary.Addr.Addr() {
		if time.Now().After(deadline) {
			t.Fatalf("no failback within 10 s (active %v)", cli.ActiveAddr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Failbacks.Load() != 1 {
		t.Errorf("%d failbacks, want 1", st.Failbacks.Load())
	}
	want := pattern(size, 8)
	copy(buf, want)
	clear(sides[0].sbuf)
	puts0 := sides[0].srv.Stats().Puts.Load()
	if n, err := cli.Put(ctx, "user", buf, 0, 0); err != nil || n != size {
		t.Fatalf("Put after the failback: %d, %v", n, err)
	}
	if got := sides[0].srv.Stats().Puts.Load() - puts0; got != 16 || !bytes.Equal(sides[0].sbuf, want) {
		t.Fatalf("Put after the failback: %d chunks via the primary, data equal %v", got, bytes.Equal(sides[0].sbuf, want))
	}
}

// TestMultipathSelection: which devices a client uses.
func TestMultipathSelection(t *testing.T) {
	_, c1 := memDevicesAt(t, faultnetNone, faultnetNone, netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.1.2"))
	_, c2 := memDevicesAt(t, faultnetNone, faultnetNone, netip.MustParseAddr("10.0.2.1"), netip.MustParseAddr("10.0.2.2"))
	_, c3 := memDevicesAt(t, faultnetNone, faultnetNone, netip.MustParseAddr("10.0.3.1"), netip.MustParseAddr("10.0.3.2"))
	newCli := func(mp bool, backups uint, list ...string) (*Client, error) {
		cfg := DefaultConfig()
		cfg.Properties.MultipathEnabled, cfg.Properties.MaxBackupDevices, cfg.Properties.DevAddrList = mp, backups, list
		c, err := NewClient(c1, Ops{}, ClientOptions{Config: &cfg, Telemetry: quiet, Backups: []*roce.Device{c2, c3}})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}
	addrs := func(c *Client) (s []string) {
		for _, r := range c.rails {
			s = append(s, r.addr.Addr().String())
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		mp      bool
		backups uint
		list    []string
		want    string
	}{
		{"no multipath: the primary only", false, 2, nil, "[10.0.1.2]"},
		{"multipath: primary and backups", true, 2, nil, "[10.0.1.2 10.0.2.2 10.0.3.2]"},
		{"rdma_max_backup_devices", true, 1, nil, "[10.0.1.2 10.0.2.2]"},
		{"the list orders and selects", true, 2, []string{"10.0.3.2", "192.0.2.9", "10.0.1.2"}, "[10.0.3.2 10.0.1.2]"},
		{"no multipath with a list: its first", false, 2, []string{"10.0.2.2", "10.0.1.2"}, "[10.0.2.2]"},
	} {
		c, err := newCli(tc.mp, tc.backups, tc.list...)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := fmt.Sprint(addrs(c)); got != tc.want {
			t.Errorf("%s: devices %s, want %s", tc.name, got, tc.want)
		}
		if c.ActiveAddr() != c.rails[0].addr {
			t.Errorf("%s: active %v, want the first", tc.name, c.ActiveAddr())
		}
	}
	if _, err := newCli(true, 2, "192.0.2.9"); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("a list naming no device: %v, want ENODEV", err)
	}
}

var faultnetNone faultnet.Config
