// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/tools/perftest"
)

// TestRDMACMReleasesEverything: a -R run on two devices leaves no verbs
// object behind on either (the control channel's region, PD and CQs, the
// test QP), only the CM's own QP1 resources while its agent lingers.
func TestRDMACMReleasesEverything(t *testing.T) {
	da, db := udpPair(t)
	resA, resB := da.Resources(), db.Resources()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := PerfConfig{Verb: perftest.Write, Size: 4096, Iters: 20, GIDIndex: -1}
	srvOOB := OOB{RDMACM: &RDMACM{Listen: netip.AddrPortFrom(netip.IPv4Unspecified(), DefaultPort), listening: make(chan struct{})}}
	srv := make(chan error, 1)
	go func() {
		_, err := perfRun(ctx, db, srvOOB, cfg, io.Discard, false, true)
		if err != nil {
			cancel()
		}
		srv <- err
	}()
	<-srvOOB.RDMACM.listening
	cli := OOB{RDMACM: &RDMACM{Peer: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), DefaultPort)}}
	if _, err := perfRun(ctx, da, cli, cfg, io.Discard, false, true); err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-srv; err != nil {
		t.Fatalf("server: %v", err)
	}
	// The CM agents keep QP1 (a PD, two CQs, the QP, a receive region and
	// AHs) until they stop; everything beyond what they hold must be gone.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ra, rb := da.Resources(), db.Resources()
		if ra == resA && rb == resB {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind: A %+v (was %+v), B %+v (was %+v)", ra, resA, rb, resB)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRDMACMClientGivesUp: a -R client whose peer has no listener stops
// after CMConnectPatience and says which connection it was making, where it
// used to retry in silence until interrupted.
func TestRDMACMClientGivesUp(t *testing.T) {
	defer func(p time.Duration) { CMConnectPatience = p }(CMConnectPatience)
	CMConnectPatience = time.Second
	da, _ := udpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := PerfConfig{Verb: perftest.Write, Size: 4096, Iters: 20, GIDIndex: -1}
	cli := OOB{RDMACM: &RDMACM{Peer: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), DefaultPort)}}
	_, err := perfRun(ctx, da, cli, cfg, io.Discard, false, true)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "control channel") {
		t.Fatalf("client: %v (context: %v), want the control channel's connect to give up", err, ctx.Err())
	}
}
