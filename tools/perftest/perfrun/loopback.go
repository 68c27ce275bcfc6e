// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/goroce/goroce/link/udplink"
	"github.com/goroce/goroce/roce"
)

// Loopback runs both ends of a test in this process: two devices on kernel
// UDP sockets on 127.0.0.1 and 127.0.0.2 (kernel-chosen ports, so no root
// and no clash with a real RoCE port) and the out-of-band exchange over
// loopback TCP. The two ends need distinct addresses: a device delivers
// frames addressed to one of its own GIDs internally, as rxe does.
// The client's output goes to out; both sides' results are returned, and
// the received data is checked against the pattern the other end sends.
// Both ends being goroce devices, each ACK leaves with the reply that
// follows it (roce.Options.AckWithReply): the peer that takes them is
// this process, which completes them in the order they come.
func Loopback(ctx context.Context, cfg PerfConfig, out io.Writer, asJSON bool) (client, server []PerfResult, err error) {
	return loopback(ctx, cfg, out, asJSON, nil)
}

// loopback is Loopback with stats called on each device once open, the
// client's first (both ends' counters are then visible to "rocectl stat").
func loopback(ctx context.Context, cfg PerfConfig, out io.Writer, asJSON bool, stats func(d *roce.Device, server bool) (func(), error)) (client, server []PerfResult, err error) {
	lo, lo2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	lopts := udplink.Options{EphemeralPort: true, Queues: cfg.Queues}
	la, err := udplink.ListenOptions(netip.AddrPortFrom(lo, 0), lopts)
	if err != nil {
		return nil, nil, err
	}
	lb, err := udplink.ListenOptions(netip.AddrPortFrom(lo2, 0), lopts)
	if err != nil {
		la.Close()
		return nil, nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{lo}, Port: lb.LocalAddr().Port(), Logger: quiet, AckWithReply: true, CC: cfg.CC, Shards: cfg.Shards})
	if err != nil {
		la.Close()
		lb.Close()
		return nil, nil, err
	}
	defer da.Close()
	db, err := roce.OpenLink(lb, roce.Options{Addrs: []netip.Addr{lo2}, Port: la.LocalAddr().Port(), Logger: quiet, AckWithReply: true, CC: cfg.CC, Shards: cfg.Shards})
	if err != nil {
		lb.Close()
		return nil, nil, err
	}
	defer db.Close()
	if stats != nil {
		for i, d := range []*roce.Device{da, db} {
			stop, err := stats(d, i == 1)
			if err != nil {
				return nil, nil, err
			}
			defer stop()
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	if cfg.Device == "" {
		cfg.Device = "lo"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type res struct {
		r   []PerfResult
		err error
	}
	srvDone := make(chan res, 1)
	ccfg, scfg := peered(cfg, da, db)
	var srvOut bytes.Buffer
	srvOOB, cliOOB := OOB{Listener: ln}, OOB{Dial: DialRetry(ln.Addr().String(), 0)}
	if cfg.RDMACM {
		// The rdma_cm port names a service ID, not a socket: no clash.
		srvOOB = OOB{RDMACM: &RDMACM{Listen: netip.AddrPortFrom(netip.IPv4Unspecified(), DefaultPort), listening: make(chan struct{})}}
		cliOOB = OOB{RDMACM: &RDMACM{Peer: netip.AddrPortFrom(lo2, DefaultPort)}}
	}
	srvCtx, cancelSrv := ctx, context.CancelFunc(func() {})
	if cfg.RunInfinitely {
		// An interrupt ends the client's run; the server then follows the
		// client's closing exchanges, or gives up with it.
		srvCtx, cancelSrv = context.WithCancel(context.WithoutCancel(ctx))
		defer cancelSrv()
		stop := context.AfterFunc(ctx, func() { time.AfterFunc(2*drainTimeout, cancelSrv) })
		defer stop()
	}
	go func() {
		r, err := perfRun(srvCtx, db, srvOOB, scfg, &srvOut, false, true)
		if err != nil {
			cancel()
		}
		srvDone <- res{r, err}
	}()
	if srvOOB.RDMACM != nil {
		// A REQ that reaches a device whose CM does not exist yet is
		// dropped, not rejected; do not wait out its timeout.
		select {
		case <-srvOOB.RDMACM.listening:
		case <-ctx.Done():
		}
	}
	client, cerr := perfRun(ctx, da, cliOOB, ccfg, out, asJSON, true)
	if cerr != nil {
		cancel()
		cancelSrv()
	}
	s := <-srvDone
	server = s.r
	switch {
	case cerr != nil:
		return client, server, fmt.Errorf("client: %w", cerr)
	case s.err != nil:
		return client, server, fmt.Errorf("server: %w", s.err)
	}
	for _, r := range append(client, server...) {
		if r.DataErrors > 0 {
			return client, server, fmt.Errorf("%s %s: received data differs from what the peer sent", r.Test, r.Role)
		}
	}
	return client, server, nil
}

// peered returns cfg for the client on a and for the server on b, each
// naming the other's device as its peer (PerfConfig.peer).
func peered(cfg PerfConfig, a, b progresser) (client, server PerfConfig) {
	client, server = cfg, cfg
	client.peer, server.peer = b, a
	return client, server
}
