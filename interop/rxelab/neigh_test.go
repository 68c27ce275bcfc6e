// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package rxelab

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestCheckNeighbour(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:4d:00:01")
	table := "10.77.0.1 lladdr 52:54:00:4d:00:01 REACHABLE\n" +
		"fd77::1 lladdr 52:54:00:4d:00:01 router STALE\n" +
		"10.77.0.9 INCOMPLETE\n" +
		"fd77::9 lladdr 52:54:00:4d:00:09 FAILED\n" +
		"10.77.0.7 lladdr 52:54:00:4d:00:08 PERMANENT\n"
	for _, c := range []struct {
		addr, err string
	}{
		{"10.77.0.1", ""},
		{"fd77::1", ""},
		{"10.77.0.9", "INCOMPLETE"},
		{"fd77::9", "FAILED"},
		{"10.77.0.7", "lladdr"},
		{"10.77.0.5", "no neighbour entry"},
	} {
		err := checkNeighbour(table, netip.MustParseAddr(c.addr), mac)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want %q", c.addr, err, c.err)
		}
	}
}

// TestResolvePeer: the lab's start has already resolved the peer; doing it
// again succeeds and leaves the guest an entry for PeerAddr with PeerMAC.
func TestResolvePeer(t *testing.T) {
	lab := Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, g := range lab.Guests {
		if err := g.ResolvePeer(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
