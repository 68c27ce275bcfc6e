//go:build linux

package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// loPair returns two addresses of lo of this run's own (127.R.S.5 and .6),
// so that a second copy of the suite beside this one binds others.
func loPair() (srv, cli string) {
	r := rand.Uint32()
	return fmt.Sprintf("127.%d.%d.5", 20+r%200, r>>8&0xff), fmt.Sprintf("127.%d.%d.6", 20+r%200, r>>8&0xff)
}

// runPair runs a server command and then its client, as two processes on
// one host would; the client is retried until it succeeds or a minute has
// passed (the server may not listen yet: a REJ, a refused exchange, or a
// REQ that met no device). It returns both outputs.
func runPair(t *testing.T, server, client []string) (srvOut, cliOut string) {
	t.Helper()
	var wg sync.WaitGroup
	so, se := &syncBuffer{}, &syncBuffer{}
	srvCode := -1
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvCode = run(server, so, se)
	}()
	var co, ce *syncBuffer
	code := -1
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		co, ce = &syncBuffer{}, &syncBuffer{}
		code = run(client, co, ce)
		if code == 0 {
			break
		}
	}
	if code != 0 {
		t.Fatalf("client: exit %d\n%s%s\nserver so far:\n%s%s", code, co.String(), ce.String(), so.String(), se.String())
	}
	wg.Wait()
	if srvCode != 0 {
		t.Fatalf("server: exit %d\n%s%s", srvCode, so.String(), se.String())
	}
	for _, s := range []string{se.String(), ce.String()} {
		if strings.Contains(s, "not published") {
			t.Errorf("counters not published: %s", s)
		}
	}
	return so.String(), co.String()
}

// TestTwoProcessesOnLo: an rstream server and client on one host, each on
// its own 127.0.0.x of lo over the kernel UDP link, as the README shows in
// two shells. Each binds the address it is given (before, both bound
// 127.0.0.1:4791 and the second failed with "address already in use"), and
// both publish their counters (the second as lo@ADDR).
func TestTwoProcessesOnLo(t *testing.T) {
	srv, cli := loPair()
	common := []string{"rstream", "-link", "udp", "-S", "4096", "-C", "200", "-p", "7571"}
	so, co := runPair(t, append(append([]string{}, common...), "-b", srv),
		append(append([]string{}, common...), "-s", srv, "-b", cli))
	if !strings.Contains(co, "custom") || !strings.Contains(so, "custom") {
		t.Fatalf("no result line:\nclient %s\nserver %s", co, so)
	}
}

// TestTwoPerfProcessesOnLo: perf's server and client on one host, each
// bound to its own 127.0.0.x with -J (perftest's --bind_source_ip).
func TestTwoPerfProcessesOnLo(t *testing.T) {
	srv, cli := loPair()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	common := []string{"perf", "write-bw", "-d", "lo", "--link", "udp", "-s", "4096", "-n", "200", "-p", port, "--timeout", "60s"}
	_, co := runPair(t, append(append([]string{}, common...), "-J", srv),
		append(append([]string{}, common...), "-J", cli, srv))
	if !strings.Contains(co, "4096") {
		t.Fatalf("no result row:\n%s", co)
	}
}
