// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package qual

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/cmd/rocectl/perfcmd"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

type pingpongCase struct {
	typ    roce.QPType
	size   int
	mtu    int // RC path MTU
	events bool
	iters  int
}

func (c pingpongCase) tool() string {
	if c.typ == roce.UD {
		return "ibv_ud_pingpong"
	}
	return "ibv_rc_pingpong"
}

func (c pingpongCase) name() string {
	n := fmt.Sprintf("size%d", c.size)
	if c.typ == roce.RC {
		n += fmt.Sprintf("/mtu%d", c.mtu)
	}
	if c.events {
		n += "/events"
	}
	return n
}

// TestRCPingpong runs ibv_rc_pingpong in the guest against rocectl's
// pingpong on goroce, each as server and as client: the whole RC stack
// (connection, SEND segmentation at the path MTU, ACKs, PSNs) against rxe.
// The tools echo what they receive, so every message after the first must
// come back as the bytes we sent.
func TestRCPingpong(t *testing.T) {
	e := setup(t)
	var cases []pingpongCase
	for _, mtu := range []int{1024, 2048} {
		for _, size := range []int{1, 1024, 4096, 10000} {
			cases = append(cases, pingpongCase{typ: roce.RC, size: size, mtu: mtu, iters: 50})
		}
		cases = append(cases, pingpongCase{typ: roce.RC, size: 4096, mtu: mtu, events: true, iters: 50})
	}
	for _, c := range cases {
		t.Run("goroce-server/"+c.name(), func(t *testing.T) { pingpongGoroceServer(t, e, c) })
		t.Run("goroce-client/"+c.name(), func(t *testing.T) { pingpongGoroceClient(t, e, c) })
	}
}

// TestUDPingpong is TestRCPingpong for ibv_ud_pingpong (UD SENDs with GRH,
// Q_Key, address handles).
func TestUDPingpong(t *testing.T) {
	e := setup(t)
	var cases []pingpongCase
	for _, size := range []int{1, 512, 1024, 2048} {
		cases = append(cases, pingpongCase{typ: roce.UD, size: size, iters: 50})
	}
	cases = append(cases, pingpongCase{typ: roce.UD, size: 1024, events: true, iters: 50})
	for _, c := range cases {
		t.Run("goroce-server/"+c.name(), func(t *testing.T) { pingpongGoroceServer(t, e, c) })
		t.Run("goroce-client/"+c.name(), func(t *testing.T) { pingpongGoroceClient(t, e, c) })
	}
}

func (c pingpongCase) toolArgs(e *env, server string) []string {
	args := []string{c.tool(), "-d", "rxe0", "-g", itoa(e.gidIndex), "-s", itoa(c.size), "-n", itoa(c.iters)}
	if c.typ == roce.RC {
		args = append(args, "-m", itoa(c.mtu))
	}
	if c.events {
		args = append(args, "-e")
	}
	if server != "" {
		args = append(args, server)
	}
	return args
}

func (c pingpongCase) config() perfcmd.PingpongConfig {
	m, _ := ib.MTUFromBytes(c.mtu)
	return perfcmd.PingpongConfig{Type: c.typ, Size: c.size, Iters: c.iters, MTU: m, Events: c.events, GIDIndex: -1}
}

func pingpongGoroceServer(t *testing.T, e *env, c pingpongCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	oob := e.listen(t)
	t0 := time.Now()
	_, wait := e.start(ctx, c.toolArgs(e, e.lab.PeerAddr.String())...)
	var out bytes.Buffer
	res, err := perfcmd.Pingpong(ctx, e.dev, oob, c.config(), &out)
	tool := wait()
	if err != nil || !tool.ok() {
		t.Fatalf("goroce server: %v\n%s\nour output:\n%s\nguest %s\n%s", err, out.String(), out.String(), tool, e.counters())
	}
	checkPingpong(t, c, res, out.String(), tool)
	t.Logf("%s client in the guest, goroce server: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.stdout)
}

func pingpongGoroceClient(t *testing.T, e *env, c pingpongCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	job, wait := e.start(ctx, c.toolArgs(e, "")...)
	var out bytes.Buffer
	res, err := perfcmd.Pingpong(ctx, e.dev, e.dialer(job.Done()), c.config(), &out)
	if err != nil {
		cancel()
	}
	tool := wait()
	if err != nil || !tool.ok() {
		t.Fatalf("goroce client: %v\nour output:\n%s\nguest %s\n%s", err, out.String(), tool, e.counters())
	}
	checkPingpong(t, c, res, out.String(), tool)
	t.Logf("%s server in the guest, goroce client: %.1fs\n%s%s", c.tool(), time.Since(t0).Seconds(), out.String(), tool.stdout)
}

func checkPingpong(t *testing.T, c pingpongCase, res *perfcmd.PingpongResult, ours string, tool toolResult) {
	t.Helper()
	want := fmt.Sprintf("%d iters in", c.iters)
	if !strings.Contains(tool.stdout, want) || !strings.Contains(ours, want) {
		t.Errorf("result lines missing %q\nours:\n%s\ntool:\n%s", want, ours, tool.stdout)
	}
	// Each side's remote line is the other's local line.
	ourLocal := lineWith(ours, "local address:")
	toolRemote := lineWith(tool.stdout, "remote address:")
	if f1, f2 := addrFields(ourLocal), addrFields(toolRemote); f1 != f2 {
		t.Errorf("tool saw us as %q, we announced %q", toolRemote, ourLocal)
	}
	if res.Received != c.iters {
		t.Errorf("received %d messages, want %d", res.Received, c.iters)
	}
	wantEcho := res.Received
	if res.FirstFromPeer {
		wantEcho-- // the tool's own first buffer
	}
	if res.Echoed < wantEcho {
		t.Errorf("%d of %d messages came back as the bytes we sent, want %d", res.Echoed, res.Received, wantEcho)
	}
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// addrFields returns the QPN, PSN and GID of an address line.
func addrFields(l string) string {
	i := strings.Index(l, "QPN")
	if i < 0 {
		return l
	}
	return strings.NewReplacer(":", ",", " ", "").Replace(l[i:])
}
