// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package cc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/goroce/goroce/interop/qual"
	"github.com/goroce/goroce/interop/rxelab"
	"github.com/goroce/goroce/roce"
	"github.com/goroce/goroce/tools/perftest"
)

// capture collects the device's pcap capture.
type capture struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.Write(p)
}

func (c *capture) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.b.Bytes())
}

var capt capture

func TestMain(m *testing.M) {
	qual.Shared.CC = roce.CCConfig{DCQCN: true}
	qual.Shared.Capture = &capt
	code := rxelab.Main(m, rxelab.Config{Guests: 1, MTU: 1500,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, "rxelab: "+format+"\n", args...) }})
	qual.Shared.Close()
	os.Exit(code)
}

// TestQualWithCC: the pingpong and perftest runs pass against rxe with
// DCQCN on, goroce's RoCE packets carry ECT(0), and no CNP moves.
func TestQualWithCC(t *testing.T) {
	e := qual.Setup(t)
	before := e.Dev.Counters()
	t.Run("pingpong", func(t *testing.T) {
		qual.PingpongBothRoles(t, e, []qual.PingpongCase{
			{Type: roce.RC, Size: 64, MTU: 1024, Iters: 20},
			{Type: roce.RC, Size: 20000, MTU: 1024, Iters: 20},
		})
	})
	t.Run("perftest", func(t *testing.T) {
		qual.PerfBothRoles(t, e, []qual.PerfCase{
			{Verb: perftest.Write, MTU: 1024, Size: 16384, Iters: 200},
			{Verb: perftest.Read, MTU: 1024, Size: 16384, Iters: 200},
			{Verb: perftest.Send, MTU: 1024, Size: 16384, Iters: 200},
			{Verb: perftest.Write, Latency: true, MTU: 1024, Iters: 100},
		})
	})
	after := e.Dev.Counters()
	if d := after.NPCNPSent - before.NPCNPSent; d != 0 {
		t.Errorf("%d CNPs sent to rxe, which never marks CE", d)
	}
	if d := after.RPCNPHandled - before.RPCNPHandled; d != 0 {
		t.Errorf("%d CNPs handled from rxe, which sends none", d)
	}
	ect, other := ecnOfSent(t, capt.bytes(), e.Lab.PeerAddr.As4())
	t.Logf("goroce's RoCE packets to rxe: %d with ECT(0), %d without", ect, other)
	if ect == 0 || other != 0 {
		t.Errorf("RoCE packets sent with congestion control on: %d ECT(0), %d other, want all ECT(0)", ect, other)
	}
}

// ecnOfSent counts the IPv4 RoCEv2 packets from src in a pcap by the ECN
// field of their TOS: ECT(0) or anything else.
func ecnOfSent(t *testing.T, pcap []byte, src [4]byte) (ect, other int) {
	t.Helper()
	if len(pcap) < 24 {
		t.Fatalf("capture of %d bytes", len(pcap))
	}
	le := binary.LittleEndian
	if le.Uint32(pcap) != 0xa1b2c3d4 && le.Uint32(pcap) != 0xa1b23c4d {
		t.Fatalf("not a little-endian pcap: % x", pcap[:4])
	}
	for b := pcap[24:]; len(b) >= 16; {
		n := int(le.Uint32(b[8:]))
		if len(b) < 16+n {
			break
		}
		f := b[16 : 16+n]
		b = b[16+n:]
		// Ethernet, IPv4 without options, UDP to 4791.
		if len(f) < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[14]>>4 != 4 {
			continue
		}
		ip := f[14:]
		if [4]byte(ip[12:16]) != src || ip[9] != 17 || binary.BigEndian.Uint16(ip[int(ip[0]&0xf)*4+2:]) != 4791 {
			continue
		}
		if ip[1]&3 == 2 {
			ect++
		} else {
			other++
		}
	}
	return ect, other
}
