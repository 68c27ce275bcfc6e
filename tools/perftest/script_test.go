// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runPair runs RunScript at both ends of a pipe with the hooks each end's
// function builds, and returns both outcomes.
func runPair(t *testing.T, verb Verb, hooks func(role Role, me Dest) Hooks) (srv, cli Outcome) {
	t.Helper()
	a, b := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		o   Outcome
		err error
	}
	done := make(chan res, 1)
	go func() {
		me := Dest{QPN: 0x100}
		o, err := RunScript(ctx, NewConn(a, Server), verb, false, me, hooks(Server, me))
		done <- res{o, err}
	}()
	me := Dest{QPN: 0x200}
	cli, err := RunScript(ctx, NewConn(b, Client), verb, false, me, hooks(Client, me))
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	return r.o, cli
}

// tcpPair returns both ends of a loopback TCP connection: the closing
// exchange needs a buffered transport, as perftest has.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// With several QPs every QP's record reaches the peer, in order, before
// the further QPs are connected, for each kind of bandwidth script.
func TestRunScriptSeveralQPs(t *testing.T) {
	for _, verb := range []Verb{Send, Write, Read, Atomic} {
		t.Run(verb.String(), func(t *testing.T) {
			more := func(base uint32) []Dest { return []Dest{{QPN: base + 1}, {QPN: base + 2}} }
			var mu sync.Mutex
			connected := map[Role][]Dest{}
			srv, cli := runPair(t, verb, func(role Role, me Dest) Hooks {
				return Hooks{
					More: more(me.QPN),
					ConnectMore: func(_ context.Context, rem []Dest) error {
						mu.Lock()
						connected[role] = slices.Clone(rem)
						mu.Unlock()
						return nil
					},
					Run: func(context.Context) (BWReport, error) { return BWReport{Size: 1, Iters: 3}, nil },
				}
			})
			if srv.Remote.QPN != 0x200 || cli.Remote.QPN != 0x100 {
				t.Errorf("first records: %#x %#x", srv.Remote.QPN, cli.Remote.QPN)
			}
			if !slices.Equal(srv.MoreRemote, more(0x200)) || !slices.Equal(cli.MoreRemote, more(0x100)) {
				t.Errorf("further records: server %v, client %v", srv.MoreRemote, cli.MoreRemote)
			}
			if !slices.Equal(connected[Server], more(0x200)) || !slices.Equal(connected[Client], more(0x100)) {
				t.Errorf("connected: %v", connected)
			}
		})
	}
}

// -b: both sides run and each receives the other's report.
func TestRunScriptDuplex(t *testing.T) {
	var runs atomic.Int32
	srv, cli := runPair(t, Write, func(role Role, me Dest) Hooks {
		return Hooks{Duplex: true, Run: func(context.Context) (BWReport, error) {
			runs.Add(1)
			return BWReport{Size: 8, Iters: uint64(10 + role)}, nil
		}}
	})
	if runs.Load() != 2 || srv.RemoteReport == nil || cli.RemoteReport == nil ||
		srv.RemoteReport.Iters != 11 || cli.RemoteReport.Iters != 10 {
		t.Errorf("runs %d, server got %+v, client got %+v", runs.Load(), srv.RemoteReport, cli.RemoteReport)
	}
	// Refused where perftest's script differs.
	a, _ := net.Pipe()
	defer a.Close()
	if _, err := RunScript(context.Background(), NewConn(a, Client), Send, false, Dest{}, Hooks{Duplex: true}); err == nil {
		t.Error("duplex send script accepted")
	}
}
