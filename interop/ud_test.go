// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package interop

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
)

// pingpongQKey is the Q_Key ibv_ud_pingpong gives its QP and puts in every
// send.
const pingpongQKey = 0x11111111

// family selects the GID (and so the IP version) a test runs over.
type family struct {
	name string
	v6   bool
}

var families = []family{{"IPv4", false}, {"IPv6", true}}

// endpoints returns our address and the guest's for f, and the guest's GID
// index for it.
func endpoints(t *testing.T, lab *rxelab.Lab, g *rxelab.Guest, f family) (local, remote netip.Addr, gidIndex int) {
	t.Helper()
	local, remote = lab.PeerAddr, g.Addr
	if f.v6 {
		local, remote = lab.PeerAddr6, g.Addr6
	}
	if !local.IsValid() || !remote.IsValid() {
		t.Fatalf("the lab runs without %s", f.name)
	}
	idx, ok := g.GIDIndex(remote)
	if !ok {
		t.Fatalf("guest %s has no GID for %v: %v", g.Name, remote, g.GIDs)
	}
	return local, remote, idx
}

// TestUDPingpong plays the client of ibv_ud_pingpong, running as the server
// in a guest, with UD SEND_ONLY frames that ib.Build makes, and checks the
// guest's replies with ib.Parse and the ICRC check. rxe drops a packet whose
// ICRC, headers or Q_Key are wrong, and ibv_ud_pingpong only answers what it
// received, so the exchange completing proves the encoding on a real rxe; each
// reply is also rebuilt with ib.Build from its decoded fields and must come
// out byte for byte as rxe sent it.
func TestUDPingpong(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, f := range families {
		// Sizes: tiny with a 3-byte pad, the brief's 64/512/1024, and one
		// filling the path MTU.
		for _, size := range []int{1, 64, 333, 512, 1024, g.ActiveMTU} {
			t.Run(fmt.Sprintf("%s/size%d", f.name, size), func(t *testing.T) {
				udPingpongClient(t, lab, g, f, size, 5)
			})
		}
	}
}

func udPingpongClient(t *testing.T, lab *rxelab.Lab, g *rxelab.Guest, f family, size, iters int) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, f)
	host := openHostPort(t, lab)

	t0 := time.Now()
	job := g.Start(ctx, "ibv_ud_pingpong", "-d", "rxe0", "-g", strconv.Itoa(gidIndex),
		"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
	defer func() {
		cancel()
		job.Wait()
	}()

	me := pingpongDest{
		QPN: 0x100 + rand.Uint32N(0xFFFE00),
		PSN: ib.PSN(rand.Uint32N(1 << 24)),
		GID: ib.GIDFromAddr(local),
	}
	// The pingpong tools listen on the first address getaddrinfo gives them,
	// IPv4 here, whatever GID they use: the exchange always runs over IPv4.
	remote, err := pingpongClient(ctx, lab, g.Addr, me, job.Done())
	if err != nil {
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("out-of-band exchange: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
	}
	t.Logf("guest QPN %#06x PSN %#06x GID %v; ours QPN %#06x PSN %#06x GID %v (setup %.1fs)",
		remote.QPN, uint32(remote.PSN), remote.GID, me.QPN, uint32(me.PSN), me.GID, time.Since(t0).Seconds())
	if remote.GID != ib.GIDFromAddr(remoteAddr) || remote.LID != 0 {
		t.Fatalf("guest announced LID %#x GID %v, want LID 0 GID of %v", remote.LID, remote.GID, remoteAddr)
	}

	out := make([]byte, 16384)
	in := make([]byte, 65536)
	var rtts []time.Duration
	for i := 0; i < iters; i++ {
		payload := make([]byte, size)
		for j := range payload {
			payload[j] = byte(i*31 + j*7 + 1)
		}
		spec := ib.FrameSpec{
			SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC),
			Src: local, Dst: remoteAddr,
			HopLimit: 64, DontFragment: true, IPID: uint16(i + 1),
			SrcPort: ib.RXESourcePort(me.QPN),
			BTH: ib.BTHFields{
				Opcode: ib.UDSendOnly,
				PKey:   0xFFFF,
				DestQP: remote.QPN,
				PSN:    me.PSN.Add(uint32(i)),
			},
			DETH:    &ib.DETHFields{QKey: pingpongQKey, SrcQP: me.QPN},
			Payload: payload,
		}
		n, err := ib.Build(out, &spec)
		if err != nil {
			t.Fatalf("ib.Build: %v", err)
		}
		frame := out[:n]
		// Our frame must decode as what we meant before it goes out.
		var sent ib.Packet
		if err := ib.Parse(frame, &sent); err != nil {
			t.Fatalf("ib.Parse of our own frame: %v", err)
		}
		if err := sent.VerifyICRC(); err != nil {
			t.Fatalf("ICRC of our own frame: %v", err)
		}

		ts := time.Now()
		if err := host.send(frame); err != nil {
			t.Fatal(err)
		}
		var p ib.Packet
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		reply, err := host.recv(rctx, in, func(fr []byte) bool {
			return ib.Parse(fr, &p) == nil && p.BTH.Opcode() == ib.UDSendOnly && p.BTH.DestQP() == me.QPN
		})
		rcancel()
		if err != nil {
			stdout, stderr, code := stopJob(job, cancel)
			t.Fatalf("ping %d: no UD reply: %v\nguest exit %d\nstdout: %s\nstderr: %s\nrxe counters:\n%s",
				i, err, code, stdout, stderr, rxeCounters(g))
		}
		rtts = append(rtts, time.Since(ts))
		checkUDReply(t, &p, reply, peerExpect{
			local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
			localQPN: me.QPN, remoteQPN: remote.QPN, psn: remote.PSN.Add(uint32(i)),
			payload: payload,
		})
		if t.Failed() {
			stdout, stderr, code := stopJob(job, cancel)
			t.Fatalf("ping %d: bad reply from rxe\nguest exit %d\nstdout: %s\nstderr: %s", i, code, stdout, stderr)
		}
	}

	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 {
		t.Fatalf("ibv_ud_pingpong: exit %d, %v\nstdout: %s\nstderr: %s", code, err, stdout, stderr)
	}
	if want := fmt.Sprintf("%d iters in", iters); !bytes.Contains(stdout, []byte(want)) {
		t.Errorf("ibv_ud_pingpong output lacks %q:\n%s", want, stdout)
	}
	t.Logf("%d round trips, rtt %v; total %.1fs", iters, rtts, time.Since(t0).Seconds())
}

// peerExpect is what frames from the guest must carry (any transport).
type peerExpect struct {
	local, remote       netip.Addr
	localMAC, remoteMAC []byte
	localQPN, remoteQPN uint32
	psn                 ib.PSN
	payload             []byte
}

// checkUDReply checks one UD SEND_ONLY frame rxe sent us.
func checkUDReply(t *testing.T, p *ib.Packet, frame []byte, want peerExpect) {
	t.Helper()
	if err := p.VerifyICRC(); err != nil {
		t.Errorf("ICRC of the guest's frame: %v", err)
	}
	if err := ib.VerifyFrameICRC(frame); err != nil {
		t.Errorf("VerifyFrameICRC of the guest's frame: %v", err)
	}
	if src, dst := p.Eth.Src(), p.Eth.Dst(); !bytes.Equal(src[:], want.remoteMAC) || !bytes.Equal(dst[:], want.localMAC) {
		t.Errorf("Ethernet %x -> %x, want %x -> %x", src, dst, want.remoteMAC, want.localMAC)
	}
	switch {
	case want.local.Is4():
		if p.IPv4 == nil {
			t.Fatalf("reply is not IPv4")
		}
		if p.IPv4.Src() != want.remote || p.IPv4.Dst() != want.local {
			t.Errorf("IPv4 %v -> %v, want %v -> %v", p.IPv4.Src(), p.IPv4.Dst(), want.remote, want.local)
		}
		if !p.IPv4.ChecksumValid() {
			t.Errorf("IPv4 header checksum %#04x invalid", p.IPv4.Checksum())
		}
		if !p.IPv4.DontFragment() {
			t.Errorf("rxe sent IPv4 without DF")
		}
	default:
		if p.IPv6 == nil {
			t.Fatalf("reply is not IPv6")
		}
		if p.IPv6.Src() != want.remote || p.IPv6.Dst() != want.local {
			t.Errorf("IPv6 %v -> %v, want %v -> %v", p.IPv6.Src(), p.IPv6.Dst(), want.remote, want.local)
		}
	}
	if p.UDP.DstPort() != ib.RoCEv2Port {
		t.Errorf("UDP destination port %d", p.UDP.DstPort())
	}
	if got, w := p.UDP.SrcPort(), ib.RXESourcePort(want.remoteQPN); got != w {
		t.Errorf("UDP source port %#04x, want ib.RXESourcePort(%#x) = %#04x", got, want.remoteQPN, w)
	}
	if !p.UDPChecksumValid() {
		t.Errorf("UDP checksum %#04x invalid", p.UDP[6:8])
	}
	b := p.BTH.Fields()
	if b.PKey != 0xFFFF || b.TVer != 0 || b.MigReq || b.FECN || b.BECN {
		t.Errorf("BTH %+v: want P_Key 0xffff, TVer 0, no MigReq/FECN/BECN", b)
	}
	if b.PSN != want.psn {
		t.Errorf("BTH PSN %#06x, want %#06x (the guest's PSN from the exchange + iteration)", uint32(b.PSN), uint32(want.psn))
	}
	if int(b.PadCount) != -len(want.payload)&3 {
		t.Errorf("BTH PadCount %d for a %d-byte payload", b.PadCount, len(want.payload))
	}
	if p.DETH == nil {
		t.Fatalf("UD SEND_ONLY without DETH")
	}
	if d := p.DETH.Fields(); d.QKey != pingpongQKey || d.SrcQP != want.remoteQPN {
		t.Errorf("DETH %+v, want Q_Key %#x SrcQP %#x", d, pingpongQKey, want.remoteQPN)
	}
	// ibv_ud_pingpong sends from the buffer it received into, just past the
	// 40-byte GRH area: its reply echoes our payload.
	if !bytes.Equal(p.Payload, want.payload) {
		t.Errorf("reply payload (%d bytes) is not our ping's (%d bytes)", len(p.Payload), len(want.payload))
	}
	if again := rebuild(t, p); !bytes.Equal(again, frame) {
		t.Errorf("ib.Build of the decoded reply differs from rxe's frame:\nrxe: %x\nib:  %x", frame, again)
	}
}

// rebuild encodes p's decoded fields again with ib.Build.
func rebuild(t *testing.T, p *ib.Packet) []byte {
	t.Helper()
	s := ib.FrameSpec{
		SrcMAC: p.Eth.Src(), DstMAC: p.Eth.Dst(),
		SrcPort: p.UDP.SrcPort(), DstPort: p.UDP.DstPort(),
		UDPChecksum: p.UDP[6] != 0 || p.UDP[7] != 0,
		BTH:         p.BTH.Fields(),
		Payload:     p.Payload,
	}
	if p.IPv4 != nil {
		s.Src, s.Dst = p.IPv4.Src(), p.IPv4.Dst()
		s.TrafficClass, s.HopLimit = p.IPv4.TOS(), p.IPv4.TTL()
		s.IPID, s.DontFragment = p.IPv4.ID(), p.IPv4.DontFragment()
	} else {
		s.Src, s.Dst = p.IPv6.Src(), p.IPv6.Dst()
		s.TrafficClass, s.HopLimit = p.IPv6.TrafficClass(), p.IPv6.HopLimit()
		s.FlowLabel = p.IPv6.FlowLabel()
	}
	if p.DETH != nil {
		d := p.DETH.Fields()
		s.DETH = &d
	}
	if p.AETH != nil {
		a := p.AETH.Fields()
		s.AETH = &a
	}
	if p.RETH != nil {
		r := p.RETH.Fields()
		s.RETH = &r
	}
	if p.ImmDt != nil {
		i := p.ImmDt.Fields()
		s.ImmDt = &i
	}
	if p.AtomicETH != nil {
		a := p.AtomicETH.Fields()
		s.AtomicETH = &a
	}
	if p.AtomicAckETH != nil {
		a := p.AtomicAckETH.Fields()
		s.AtomicAckETH = &a
	}
	buf := make([]byte, s.Len())
	n, err := ib.Build(buf, &s)
	if err != nil {
		t.Errorf("ib.Build of the decoded frame: %v", err)
		return nil
	}
	return buf[:n]
}

// TestUDRejectsBadFrames shows that the guest's rxe really checks what the
// other tests rely on: a frame with a corrupted ICRC, a wrong Q_Key or a
// wrong destination QP gets no reply, and the pingpong still completes with
// the good frame sent afterwards.
func TestUDRejectsBadFrames(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, families[0])
	host := openHostPort(t, lab)
	job := g.Start(ctx, "ibv_ud_pingpong", "-d", "rxe0", "-g", strconv.Itoa(gidIndex), "-s", "64", "-n", "1")
	defer func() {
		cancel()
		job.Wait()
	}()
	me := pingpongDest{QPN: 0x100 + rand.Uint32N(0xFFFE00), PSN: ib.PSN(rand.Uint32N(1 << 24)), GID: ib.GIDFromAddr(local)}
	remote, err := pingpongClient(ctx, lab, g.Addr, me, job.Done())
	if err != nil {
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("out-of-band exchange: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
	}
	good := ib.FrameSpec{
		SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC),
		Src: local, Dst: remoteAddr, HopLimit: 64, DontFragment: true,
		SrcPort: ib.RXESourcePort(me.QPN),
		BTH:     ib.BTHFields{Opcode: ib.UDSendOnly, PKey: 0xFFFF, DestQP: remote.QPN, PSN: me.PSN},
		DETH:    &ib.DETHFields{QKey: pingpongQKey, SrcQP: me.QPN},
		Payload: bytes.Repeat([]byte{0x5a}, 64),
	}
	build := func(s ib.FrameSpec) []byte {
		buf := make([]byte, s.Len())
		n, err := ib.Build(buf, &s)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	badICRC := build(good)
	badICRC[len(badICRC)-1] ^= 0x01
	wrongQKey := good
	wrongQKey.DETH = &ib.DETHFields{QKey: pingpongQKey ^ 0x100, SrcQP: me.QPN}
	wrongQP := good
	wrongQP.BTH.DestQP = remote.QPN + 0x100

	in := make([]byte, 65536)
	isReply := func(fr []byte) bool {
		var p ib.Packet
		return ib.Parse(fr, &p) == nil && p.BTH.Opcode() == ib.UDSendOnly && p.BTH.DestQP() == me.QPN
	}
	for _, c := range []struct {
		name  string
		frame []byte
	}{{"corrupted ICRC", badICRC}, {"wrong Q_Key", build(wrongQKey)}, {"wrong destination QP", build(wrongQP)}} {
		if err := host.send(c.frame); err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := host.recv(rctx, in, isReply)
		rcancel()
		if err == nil {
			t.Errorf("rxe answered a frame with a %s", c.name)
		}
	}
	if err := host.send(build(good)); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = host.recv(rctx, in, isReply)
	rcancel()
	if err != nil {
		t.Errorf("no reply to the good frame: %v", err)
	}
	stdout, stderr, code := stopJob(job, cancel)
	if code != 0 || !bytes.Contains(stdout, []byte("1 iters in")) {
		t.Errorf("ibv_ud_pingpong: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

// TestUDPingpongServer is the other direction: ibv_ud_pingpong runs as the
// client in the guest and connects to us; we answer each of its pings.
func TestUDPingpongServer(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			const size, iters = 256, 4
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			local, remoteAddr, gidIndex := endpoints(t, lab, g, f)
			host := openHostPort(t, lab)
			srv := listenPingpong(t, lab, lab.PeerAddr)
			job := g.Start(ctx, "sh", "-c", fmt.Sprintf(
				// The client gives up at once if nobody listens yet: retry.
				"i=0; while [ $i -lt 20 ]; do ibv_ud_pingpong -d rxe0 -g %d -s %d -n %d %s && exit 0; i=$((i+1)); sleep 0.5; done; exit 1",
				gidIndex, size, iters, lab.PeerAddr))
			defer func() {
				cancel()
				job.Wait()
			}()
			me := pingpongDest{QPN: 0x100 + rand.Uint32N(0xFFFE00), PSN: ib.PSN(rand.Uint32N(1 << 24)), GID: ib.GIDFromAddr(local)}
			remote, err := srv.exchange(ctx, func(pingpongDest) (pingpongDest, error) { return me, nil })
			if err != nil {
				stdout, stderr, code := stopJob(job, cancel)
				t.Fatalf("out-of-band exchange: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
			}
			if remote.GID != ib.GIDFromAddr(remoteAddr) {
				t.Fatalf("guest announced GID %v, want %v", remote.GID, ib.GIDFromAddr(remoteAddr))
			}
			out := make([]byte, 16384)
			in := make([]byte, 65536)
			var lastPong []byte
			for i := 0; i < iters; i++ {
				var p ib.Packet
				rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
				ping, err := host.recv(rctx, in, func(fr []byte) bool {
					return ib.Parse(fr, &p) == nil && p.BTH.Opcode() == ib.UDSendOnly && p.BTH.DestQP() == me.QPN
				})
				rcancel()
				if err != nil {
					stdout, stderr, code := stopJob(job, cancel)
					t.Fatalf("ping %d: none from the guest: %v\nguest exit %d\nstdout: %s\nstderr: %s", i, err, code, stdout, stderr)
				}
				if len(p.Payload) != size {
					t.Fatalf("ping %d: %d bytes, want %d", i, len(p.Payload), size)
				}
				// The client's first ping carries whatever its buffer held;
				// later ones echo our previous pong.
				want := peerExpect{
					local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
					localQPN: me.QPN, remoteQPN: remote.QPN, psn: remote.PSN.Add(uint32(i)),
					payload: bytes.Clone(p.Payload),
				}
				checkUDReply(t, &p, ping, want)
				if i > 0 && !bytes.Equal(p.Payload, lastPong) {
					t.Errorf("ping %d does not echo our pong %d", i, i-1)
				}
				pong := make([]byte, size)
				for j := range pong {
					pong[j] = byte(i*17 + j*3 + 7)
				}
				n, err := ib.Build(out, &ib.FrameSpec{
					SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC),
					Src: local, Dst: remoteAddr, HopLimit: 64, DontFragment: true, IPID: uint16(i + 1),
					SrcPort: ib.RXESourcePort(me.QPN),
					BTH:     ib.BTHFields{Opcode: ib.UDSendOnly, PKey: 0xFFFF, DestQP: remote.QPN, PSN: me.PSN.Add(uint32(i))},
					DETH:    &ib.DETHFields{QKey: pingpongQKey, SrcQP: me.QPN},
					Payload: pong,
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := host.send(out[:n]); err != nil {
					t.Fatal(err)
				}
				lastPong = pong
				if t.Failed() {
					break
				}
			}
			stdout, stderr, code := stopJob(job, cancel)
			if code != 0 || !bytes.Contains(stdout, []byte(fmt.Sprintf("%d iters in", iters))) {
				t.Errorf("ibv_ud_pingpong client: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
			}
		})
	}
}
