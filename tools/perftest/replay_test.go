// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/goroce/goroce/ib"
)

// labDir is where CI puts the rxe lab's shared captures and results, next
// to the repository.
func labDir(t *testing.T, sub ...string) string {
	t.Helper()
	dir := filepath.Join(append([]string{"..", "..", "..", "shared", "rxe-lab"}, sub...)...)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("rxe lab captures not present (%v): they live in ../shared/rxe-lab next to the repository", err)
	}
	return dir
}

// segment is one TCP payload of a capture.
type segment struct {
	fromServer bool
	data       []byte
}

// tcpSegments returns the payloads of the TCP connection to port 18515 in
// a capture, in order, with the side that sent each.
func tcpSegments(t *testing.T, path string) []segment {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var segs []segment
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 14+20 || binary.BigEndian.Uint16(data[12:]) != 0x0800 {
			continue
		}
		ip := data[14:]
		ihl := int(ip[0]&0xF) * 4
		if ip[9] != 6 || len(ip) < ihl+20 {
			continue
		}
		total := int(binary.BigEndian.Uint16(ip[2:]))
		tcp := ip[ihl:total]
		sport, dport := binary.BigEndian.Uint16(tcp), binary.BigEndian.Uint16(tcp[2:])
		off := int(tcp[12]>>4) * 4
		payload := tcp[off:]
		if len(payload) == 0 || (sport != 18515 && dport != 18515) {
			continue
		}
		segs = append(segs, segment{fromServer: sport == 18515, data: bytes.Clone(payload)})
	}
	if len(segs) == 0 {
		t.Fatalf("%s: no TCP payload on port 18515", path)
	}
	return segs
}

// replayPeer connects us to a peer that plays the recorded other side: it
// sends the peer's segments and reads ours, in capture order, and returns
// what we sent per segment.
func replayPeer(t *testing.T, segs []segment, weAreServer bool) (ours net.Conn, got func() [][]byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ours, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close(); ours.Close() })
	var recv [][]byte
	done := make(chan error, 1)
	go func() {
		peer.SetDeadline(time.Now().Add(10 * time.Second))
		for _, s := range segs {
			if s.fromServer != weAreServer {
				if _, err := peer.Write(s.data); err != nil {
					done <- err
					return
				}
				continue
			}
			b := make([]byte, len(s.data))
			if _, err := io.ReadFull(peer, b); err != nil {
				done <- fmt.Errorf("after %d segments from us: %w", len(recv), err)
				return
			}
			recv = append(recv, b)
		}
		done <- nil
	}()
	return ours, func() [][]byte {
		if err := <-done; err != nil {
			t.Errorf("replayed peer: %v", err)
		}
		return recv
	}
}

func ours(segs []segment, server bool) [][]byte {
	var o [][]byte
	for _, s := range segs {
		if s.fromServer == server {
			o = append(o, s.data)
		}
	}
	return o
}

func TestPingpongReplay(t *testing.T) {
	dir := labDir(t, "captures", "oob")
	for _, name := range []string{"rc_pingpong", "ud_pingpong"} {
		segs := tcpSegments(t, filepath.Join(dir, name+".pcap"))
		for _, server := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/server=%v", name, server), func(t *testing.T) {
				mine := ours(segs, server)
				theirs := ours(segs, !server)
				me, err := ParsePingpongDest(mine[0])
				if err != nil {
					t.Fatal(err)
				}
				want, err := ParsePingpongDest(theirs[0])
				if err != nil {
					t.Fatal(err)
				}
				c, got := replayPeer(t, segs, server)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var rem PingpongDest
				connected := false
				if server {
					rem, err = PingpongServer(ctx, c, me, func(PingpongDest) error { connected = true; return nil })
				} else {
					rem, err = PingpongClient(ctx, c, me)
					connected = true
				}
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				if rem != want || !connected {
					t.Errorf("remote %+v (connected %v), want %+v", rem, connected, want)
				}
				sent := got()
				if len(sent) != len(mine) {
					t.Fatalf("sent %d messages, capture has %d", len(sent), len(mine))
				}
				for i := range sent {
					if !bytes.Equal(sent[i], mine[i]) {
						t.Errorf("message %d: sent %q, capture %q", i, sent[i], mine[i])
					}
				}
			})
		}
	}
}

// perftestCaptures describes the captured perftest runs.
var perftestCaptures = []struct {
	name    string
	verb    Verb
	latency bool
}{
	{"write_bw", Write, false},
	{"send_bw", Send, false},
	{"atomic_bw", Atomic, false},
	{"read_lat", Read, true},
}

func TestPerftestReplay(t *testing.T) {
	dir := labDir(t, "captures", "oob")
	for _, tc := range perftestCaptures {
		segs := tcpSegments(t, filepath.Join(dir, tc.name+".pcap"))
		for _, server := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/server=%v", tc.name, server), func(t *testing.T) {
				mine := ours(segs, server)
				theirs := ours(segs, !server)
				var me, peer Dest
				var err error
				for _, m := range mine {
					if len(m) == DestSize {
						if me, err = ParseDest(m); err != nil {
							t.Fatal(err)
						}
						break
					}
				}
				for _, m := range theirs {
					if len(m) == DestSize {
						if peer, err = ParseDest(m); err != nil {
							t.Fatal(err)
						}
						break
					}
				}
				// The client's report, as the capture carries it.
				var clientRep BWReport
				var reportSegs int
				for _, s := range segs {
					if !s.fromServer && len(s.data) == 8 {
						v := binary.BigEndian.Uint64(s.data)
						switch reportSegs {
						case 0:
							clientRep.Size = v
						case 1:
							clientRep.Iters = v
						case 2:
							clientRep.BWPeak = math.Float64frombits(v)
						case 3:
							clientRep.BWAvg = math.Float64frombits(v)
						case 4:
							clientRep.MsgRate = math.Float64frombits(v)
						}
						reportSegs++
					}
				}

				role := Client
				if server {
					role = Server
				}
				nc, got := replayPeer(t, segs, server)
				c := NewConn(nc, role)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				cycle, line, mtu, err := c.Setup(ctx, ib.MTU1024)
				if err != nil {
					t.Fatal(err)
				}
				if cycle != 4096 || line != 64 || mtu != ib.MTU1024 || c.RemoteVersion != "6.06" {
					t.Errorf("setup: cycle %d line %d mtu %v version %q", cycle, line, mtu, c.RemoteVersion)
				}
				var steps []string
				out, err := RunScript(ctx, c, tc.verb, tc.latency, me, Hooks{
					Connect: func(_ context.Context, rem Dest) error {
						steps = append(steps, "connect")
						if rem != peer {
							t.Errorf("connect to %+v, want %+v", rem, peer)
						}
						return nil
					},
					PrepareRecv: func(context.Context) error { steps = append(steps, "recv"); return nil },
					Run: func(context.Context) (BWReport, error) {
						steps = append(steps, "run")
						return clientRep, nil
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				c.Close()
				sent := got()
				if len(sent) != len(mine) {
					t.Fatalf("sent %d messages, capture has %d", len(sent), len(mine))
				}
				for i := range sent {
					// A perftest server sends an uninitialized report; ours is zero.
					if server && len(sent[i]) == 8 {
						continue
					}
					if !bytes.Equal(sent[i], mine[i]) {
						t.Errorf("message %d: sent %q, capture %q", i, sent[i], mine[i])
					}
				}
				if out.Remote != peer {
					t.Errorf("remote %+v, want %+v", out.Remote, peer)
				}
				if server && reportSegs > 0 {
					if out.RemoteReport == nil || *out.RemoteReport != clientRep {
						t.Errorf("server got report %+v, want %+v", out.RemoteReport, clientRep)
					}
				}
				t.Logf("steps %v", steps)
			})
		}
	}
}

// TestPerftestLogs rebuilds the captured tools' output from what the
// exchange carried: the header for the parameters the commands used, both
// address blocks, and the bandwidth row the server printed from the client's
// report.
func TestPerftestLogs(t *testing.T) {
	dir := labDir(t, "captures", "oob")
	for _, tc := range perftestCaptures {
		segs := tcpSegments(t, filepath.Join(dir, tc.name+".pcap"))
		logText, err := os.ReadFile(filepath.Join(dir, tc.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		sections := splitLog(string(logText))
		for _, server := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/server=%v", tc.name, server), func(t *testing.T) {
				var me, rem Dest
				for _, s := range segs {
					if len(s.data) == DestSize {
						d, err := ParseDest(s.data)
						if err != nil {
							t.Fatal(err)
						}
						if s.fromServer == server {
							me = d
						} else {
							rem = d
						}
					}
				}
				p := &Params{
					Verb: tc.verb, AtomicOp: FetchAndAdd, Latency: tc.latency,
					Device: "rxe0", NumQPs: 1, Conn: "RC", Transport: "IB", PCIeRelax: "ON",
					TxDepth: 5, RxDepth: 6, CQMod: 5, MTU: 1024, LinkType: "Ethernet", GIDIndex: 1,
					OutReads: 128,
				}
				if server {
					p.Role = Server
				} else {
					p.Role = Client
				}
				if tc.latency {
					p.TxDepth = 1
				}
				var b strings.Builder
				b.WriteString(Preamble(p))
				b.WriteString(Header(p))
				b.WriteString(AddrLines(p, false, me))
				b.WriteString(AddrLines(p, true, rem))
				want := sections[server]
				switch {
				case tc.latency && server:
					b.WriteString(Line)
				case tc.latency:
					// The client's row of the read_lat capture: four round
					// trips whose sorted deltas give its figures.
					b.WriteString(ResultColumns(p))
					posted := []time.Duration{0, 750130, 750130 + 797070, 750130 + 797070 + 1025480, 750130 + 797070 + 1025480 + 2000000}
					st, err := LatencyFrom(64, posted, 1)
					if err != nil {
						t.Fatal(err)
					}
					b.WriteString(st.Format())
					b.WriteString(Line)
				default:
					b.WriteString(ResultColumns(p))
					row := lastRow(want)
					b.WriteString(reformatBW(t, p, row))
					b.WriteString(Line)
				}
				if got := b.String(); got != want {
					t.Errorf("output differs\n got:\n%s\nwant:\n%s", got, want)
				}
			})
		}
	}
}

// splitLog returns the server's and the client's stdout from a capture
// log, without perftest's one stderr line.
func splitLog(s string) map[bool]string {
	out := map[bool]string{}
	var cur *strings.Builder
	var bs [2]strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		switch {
		case strings.HasPrefix(l, "=== server"):
			cur = &bs[1]
			continue
		case strings.HasPrefix(l, "=== client"):
			cur = &bs[0]
			continue
		case strings.HasPrefix(l, "Device not recognized"), cur == nil:
			continue
		}
		cur.WriteString(l)
	}
	out[false], out[true] = bs[0].String(), bs[1].String()
	return out
}

func lastRow(s string) string {
	lines := strings.SplitAfter(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], " ") && !strings.HasPrefix(lines[i], " #") && len(strings.Fields(lines[i])) >= 5 {
			return lines[i]
		}
	}
	return ""
}

// reformatBW parses a bandwidth row and formats its numbers again.
func reformatBW(t *testing.T, p *Params, row string) string {
	t.Helper()
	var r BWReport
	if _, err := fmt.Sscan(row, &r.Size, &r.Iters, &r.BWPeak, &r.BWAvg, &r.MsgRate); err != nil {
		t.Fatalf("row %q: %v", row, err)
	}
	return FormatBW(p, r)
}
