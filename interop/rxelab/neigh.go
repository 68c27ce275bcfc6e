// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// resolveScript pings each address given until one echo comes back (at most
// 60 tries of a second each), then prints the guest's neighbour table.
const resolveScript = `for a in "$@"; do
	i=0
	until ping -c 1 -W 1 "$a" >/dev/null 2>&1; do
		i=$((i+1))
		[ $i -lt 60 ] || { echo "no echo reply from $a after $i tries" >&2; exit 1; }
	done
done
/sbin/ip neigh show dev eth0`

// ResolvePeer makes g's kernel resolve the host side's addresses (PeerAddr
// and, with IPv6, PeerAddr6) to PeerMAC, and the peer netns learn g's, before
// a test's first exchange. rdma_rxe resolves the destination MAC of an
// address vector when a QP moves to RTR (or an AH is created) and gives up
// after one second; the pingpong tools' TCP exchange runs over IPv4, so
// nothing else resolves the IPv6 neighbour first, and on a busy machine the
// TCG guest's neighbour discovery can take longer than that. The guest pings
// each address, retrying as a user checking a new link would, and the
// resulting entries must name PeerMAC; anything else is an error.
func (g *Guest) ResolvePeer(ctx context.Context) error {
	l := g.lab
	addrs := []netip.Addr{l.PeerAddr}
	if l.PeerAddr6.IsValid() && g.Addr6.IsValid() {
		addrs = append(addrs, l.PeerAddr6)
	}
	args := []string{"sh", "-c", resolveScript, "sh"}
	for _, a := range addrs {
		args = append(args, a.String())
	}
	stdout, stderr, code, err := g.Exec(ctx, args...)
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("rxelab: guest %s cannot reach the peer: exit %d: %s", g.Name, code, bytes.TrimSpace(stderr))
	}
	for _, a := range addrs {
		if err := checkNeighbour(string(stdout), a, l.PeerMAC); err != nil {
			return fmt.Errorf("rxelab: guest %s: %w", g.Name, err)
		}
	}
	return nil
}

// checkNeighbour finds addr in "ip neigh show" output and checks that the
// entry is usable without resolution (NUD_VALID) and holds mac.
func checkNeighbour(table string, addr netip.Addr, mac net.HardwareAddr) error {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if a, err := netip.ParseAddr(f[0]); err != nil || a != addr {
			continue
		}
		var lladdr string
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "lladdr" {
				lladdr = f[i+1]
			}
		}
		state := f[len(f)-1]
		switch state {
		case "REACHABLE", "STALE", "DELAY", "PROBE", "PERMANENT", "NOARP":
		default:
			return fmt.Errorf("neighbour %v is %s: %q", addr, state, line)
		}
		if got, err := net.ParseMAC(lladdr); err != nil || got.String() != mac.String() {
			return fmt.Errorf("neighbour %v has lladdr %q, want %v", addr, lladdr, mac)
		}
		return nil
	}
	return fmt.Errorf("no neighbour entry for %v:\n%s", addr, table)
}
