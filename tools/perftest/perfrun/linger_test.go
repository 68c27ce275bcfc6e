// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perfrun

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/link/memlink"
	"github.com/goroce/goroce/roce"
)

// dropFirstACK loses the first RC ACKNOWLEDGE written through it.
type dropFirstACK struct {
	link.Link
	dropped atomic.Bool
}

func (l *dropFirstACK) WriteBatch(frames [][]byte) (int, error) {
	var p ib.Packet
	kept := make([][]byte, 0, len(frames))
	for _, f := range frames {
		if !l.dropped.Load() && ib.Parse(f, &p) == nil && p.BTH.Opcode() == ib.RCAck {
			l.dropped.Store(true)
			continue
		}
		kept = append(kept, f)
	}
	if _, err := l.Link.WriteBatch(kept); err != nil {
		return 0, err
	}
	return len(frames), nil
}

// TestPingpongLastACKLost: the client's ACK of the server's last SEND is
// lost. The client must keep its QP long enough to answer the
// retransmission, or the server's last send fails with RETRY_EXC_ERR.
func TestPingpongLastACKLost(t *testing.T) {
	a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	ma, mb := memlink.PairWithOptions(memlink.Options{AtoB: faultnet.Config{}, BtoA: faultnet.Config{}})
	la := &dropFirstACK{Link: ma}
	da, err := roce.OpenLink(la, roce.Options{Addrs: []netip.Addr{a}, Neighbours: map[netip.Addr]net.HardwareAddr{b: mb.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	db, err := roce.OpenLink(mb, roce.Options{Addrs: []netip.Addr{b}, Neighbours: map[netip.Addr]net.HardwareAddr{a: ma.HardwareAddr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One iteration: the client sends, the server answers, and the only
	// ACK the client sends is the one for that answer.
	cfg := PingpongConfig{Type: roce.RC, Size: 64, Iters: 1, GIDIndex: -1}
	srv := make(chan error, 1)
	go func() {
		var out bytes.Buffer
		_, err := Pingpong(ctx, db, OOB{Listener: ln}, cfg, &out)
		srv <- err
	}()
	var out bytes.Buffer
	if _, err := Pingpong(ctx, da, OOB{Dial: DialRetry(ln.Addr().String(), time.Second)}, cfg, &out); err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := <-srv; err != nil {
		t.Fatalf("server: %v (the client closed its QP before the retransmission)", err)
	}
	if !la.dropped.Load() {
		t.Fatal("no ACK was dropped: the test did not test anything")
	}
}
