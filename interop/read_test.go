// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package interop

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
)

// perftestDest is one 108-byte perftest address record:
// "LID:OUT_READS:QPN:PSN:RKEY:VADDR:" in hex, the 16 GID bytes as "%02x:",
// one more hex field (SRQN) and ":", sent with its NUL.
type perftestDest struct {
	LID      uint16
	OutReads uint16
	QPN      uint32
	PSN      ib.PSN
	RKey     uint32
	VAddr    uint64
	GID      ib.GID
	SRQN     uint32
}

const perftestRecordLen = 108

func (d perftestDest) wire() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", d.LID, d.OutReads, d.QPN, uint32(d.PSN), d.RKey, d.VAddr)
	for _, x := range d.GID {
		fmt.Fprintf(&b, "%02x:", x)
	}
	fmt.Fprintf(&b, "%08x:", d.SRQN)
	return append([]byte(b.String()), 0)
}

func parsePerftestDest(b []byte) (perftestDest, error) {
	s := string(bytes.TrimRight(b, "\x00"))
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return perftestDest{}, fmt.Errorf("bad perftest record %q", s)
	}
	var v [7]uint64
	for i, x := range append(f[:6:6], f[22]) {
		n, err := strconv.ParseUint(x, 16, 64)
		if err != nil {
			return perftestDest{}, fmt.Errorf("bad perftest record %q: %w", s, err)
		}
		v[i] = n
	}
	gid, err := hex.DecodeString(strings.Join(f[6:22], ""))
	if err != nil || len(gid) != 16 {
		return perftestDest{}, fmt.Errorf("bad GID in perftest record %q", s)
	}
	return perftestDest{LID: uint16(v[0]), OutReads: uint16(v[1]), QPN: uint32(v[2]), PSN: ib.PSN(v[3]),
		RKey: uint32(v[4]), VAddr: v[5], GID: ib.GID(gid), SRQN: uint32(v[6])}, nil
}

func TestPerftestDestWire(t *testing.T) {
	// A record of the captured ib_read_lat exchange.
	const captured = "0000:0080:000014:b7d11b:000005ed:0000564b8ebec000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:03:00000000:\x00"
	d, err := parsePerftestDest([]byte(captured))
	if err != nil {
		t.Fatal(err)
	}
	want := perftestDest{OutReads: 0x80, QPN: 0x14, PSN: 0xb7d11b, RKey: 0x5ed, VAddr: 0x564b8ebec000,
		GID: ib.GIDFromAddr(netip.MustParseAddr("10.77.0.3"))}
	if d != want {
		t.Fatalf("parsed %+v, want %+v", d, want)
	}
	if got := d.wire(); string(got) != captured || len(got) != perftestRecordLen {
		t.Fatalf("wire() = %q (%d bytes), want the captured record", got, len(got))
	}
}

// TestRCReadLatency plays the client of perftest's ib_read_lat (server in
// the guest): perftest's TCP exchange, then RDMA READ requests (RETH with
// the guest's VA and R_Key) that rxe must answer with READ responses (AETH,
// segmented at the path MTU), PSNs advancing by the response packet count.
func TestRCReadLatency(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, size := range []int{64, g.ActiveMTU + 904} {
		t.Run(fmt.Sprintf("size%d", size), func(t *testing.T) { readLatClient(t, lab, g, size, 5) })
	}
}

func readLatClient(t *testing.T, lab *rxelab.Lab, g *rxelab.Guest, size, iters int) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, families[0])
	host := openHostPort(t, lab)
	job := g.Start(ctx, "ib_read_lat", "-d", "rxe0", "-x", strconv.Itoa(gidIndex), "-F",
		"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
	defer func() {
		cancel()
		job.Wait()
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("%s\nguest exit %d\nstdout: %s\nstderr: %s", fmt.Sprintf(format, args...), code, stdout, stderr)
	}

	xchg, me, remote := perftestSetup(ctx, t, lab, g, local, remoteAddr, job, fail)
	q := &rcHostQP{
		t: t, host: host,
		spec: ib.FrameSpec{
			SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC), Src: local, Dst: remoteAddr,
			HopLimit: 64, DontFragment: true, SrcPort: rcSourcePort(me.QPN, remote.QPN),
		},
		want: peerExpect{local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
			localQPN: me.QPN, remoteQPN: remote.QPN},
		out: make([]byte, 16384), in: make([]byte, 65536),
	}
	psn := me.PSN
	pmtu := 0 // the QP's path MTU, learnt from the first multi-packet response
	npkts := 0
	var rtts []time.Duration
	for i := 0; i < iters; i++ {
		s := q.spec
		s.BTH = ib.BTHFields{Opcode: ib.RCReadRequest, PKey: 0xFFFF, DestQP: remote.QPN, PSN: psn, AckReq: true}
		s.RETH = &ib.RETHFields{VA: remote.VAddr, RKey: remote.RKey, DMALen: uint32(size)}
		ts := time.Now()
		if err := q.send(&s); err != nil {
			t.Fatal(err)
		}
		var data []byte
		npkts = 0
		for k := 0; ; k++ {
			var p ib.Packet
			rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
			frame, err := host.recv(rctx, q.in, func(fr []byte) bool {
				return ib.Parse(fr, &p) == nil && p.BTH.Opcode().Transport() == ib.TransportRC &&
					p.BTH.DestQP() == me.QPN
			})
			rcancel()
			if err != nil {
				fail("READ %d: response packet %d: %v\nrxe counters:\n%s", i, k, err, rxeCounters(g))
			}
			q.checkCommon(&p, frame)
			op := p.BTH.Opcode()
			if k == 0 && op == ib.RCReadResponseFirst && pmtu == 0 {
				pmtu = len(p.Payload)
				if m, ok := ib.MTUFromBytes(pmtu); !ok || m.Bytes() != pmtu {
					fail("READ_RESPONSE_FIRST of %d bytes: not an IB MTU", pmtu)
				}
			}
			left := size - len(data)
			want := ib.RCReadResponseMiddle
			switch {
			case k == 0 && (pmtu == 0 || left <= pmtu):
				want = ib.RCReadResponseOnly
			case k == 0:
				want = ib.RCReadResponseFirst
			case left <= pmtu:
				want = ib.RCReadResponseLast
			}
			if op != want || p.BTH.PSN() != psn.Add(uint32(k)) {
				fail("READ %d: got %v PSN %#06x, want %v PSN %#06x", i, op, uint32(p.BTH.PSN()), want, uint32(psn.Add(uint32(k))))
			}
			// READ responses carry an AETH on the first, last or only packet.
			if hasAETH := want != ib.RCReadResponseMiddle; (p.AETH != nil) != hasAETH {
				t.Errorf("%v with AETH %v", op, p.AETH != nil)
			} else if hasAETH {
				if a := p.AETH.Fields(); a.Syndrome.Type() != ib.SyndromeACK || a.MSN != uint32(i+1) {
					t.Errorf("%v AETH %v MSN %d, want ACK MSN %d", op, a.Syndrome, a.MSN, i+1)
				}
			}
			if want == ib.RCReadResponseFirst || want == ib.RCReadResponseMiddle {
				if len(p.Payload) != pmtu {
					t.Errorf("%v carries %d bytes, path MTU %d", op, len(p.Payload), pmtu)
				}
			}
			data = append(data, p.Payload...)
			npkts++
			if want == ib.RCReadResponseOnly || want == ib.RCReadResponseLast {
				break
			}
		}
		rtts = append(rtts, time.Since(ts))
		if len(data) != size {
			t.Errorf("READ %d returned %d bytes, want %d", i, len(data), size)
		}
		if t.Failed() {
			fail("READ %d: bad responses", i)
		}
		// A READ request uses one PSN per response packet.
		psn = psn.Add(uint32(npkts))
	}
	xchg("final sync", me.wire())
	xchg("done", []byte("done\x00"))
	stdout, stderr, code := stopJob(job, cancel)
	if code != 0 {
		t.Fatalf("ib_read_lat: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	t.Logf("%d READs of %d bytes, %d response packets each (path MTU %d), rtt %v", iters, size, npkts, pmtu, rtts)
}

// perftestSetup connects to the perftest server in g and runs the exchange
// up to the start of the test: preamble, address record and 3 syncs. xchg
// then sends one message and returns the server's of the same length.
func perftestSetup(ctx context.Context, t *testing.T, lab *rxelab.Lab, g *rxelab.Guest, local, remoteAddr netip.Addr,
	job *rxelab.Job, fail func(string, ...any)) (xchg func(string, []byte) []byte, me, remote perftestDest) {
	t.Helper()
	var conn net.Conn
	for conn == nil {
		err := lab.InPeerNS(func() error {
			var err error
			conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(g.Addr, rxelab.OOBPort).String(), rxelab.DialTimeout)
			return err
		})
		if err != nil {
			select {
			case <-job.Done():
				fail("the perftest server exited before accepting: %v", err)
			case <-ctx.Done():
				fail("connecting to the perftest server: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(3 * time.Minute))
	// xchg sends ours and reads the server's message of the same length.
	xchg = func(what string, b []byte) []byte {
		t.Helper()
		if _, err := conn.Write(b); err != nil {
			fail("perftest exchange, %s: %v", what, err)
		}
		r := make([]byte, len(b))
		if _, err := io.ReadFull(conn, r); err != nil {
			fail("perftest exchange, %s: %v", what, err)
		}
		return r
	}
	// The preamble exactly as the captured client sent it: version string,
	// two 4-byte values, a 2-byte value (none depends on -s); the server
	// answers each with its own.
	version := make([]byte, 16)
	copy(version, "6.06")
	if v := xchg("version", version); !bytes.HasPrefix(v, []byte("6.")) {
		t.Logf("server perftest version %q", bytes.TrimRight(v, "\x00"))
	}
	xchg("first value", []byte{0, 0, 0x10, 0})
	xchg("second value", []byte{0, 0, 0, 0x40})
	xchg("last value", []byte("3\x00"))

	me = perftestDest{OutReads: 0x80, QPN: 0x100 + rand.Uint32N(0xFFFE00), PSN: ib.PSN(rand.Uint32N(1 << 24)),
		RKey: rand.Uint32(), VAddr: 0x7f0000000000, GID: ib.GIDFromAddr(local)}
	for k := 0; k < 4; k++ { // address, then the sync points before the test
		r := xchg("address record", me.wire())
		d, err := parsePerftestDest(r)
		if err != nil {
			fail("%v", err)
		}
		if k == 0 {
			remote = d
		} else if d != remote {
			t.Errorf("record %d differs from the first: %+v", k, d)
		}
	}
	t.Logf("guest QPN %#06x PSN %#06x R_Key %#x VA %#x GID %v; ours QPN %#06x PSN %#06x R_Key %#x VA %#x",
		remote.QPN, uint32(remote.PSN), remote.RKey, remote.VAddr, remote.GID, me.QPN, uint32(me.PSN), me.RKey, me.VAddr)
	if remote.GID != ib.GIDFromAddr(remoteAddr) {
		fail("guest GID %v, want %v", remote.GID, ib.GIDFromAddr(remoteAddr))
	}

	return xchg, me, remote
}

// TestRCWriteLatency plays the client of perftest's ib_write_lat (server in
// the guest): each iteration the server RDMA WRITEs our advertised VA and
// R_Key (the last byte the iteration number), which we check and ACK; then
// we RDMA WRITE the guest's buffer (RETH with its VA and R_Key, the last byte
// the iteration number, which the server polls for) and rxe ACKs it.
func TestRCWriteLatency(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, size := range []int{8, 2000} {
		t.Run(fmt.Sprintf("size%d", size), func(t *testing.T) {
			const iters = 5
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			local, remoteAddr, gidIndex := endpoints(t, lab, g, families[0])
			host := openHostPort(t, lab)
			job := g.Start(ctx, "ib_write_lat", "-d", "rxe0", "-x", strconv.Itoa(gidIndex), "-F",
				"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
			defer func() {
				cancel()
				job.Wait()
			}()
			fail := func(format string, args ...any) {
				t.Helper()
				stdout, stderr, code := stopJob(job, cancel)
				t.Fatalf("%s\nguest exit %d\nstdout: %s\nstderr: %s\nrxe counters:\n%s",
					fmt.Sprintf(format, args...), code, stdout, stderr, rxeCounters(g))
			}
			_, me, remote := perftestSetup(ctx, t, lab, g, local, remoteAddr, job, fail)
			q := &rcHostQP{
				t: t, host: host,
				spec: ib.FrameSpec{
					SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC), Src: local, Dst: remoteAddr,
					HopLimit: 64, DontFragment: true, SrcPort: rcSourcePort(me.QPN, remote.QPN),
				},
				want: peerExpect{local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
					localQPN: me.QPN, remoteQPN: remote.QPN},
				sqPSN: me.PSN, ePSN: remote.PSN,
				outRETH: &ib.RETHFields{VA: remote.VAddr, RKey: remote.RKey, DMALen: uint32(size)},
				// The server writes first; the client writes i only after
				// it has seen i (perftest's run_iter_lat_write).
				answer: true,
				out:    make([]byte, 16384), in: make([]byte, 65536),
			}
			var rtts []time.Duration
			for i := 1; i <= iters; i++ {
				msg := bytes.Repeat([]byte{0x3c}, size)
				msg[size-1] = byte(i)
				ts := time.Now()
				got, err := q.pingpong(ctx, msg, uint32(i))
				if err != nil {
					fail("WRITE %d: %v\npackets:\n%s", i, err, q.traceString())
				}
				rtts = append(rtts, time.Since(ts))
				if !q.inWrite {
					t.Errorf("iteration %d: rxe sent a SEND, want an RDMA WRITE", i)
				}
				if want := (ib.RETHFields{VA: me.VAddr, RKey: me.RKey, DMALen: uint32(size)}); q.inRETH != want {
					t.Errorf("iteration %d: rxe's RETH %+v, want %+v", i, q.inRETH, want)
				}
				if len(got) != size || got[size-1] != byte(i) {
					t.Errorf("iteration %d: rxe wrote %d bytes ending %#x, want %d ending %#x", i, len(got), got[len(got)-1], size, i)
				}
				if t.Failed() {
					fail("iteration %d: bad frames", i)
				}
			}
			// Unlike ib_read_lat's passive server, this one ends on its own
			// after its last iteration: no closing exchange.
			stdout, stderr, code := stopJob(job, cancel)
			if code != 0 || !bytes.Contains(stdout, []byte("t_typical")) {
				t.Fatalf("ib_write_lat: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
			t.Logf("%d WRITEs of %d bytes each way, rtt %v; %d packets out, %d in", iters, size, rtts, q.pktsOut, q.pktsIn)
		})
	}
}

// TestRCAtomic plays the client of perftest's ib_atomic_lat (passive server
// in the guest) with both atomics on the guest's 8-byte target: FETCH_ADD
// (AtomicETH addend) must return the running value in the ATOMIC_ACKNOWLEDGE's
// AtomicAckETH, and COMPARE_SWAP must swap only when Compare matches.
func TestRCAtomic(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, families[0])
	host := openHostPort(t, lab)
	job := g.Start(ctx, "ib_atomic_lat", "-d", "rxe0", "-x", strconv.Itoa(gidIndex), "-F", "-n", "5")
	defer func() {
		cancel()
		job.Wait()
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("%s\nguest exit %d\nstdout: %s\nstderr: %s\nrxe counters:\n%s",
			fmt.Sprintf(format, args...), code, stdout, stderr, rxeCounters(g))
	}
	xchg, me, remote := perftestSetup(ctx, t, lab, g, local, remoteAddr, job, fail)
	q := &rcHostQP{
		t: t, host: host,
		spec: ib.FrameSpec{
			SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC), Src: local, Dst: remoteAddr,
			HopLimit: 64, DontFragment: true, SrcPort: rcSourcePort(me.QPN, remote.QPN),
		},
		want: peerExpect{local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
			localQPN: me.QPN, remoteQPN: remote.QPN},
		out: make([]byte, 16384), in: make([]byte, 65536),
	}
	psn := me.PSN
	msn := uint32(0)
	atomic := func(op ib.Opcode, swapAdd, compare uint64) uint64 {
		t.Helper()
		s := q.spec
		s.BTH = ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: remote.QPN, PSN: psn, AckReq: true}
		s.AtomicETH = &ib.AtomicETHFields{VA: remote.VAddr, RKey: remote.RKey, SwapAdd: swapAdd, Compare: compare}
		if err := q.send(&s); err != nil {
			t.Fatal(err)
		}
		var p ib.Packet
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		frame, err := host.recv(rctx, q.in, func(fr []byte) bool {
			return ib.Parse(fr, &p) == nil && p.BTH.Opcode().Transport() == ib.TransportRC && p.BTH.DestQP() == me.QPN
		})
		rcancel()
		if err != nil {
			fail("%v: no answer: %v", op, err)
		}
		q.checkCommon(&p, frame)
		msn++
		if p.BTH.Opcode() != ib.RCAtomicAck || p.BTH.PSN() != psn || p.AETH == nil || p.AtomicAckETH == nil {
			fail("%v PSN %#06x answered by %v PSN %#06x", op, uint32(psn), p.BTH.Opcode(), uint32(p.BTH.PSN()))
		}
		if a := p.AETH.Fields(); a.Syndrome.Type() != ib.SyndromeACK || a.MSN != msn {
			t.Errorf("%v: AETH %v MSN %d, want ACK MSN %d", op, a.Syndrome, a.MSN, msn)
		}
		psn = psn.Next()
		return p.AtomicAckETH.Orig()
	}
	const add = 0x0102030405
	prev := atomic(ib.RCFetchAdd, add, 0)
	for i := 1; i < 5; i++ {
		if got := atomic(ib.RCFetchAdd, add, 0); got != prev+add {
			t.Errorf("FETCH_ADD %d returned %#x, want %#x", i, got, prev+add)
		}
		prev += add
	}
	v := prev + add // the target's value now
	if got := atomic(ib.RCCompareSwap, 0x1111, v^1); got != v {
		t.Errorf("COMPARE_SWAP with a wrong Compare returned %#x, want %#x", got, v)
	}
	if got := atomic(ib.RCCompareSwap, 0xfeedface, v); got != v {
		t.Errorf("COMPARE_SWAP with the right Compare returned %#x, want %#x", got, v)
	}
	if got := atomic(ib.RCCompareSwap, 0x2222, 0xfeedface); got != 0xfeedface {
		t.Errorf("COMPARE_SWAP after the swap returned %#x, want 0xfeedface (the first swap did not happen)", got)
	}
	xchg("final sync", me.wire())
	xchg("done", []byte("done\x00"))
	stdout, stderr, code := stopJob(job, cancel)
	if code != 0 {
		t.Fatalf("ib_atomic_lat: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	t.Logf("5 FETCH_ADDs and 3 COMPARE_SWAPs on VA %#x; final value 0x2222", remote.VAddr)
}
