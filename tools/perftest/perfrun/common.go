// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"github.com/goroce/goroce/netdev"
	"github.com/goroce/goroce/roce"
)

// DefaultPort is the TCP port of the tools' out-of-band exchange.
const DefaultPort = 18515

// OOB reaches the peer's out-of-band endpoint. Exactly one of Listener
// (server) and Dial (client) is set.
type OOB struct {
	Listener net.Listener
	Dial     func(ctx context.Context) (net.Conn, error)
	// RDMACM, if set, replaces TCP with rdma_cm (perftest -R).
	RDMACM *RDMACM
}

// IsServer reports whether this side waits for the peer.
func (o OOB) IsServer() bool {
	if o.RDMACM != nil {
		return o.RDMACM.Listen.IsValid()
	}
	return o.Listener != nil
}

// connect returns the out-of-band connection: the first accepted one for a
// server, a dialled one for a client, bounded by ctx.
func (o OOB) connect(ctx context.Context) (net.Conn, error) {
	if o.Listener != nil {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			c, err := o.Listener.Accept()
			ch <- res{c, err}
		}()
		select {
		case r := <-ch:
			if r.err != nil {
				return nil, fmt.Errorf("accept: %w", r.err)
			}
			return r.c, nil
		case <-ctx.Done():
			o.Listener.Close()
			return nil, fmt.Errorf("waiting for the client: %w", ctx.Err())
		}
	}
	if o.Dial == nil {
		return nil, errors.New("perfrun: neither listener nor dialer")
	}
	return o.Dial(ctx)
}

// DialTimeout bounds one TCP connection attempt of DialRetry.
const DialTimeout = 20 * time.Second

// DialRetry returns a Dial that connects to addr, retrying while the peer's
// server is not listening yet (the tools give up at once; starting both
// ends together is easier with a little patience).
func DialRetry(addr string, patience time.Duration) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		// A peer that drops SYNs would hold each attempt for the kernel's
		// two minutes; perftest's client gives up well before.
		d := net.Dialer{Timeout: DialTimeout}
		end := time.Now().Add(patience)
		for {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err == nil {
				return c, nil
			}
			if ctx.Err() != nil || time.Now().After(end) {
				return nil, fmt.Errorf("connect to %s: %w", addr, err)
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}

// ListenOOB listens on the out-of-band port on every address, as the
// tools do.
func ListenOOB(port int) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
}

// localGID returns the GID at index, or with index -1 the device's first
// IPv4 GID (then any), with its index.
func localGID(dev *roce.Device, index int) (ib.GID, int, error) {
	if index >= 0 {
		g, err := dev.GID(index)
		return g, index, err
	}
	gids := dev.GIDs()
	for _, e := range gids {
		if e.GID.IsIPv4() {
			return e.GID, e.Index, nil
		}
	}
	if len(gids) > 0 {
		return gids[0].GID, gids[0].Index, nil
	}
	return ib.GID{}, -1, roce.ErrNoGID
}

func randPSN() uint32 { return rand.Uint32() & 0xFFFFFF }

// progresser does a device's work once in the caller (roce.Device).
type progresser interface{ Progress() }

// pollWait waits for at least one completion on cq: busy polling first
// (the tools' default), parked on the CQ when events is set or after a
// while, so a stalled peer does not burn a core forever. While it busy
// polls it also drives peer, the other end's device, if that runs in this
// process (PerfConfig.peer).
func pollWait(ctx context.Context, cq *roce.CQ, wc []roce.WorkCompletion, events bool, peer progresser) (int, error) {
	if !events {
		for i := 0; i < 2000; i++ {
			if n := cq.Poll(wc); n > 0 {
				return n, nil
			}
			if peer != nil && i&7 == 7 {
				peer.Progress()
			}
		}
	}
	for {
		if n := cq.Poll(wc); n > 0 {
			return n, nil
		}
		if err := cq.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// WCError is a completion that did not succeed.
type WCError struct {
	WC roce.WorkCompletion
}

func (e *WCError) Error() string {
	return fmt.Sprintf("completion with status %v (%d) for wr_id %d, opcode %v", e.WC.Status, int(e.WC.Status), e.WC.WRID, e.WC.Opcode)
}

// parseMTU reads a path MTU in bytes (256 … 4096); 0 means unset.
func parseMTU(n int) (ib.MTU, error) {
	if n == 0 {
		return 0, nil
	}
	m, ok := ib.MTUFromBytes(n)
	if !ok {
		return 0, fmt.Errorf("invalid MTU %d (256, 512, 1024, 2048 or 4096)", n)
	}
	return m, nil
}

// parseInterspersed parses and validates flags that may come before and
// after the positional arguments, as getopt allows.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := cliflag.Parse(fs, args); err != nil {
		return nil, err
	}
	return fs.Args(), nil
}

// linkKind maps the --link flag.
func linkKind(s string) (netdev.LinkKind, error) {
	switch s {
	case "", "auto":
		return netdev.LinkAuto, nil
	case "xdp":
		return netdev.LinkXDP, nil
	case "udp":
		return netdev.LinkUDP, nil
	}
	return 0, fmt.Errorf("unknown link %q (udp, xdp or auto)", s)
}

// peerAddr joins a peer host and the port.
func peerAddr(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(a, uint16(port)).String()
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// toInit moves a fresh QP to INIT, so receives can be posted before it is
// connected (Connect then goes INIT → INIT → RTR → RTS).
func toInit(ctx context.Context, q *roce.QP, qkey uint32) error {
	a := roce.QPAttr{State: roce.StateInit, Port: 1}
	mask := roce.AttrState | roce.AttrPKeyIndex | roce.AttrPort
	if q.Type() == roce.UD {
		a.QKey = qkey
		mask |= roce.AttrQKey
	} else {
		a.AccessFlags = roce.AccessLocalWrite | roce.AccessRemoteWrite | roce.AccessRemoteRead | roce.AccessRemoteAtomic
		mask |= roce.AttrAccessFlags
	}
	return q.Modify(ctx, &a, mask)
}
