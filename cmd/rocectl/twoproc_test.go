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

// TestTwoProcessesOnLo: an rstream server and client on one host, each on
// its own 127.0.0.x of lo over the kernel UDP link, as the README shows in
// two shells. Each binds the address it is given (before, both bound
// 127.0.0.1:4791 and the second failed with "address already in use"), and
// both publish their counters (the second as lo@ADDR).
func TestTwoProcessesOnLo(t *testing.T) {
	// Addresses of this run's own, so that a second copy of the suite
	// beside this one binds others.
	r := rand.Uint32()
	srv := fmt.Sprintf("127.%d.%d.5", 20+r%200, r>>8&0xff)
	cli := fmt.Sprintf("127.%d.%d.6", 20+r%200, r>>8&0xff)
	var wg sync.WaitGroup
	srvOut, srvErr := &syncBuffer{}, &syncBuffer{}
	srvCode := -1
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvCode = run([]string{"rstream", "-b", srv, "-link", "udp", "-S", "4096", "-C", "200", "-p", "7571"}, srvOut, srvErr)
	}()
	// The client retries until the server listens (rstream does not; its
	// connect fails at once while nothing listens).
	var cliOut, cliErr *syncBuffer
	code := -1
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		cliOut, cliErr = &syncBuffer{}, &syncBuffer{}
		code = run([]string{"rstream", "-s", srv, "-b", cli, "-link", "udp", "-S", "4096", "-C", "200", "-p", "7571"}, cliOut, cliErr)
		if code == 0 || strings.Contains(cliErr.String(), "address already in use") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != 0 {
		t.Fatalf("client: exit %d\n%s%s\nserver so far:\n%s%s", code, cliOut.String(), cliErr.String(), srvOut.String(), srvErr.String())
	}
	wg.Wait()
	if srvCode != 0 {
		t.Fatalf("server: exit %d\n%s%s", srvCode, srvOut.String(), srvErr.String())
	}
	for _, s := range []string{srvErr.String(), cliErr.String()} {
		if strings.Contains(s, "not published") {
			t.Errorf("counters not published: %s", s)
		}
	}
	if !strings.Contains(cliOut.String(), "custom") || !strings.Contains(srvOut.String(), "custom") {
		t.Fatalf("no result line:\nclient %s\nserver %s", cliOut.String(), srvOut.String())
	}
	t.Logf("client:\n%s", cliOut.String())
}

// TestTwoPerfProcessesOnLo: perf's server and client on one host, each
// bound to its own 127.0.0.x with -J (perftest's --bind_source_ip).
func TestTwoPerfProcessesOnLo(t *testing.T) {
	r := rand.Uint32()
	srv := fmt.Sprintf("127.%d.%d.5", 20+r%200, r>>8&0xff)
	cli := fmt.Sprintf("127.%d.%d.6", 20+r%200, r>>8&0xff)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skip(err)
	}
	port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	common := []string{"perf", "write-bw", "-d", "lo", "--link", "udp", "-s", "4096", "-n", "200", "-p", port, "--timeout", "60s"}
	var wg sync.WaitGroup
	srvOut, srvErr := &syncBuffer{}, &syncBuffer{}
	srvCode := -1
	wg.Add(1)
	go func() {
		defer wg.Done()
		srvCode = run(append(append([]string{}, common...), "-J", srv), srvOut, srvErr)
	}()
	var cliOut, cliErr *syncBuffer
	code := -1
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		cliOut, cliErr = &syncBuffer{}, &syncBuffer{}
		code = run(append(append([]string{}, common...), "-J", cli, srv), cliOut, cliErr)
		// Until the server listens, the exchange's TCP connect is refused.
		if code == 0 || !strings.Contains(cliErr.String()+cliOut.String(), "refused") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != 0 {
		t.Fatalf("client: exit %d\n%s%s\nserver so far:\n%s%s", code, cliOut.String(), cliErr.String(), srvOut.String(), srvErr.String())
	}
	wg.Wait()
	if srvCode != 0 {
		t.Fatalf("server: exit %d\n%s%s", srvCode, srvOut.String(), srvErr.String())
	}
	if !strings.Contains(cliOut.String(), "4096") {
		t.Fatalf("no result row:\n%s", cliOut.String())
	}
}
