// Copyright The goroce Authors.
// SPDX-License-Identifier: Apache-2.0

package interop

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/interop/rxelab"
)

// pingpongPathMTU is ibv_rc_pingpong's default path MTU (-m), whatever the
// port's active MTU.
const pingpongPathMTU = 1024

// TestRCPingpong plays the client of ibv_rc_pingpong, running as the server
// in a guest, with a minimal RC requester and responder written here on top
// of ib: our SENDs (segmented at the path MTU) must be acknowledged by rxe
// with the right PSN and MSN, and rxe's SENDs must complete with our ACKs,
// or rxe retries and ibv_rc_pingpong fails.
func TestRCPingpong(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, f := range families {
		for _, c := range []struct{ size, iters int }{{64, 3}, {1000, 5}, {4096, 3}} {
			t.Run(fmt.Sprintf("%s/size%d", f.name, c.size), func(t *testing.T) {
				connectedPingpongClient(t, lab, g, f, false, c.size, c.iters)
			})
		}
	}
}

// TestUCPingpong is TestRCPingpong over UC with ibv_uc_pingpong: the same
// SEND segmentation and PSN sequence, no AckReq and no acknowledgements.
func TestUCPingpong(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	for _, f := range families {
		for _, c := range []struct{ size, iters int }{{64, 3}, {4096, 3}} {
			t.Run(fmt.Sprintf("%s/size%d", f.name, c.size), func(t *testing.T) {
				connectedPingpongClient(t, lab, g, f, true, c.size, c.iters)
			})
		}
	}
}

// connectedPingpongClient plays the client of ibv_rc_pingpong, or of
// ibv_uc_pingpong if uc, running as the server in g.
func connectedPingpongClient(t *testing.T, lab *rxelab.Lab, g *rxelab.Guest, f family, uc bool, size, iters int) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, f)
	host := openHostPort(t, lab)

	t0 := time.Now()
	tool := "ibv_rc_pingpong"
	if uc {
		tool = "ibv_uc_pingpong"
	}
	job := g.Start(ctx, tool, "-d", "rxe0", "-g", strconv.Itoa(gidIndex),
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
	remote, err := pingpongClient(ctx, lab, g.Addr, me, job.Done())
	if err != nil {
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("out-of-band exchange: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
	}
	t.Logf("guest QPN %#06x PSN %#06x GID %v; ours QPN %#06x PSN %#06x GID %v (setup %.1fs)",
		remote.QPN, uint32(remote.PSN), remote.GID, me.QPN, uint32(me.PSN), me.GID, time.Since(t0).Seconds())

	qp := &rcHostQP{
		t: t, host: host, uc: uc,
		spec: ib.FrameSpec{
			SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC),
			Src: local, Dst: remoteAddr,
			HopLimit: 64, DontFragment: true,
			// rxe (5.x+) gives an RC QP the source port of the flow label
			// of its QP pair; a real peer would do the same.
			SrcPort: rcSourcePort(me.QPN, remote.QPN),
		},
		want: peerExpect{
			local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
			localQPN: me.QPN, remoteQPN: remote.QPN,
		},
		sqPSN: me.PSN,
		ePSN:  remote.PSN,
		out:   make([]byte, 16384),
		in:    make([]byte, 65536),
	}
	fail := func(format string, args ...any) {
		t.Helper()
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("%s\nguest exit %d\nstdout: %s\nstderr: %s\nrxe counters:\n%s",
			fmt.Sprintf(format, args...), code, stdout, stderr, rxeCounters(g))
	}
	var rtts []time.Duration
	for i := 0; i < iters; i++ {
		msg := make([]byte, size)
		for j := range msg {
			msg[j] = byte(i*13 + j*5 + 3)
		}
		ts := time.Now()
		echo, err := qp.pingpong(ctx, msg, uint32(i+1))
		if err != nil {
			fail("message %d: %v", i, err)
		}
		rtts = append(rtts, time.Since(ts))
		// ibv_{rc,uc}_pingpong send from the buffer they receive into:
		// the guest's message echoes ours.
		if !bytes.Equal(echo, msg) {
			t.Errorf("message %d: guest's SEND (%d bytes) is not our message (%d bytes)", i, len(echo), len(msg))
		}
		if t.Failed() {
			fail("message %d: bad frames from rxe", i)
		}
	}
	stdout, stderr, code, err := job.Wait()
	if err != nil || code != 0 {
		t.Fatalf("%s: exit %d, %v\nstdout: %s\nstderr: %s", tool, code, err, stdout, stderr)
	}
	if want := fmt.Sprintf("%d iters in", iters); !bytes.Contains(stdout, []byte(want)) {
		t.Errorf("%s output lacks %q:\n%s", tool, want, stdout)
	}
	// That the tool finished all iterations is what proves rxe took our
	// ACKs: it posts each SEND only after the previous one completed, and a
	// SEND completes only on an ACK (ignored ACKs end in "transport retry
	// counter exceeded"). A count of rxe's retransmissions is no such proof:
	// rxe retransmits after ibv_rc_pingpong's 67 ms timeout whenever the
	// guest's vCPU runs late, which on a busy machine can be every message.
	t.Logf("%d messages each way, rtt %v; %d packets out, %d in; rxe retransmissions %d, ours %d; total %.1fs",
		iters, rtts, qp.pktsOut, qp.pktsIn, qp.dupSends, qp.retransmits, time.Since(t0).Seconds())
}

// rcSourcePort is the UDP source port rxe uses for an RC QP connected to
// a remote QP with flow label 0 (what ibv_rc_pingpong asks): the port of
// the flow label computed from both QPNs, not the per-QP hash it uses for UD.
func rcSourcePort(local, remote uint32) uint16 {
	return ib.FlowLabelToUDPSourcePort(ib.CalcFlowLabel(local, remote))
}

// rcHostQP is a minimal RC (or UC) queue pair on the host side, enough for
// a ping-pong of SENDs: one message in flight each way.
type rcHostQP struct {
	t    *testing.T
	host *hostPort
	uc   bool // UC: no AckReq, no ACKs either way
	// outRETH, if set, makes our messages RDMA WRITEs to that memory.
	outRETH *ib.RETHFields
	// inWrite and inRETH describe rxe's last message: an RDMA WRITE, to inRETH.
	inWrite bool
	inRETH  ib.RETHFields
	// answer: rxe sends first in each round (see pingpong).
	answer bool
	// trace records every packet both ways, for failure reports.
	trace []string
	spec  ib.FrameSpec // addressing; BTH and ETHs are set per packet
	want  peerExpect

	sqPSN ib.PSN // next PSN we send
	ePSN  ib.PSN // next PSN we expect from rxe
	msn   uint32 // messages we have completed as responder

	out, in                                     []byte
	pktsOut, pktsIn, dupSends, retransmits, ids int
}

// pingpong sends msg as one SEND message, then waits until rxe has
// acknowledged all of it (with MSN wantMSN) and sent us a whole SEND message
// of its own, which it returns after acknowledging it. With q.answer, it
// waits for rxe's message first and sends msg only then.
func (q *rcHostQP) pingpong(ctx context.Context, msg []byte, wantMSN uint32) ([]byte, error) {
	first := q.sqPSN
	npkts := max(1, (len(msg)+pingpongPathMTU-1)/pingpongPathMTU)
	last := first.Add(uint32(npkts - 1))
	q.sqPSN = last.Next()
	sent := false
	if !q.answer {
		if err := q.sendMessage(msg, first, npkts); err != nil {
			return nil, err
		}
		sent = true
	}

	acked := q.uc // nothing acknowledges UC
	var got []byte
	done := false
	var p ib.Packet
	lastTx := time.Now()
	for !acked || !done {
		if done && !sent {
			if err := q.sendMessage(msg, first, npkts); err != nil {
				return nil, err
			}
			sent, lastTx = true, time.Now()
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		frame, err := q.host.recv(rctx, q.in, func(fr []byte) bool {
			return ib.Parse(fr, &p) == nil && (p.BTH.Opcode().Transport() == ib.TransportRC ||
				p.BTH.Opcode().Transport() == ib.TransportUC) && p.BTH.DestQP() == q.want.localQPN
		})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("acked=%v, got %d of the guest's bytes: %w", acked, len(got), ctx.Err())
			}
			// Nothing for 5 s: our request or our last ACK may be lost.
			if sent && !acked && time.Since(lastTx) >= 5*time.Second {
				q.retransmits++
				if err := q.sendMessage(msg, first, npkts); err != nil {
					return nil, err
				}
				lastTx = time.Now()
			}
			continue
		}
		q.pktsIn++
		q.checkCommon(&p, frame)
		q.record("in ", &p)
		b := p.BTH.Fields()
		op := b.Opcode
		if want := q.transport(); op.Transport() != want {
			return nil, fmt.Errorf("%v from rxe on a %v QP", op, want)
		}
		// Classify as RC: the checks below are the same for UC sends.
		rcOp := op &^ ib.Opcode(ib.TransportUC)
		switch rcOp {
		case ib.RCAck:
			a := p.AETH.Fields()
			if a.Syndrome.Type() != ib.SyndromeACK {
				return nil, fmt.Errorf("rxe answered PSN %#06x with %v", uint32(b.PSN), a.Syndrome)
			}
			if a.Syndrome != ib.SyndromeACKUnlimited {
				q.t.Errorf("ACK syndrome %v, want %v (rxe grants unlimited credits)", a.Syndrome, ib.SyndromeACKUnlimited)
			}
			if b.PSN == last {
				if a.MSN != wantMSN {
					q.t.Errorf("ACK of PSN %#06x carries MSN %d, want %d", uint32(b.PSN), a.MSN, wantMSN)
				}
				acked = true
			} else if ib.PSNDiff(b.PSN, first) < 0 || ib.PSNDiff(b.PSN, last) > 0 {
				return nil, fmt.Errorf("ACK for PSN %#06x outside our message %#06x..%#06x", uint32(b.PSN), uint32(first), uint32(last))
			}
		case ib.RCSendFirst, ib.RCSendMiddle, ib.RCSendLast, ib.RCSendOnly,
			ib.RCWriteFirst, ib.RCWriteMiddle, ib.RCWriteLast, ib.RCWriteOnly:
			isFirst := rcOp == ib.RCSendFirst || rcOp == ib.RCSendOnly || rcOp == ib.RCWriteFirst || rcOp == ib.RCWriteOnly
			isLast := rcOp == ib.RCSendLast || rcOp == ib.RCSendOnly || rcOp == ib.RCWriteLast || rcOp == ib.RCWriteOnly
			isWrite := rcOp >= ib.RCWriteFirst && rcOp <= ib.RCWriteOnly
			if d := ib.PSNDiff(b.PSN, q.ePSN); d < 0 {
				// A retransmission: our ACK did not arrive in time. ACK again.
				if q.uc {
					return nil, fmt.Errorf("UC %v with old PSN %#06x (expected %#06x)", op, uint32(b.PSN), uint32(q.ePSN))
				}
				q.dupSends++
				if err := q.sendAck(q.ePSN.Add(^uint32(0))); err != nil {
					return nil, err
				}
				continue
			} else if d > 0 {
				return nil, fmt.Errorf("rxe sent PSN %#06x, expected %#06x", uint32(b.PSN), uint32(q.ePSN))
			}
			if done {
				return nil, fmt.Errorf("a second message from rxe before our next SEND (PSN %#06x)", uint32(b.PSN))
			}
			if isFirst != (got == nil) || (got != nil && isWrite != q.inWrite) {
				return nil, fmt.Errorf("%v out of order (have %d bytes of the message)", op, len(got))
			}
			if isFirst {
				q.inWrite = isWrite
				if (p.RETH != nil) != isWrite {
					return nil, fmt.Errorf("%v with RETH %v", op, p.RETH != nil)
				}
				if isWrite {
					q.inRETH = p.RETH.Fields()
				}
			}
			if !isLast && len(p.Payload) != pingpongPathMTU {
				q.t.Errorf("%v carries %d bytes, want the path MTU %d", op, len(p.Payload), pingpongPathMTU)
			}
			if got == nil {
				got = []byte{}
			}
			got = append(got, p.Payload...)
			q.ePSN = q.ePSN.Next()
			if b.AckReq != (!q.uc && isLast) {
				q.t.Errorf("%v PSN %#06x with AckReq %v", op, uint32(b.PSN), b.AckReq)
			}
			if isLast {
				q.msn++
				done = true
				if !q.uc {
					if err := q.sendAck(b.PSN); err != nil {
						return nil, err
					}
				}
			}
		default:
			return nil, fmt.Errorf("unexpected %v from rxe", op)
		}
	}
	return got, nil
}

// sendMessage sends msg as npkts SEND packets (RDMA WRITE packets, RETH on
// the first, if q.outRETH is set) from PSN first, AckReq on the last one.
func (q *rcHostQP) sendMessage(msg []byte, first ib.PSN, npkts int) error {
	for k := 0; k < npkts; k++ {
		op := ib.RCSendMiddle
		switch {
		case npkts == 1:
			op = ib.RCSendOnly
		case k == 0:
			op = ib.RCSendFirst
		case k == npkts-1:
			op = ib.RCSendLast
		}
		s := q.spec
		if q.outRETH != nil {
			op = map[ib.Opcode]ib.Opcode{ib.RCSendFirst: ib.RCWriteFirst, ib.RCSendMiddle: ib.RCWriteMiddle,
				ib.RCSendLast: ib.RCWriteLast, ib.RCSendOnly: ib.RCWriteOnly}[op]
			if k == 0 {
				s.RETH = q.outRETH
			}
		}
		seg := msg[k*pingpongPathMTU : min(len(msg), (k+1)*pingpongPathMTU)]
		if q.uc {
			op |= ib.Opcode(ib.TransportUC)
		}
		s.BTH = ib.BTHFields{Opcode: op, PKey: 0xFFFF, DestQP: q.want.remoteQPN,
			PSN: first.Add(uint32(k)), AckReq: !q.uc && k == npkts-1}
		s.Payload = seg
		if err := q.send(&s); err != nil {
			return err
		}
	}
	return nil
}

func (q *rcHostQP) transport() ib.Transport {
	if q.uc {
		return ib.TransportUC
	}
	return ib.TransportRC
}

// sendAck acknowledges everything up to psn, with our current MSN.
func (q *rcHostQP) sendAck(psn ib.PSN) error {
	s := q.spec
	s.BTH = ib.BTHFields{Opcode: ib.RCAck, PKey: 0xFFFF, DestQP: q.want.remoteQPN, PSN: psn}
	s.AETH = &ib.AETHFields{Syndrome: ib.SyndromeACKUnlimited, MSN: q.msn}
	return q.send(&s)
}

func (q *rcHostQP) send(s *ib.FrameSpec) error {
	q.ids++
	s.IPID = uint16(q.ids)
	n, err := ib.Build(q.out, s)
	if err != nil {
		return fmt.Errorf("ib.Build %v: %w", s.BTH.Opcode, err)
	}
	if err := ib.VerifyFrameICRC(q.out[:n]); err != nil {
		return fmt.Errorf("our own %v: %w", s.BTH.Opcode, err)
	}
	q.pktsOut++
	var p ib.Packet
	if ib.Parse(q.out[:n], &p) == nil {
		q.record("out", &p)
	}
	return q.host.send(q.out[:n])
}

func (q *rcHostQP) record(dir string, p *ib.Packet) {
	b := p.BTH.Fields()
	e := fmt.Sprintf("%s %v PSN %#06x AckReq %v len %d", dir, b.Opcode, uint32(b.PSN), b.AckReq, len(p.Payload))
	if p.AETH != nil {
		e += fmt.Sprintf(" AETH %+v", p.AETH.Fields())
	}
	if p.RETH != nil {
		e += fmt.Sprintf(" RETH %+v", p.RETH.Fields())
	}
	q.trace = append(q.trace, e)
}

// traceString returns the last packets of the trace.
func (q *rcHostQP) traceString() string {
	return strings.Join(q.trace[max(0, len(q.trace)-40):], "\n")
}

// checkCommon checks what every RC frame from rxe must carry.
func (q *rcHostQP) checkCommon(p *ib.Packet, frame []byte) {
	t := q.t
	t.Helper()
	if err := p.VerifyICRC(); err != nil {
		t.Errorf("%v: ICRC: %v", p.BTH.Opcode(), err)
	}
	if src, dst := p.Eth.Src(), p.Eth.Dst(); !bytes.Equal(src[:], q.want.remoteMAC) || !bytes.Equal(dst[:], q.want.localMAC) {
		t.Errorf("Ethernet %x -> %x", src, dst)
	}
	var src, dst = p.UDP.SrcPort(), p.UDP.DstPort()
	if want := rcSourcePort(q.want.remoteQPN, q.want.localQPN); dst != ib.RoCEv2Port || src != want {
		t.Errorf("UDP %d -> %d, want %d -> %d (the flow label's port for QPs %#x, %#x)",
			src, dst, want, ib.RoCEv2Port, q.want.remoteQPN, q.want.localQPN)
	}
	if p.IPv4 != nil {
		if p.IPv4.Src() != q.want.remote || p.IPv4.Dst() != q.want.local || !p.IPv4.ChecksumValid() {
			t.Errorf("IPv4 %v -> %v (checksum ok %v)", p.IPv4.Src(), p.IPv4.Dst(), p.IPv4.ChecksumValid())
		}
	} else if p.IPv6 == nil || p.IPv6.Src() != q.want.remote || p.IPv6.Dst() != q.want.local {
		t.Errorf("not IPv6 %v -> %v", q.want.remote, q.want.local)
	}
	if b := p.BTH.Fields(); b.PKey != 0xFFFF || b.TVer != 0 {
		t.Errorf("BTH %+v", b)
	}
	if again := rebuild(t, p); !bytes.Equal(again, frame) {
		t.Errorf("ib.Build of the decoded %v differs from rxe's frame:\nrxe: %x\nib:  %x", p.BTH.Opcode(), frame, again)
	}
}

// TestRCSequenceNAK sends rxe a SEND whose PSN is ahead of the one it
// expects: rxe must answer with one NAK (PSN sequence error) carrying the
// PSN it expects, then take the message at the right PSN as usual.
func TestRCSequenceNAK(t *testing.T) {
	lab := rxelab.Get(t)
	g := lab.Guests[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	local, remoteAddr, gidIndex := endpoints(t, lab, g, families[0])
	host := openHostPort(t, lab)
	before := rxeCounters(g)
	job := g.Start(ctx, "ibv_rc_pingpong", "-d", "rxe0", "-g", strconv.Itoa(gidIndex), "-s", "64", "-n", "1")
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
	qp := &rcHostQP{
		t: t, host: host,
		spec: ib.FrameSpec{
			SrcMAC: [6]byte(lab.PeerMAC), DstMAC: [6]byte(g.MAC), Src: local, Dst: remoteAddr,
			HopLimit: 64, DontFragment: true, SrcPort: rcSourcePort(me.QPN, remote.QPN),
		},
		want: peerExpect{local: local, remote: remoteAddr, localMAC: lab.PeerMAC, remoteMAC: g.MAC,
			localQPN: me.QPN, remoteQPN: remote.QPN},
		sqPSN: me.PSN, ePSN: remote.PSN,
		out: make([]byte, 16384), in: make([]byte, 65536),
	}
	msg := bytes.Repeat([]byte{0xa5}, 64)
	for k := 0; k < 2; k++ { // the second one must not be NAKed again
		if err := qp.sendMessage(msg, me.PSN.Add(3+uint32(k)), 1); err != nil {
			t.Fatal(err)
		}
	}
	var p ib.Packet
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	frame, err := host.recv(rctx, qp.in, func(fr []byte) bool {
		return ib.Parse(fr, &p) == nil && p.BTH.Opcode() == ib.RCAck && p.BTH.DestQP() == me.QPN
	})
	rcancel()
	if err != nil {
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("no answer to an out-of-sequence SEND: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
	}
	qp.checkCommon(&p, frame)
	a := p.AETH.Fields()
	if want := ib.NAKSyndrome(ib.NAKPSNSequenceError); a.Syndrome != want || p.BTH.PSN() != me.PSN || a.MSN != 0 {
		t.Errorf("got %v PSN %#06x MSN %d, want %v PSN %#06x MSN 0",
			a.Syndrome, uint32(p.BTH.PSN()), a.MSN, want, uint32(me.PSN))
	}
	// Now the real message: an ACK and the guest's SEND. A second NAK (for
	// the second early SEND) would fail pingpong.
	echo, err := qp.pingpong(ctx, msg, 1)
	if err != nil {
		stdout, stderr, code := stopJob(job, cancel)
		t.Fatalf("pingpong after the NAK: %v\nguest exit %d\nstdout: %s\nstderr: %s", err, code, stdout, stderr)
	}
	if !bytes.Equal(echo, msg) {
		t.Errorf("guest's SEND does not echo ours")
	}
	stdout, stderr, code := stopJob(job, cancel)
	if code != 0 || !bytes.Contains(stdout, []byte("1 iters in")) {
		t.Errorf("ibv_rc_pingpong: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	after := rxeCounters(g)
	// rxe counts the packet it NAKs; later ones, dropped while that NAK is
	// outstanding, are not counted.
	if d := counter(after, "out_of_seq_request") - counter(before, "out_of_seq_request"); d != 1 {
		t.Errorf("rxe out_of_seq_request grew by %d, want 1", d)
	}
}

// counter reads one "name:value" line of rxeCounters output (-1 if absent).
func counter(counters, name string) int {
	for _, line := range bytes.Split([]byte(counters), []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && string(k) == name {
			n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			if err == nil {
				return n
			}
		}
	}
	return -1
}
