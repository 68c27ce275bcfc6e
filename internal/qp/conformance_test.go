package qp_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcaptest"
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/internal/qp/qptest"
)

// readPcap returns the frames of a classic libpcap file of Ethernet frames.
func readPcap(path string) ([][]byte, error) {
	recs, err := pcaptest.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return pcaptest.Frames(recs), nil
}

type capPkt struct {
	p        ib.Packet
	src, dst netip.Addr
}

func isResponse(op ib.Opcode) bool {
	low := uint8(op) & 0x1F
	return uint8(op)&0xE0 == 0 && low >= 0x0D && low <= 0x12
}

// TestConformanceWithRxe replays the request streams rxe sent in the reference
// captures through our responder and checks that what it sends back matches
// what the rxe responder sent: opcodes, PSNs, AETH syndrome and MSN, atomic
// original values and payload bytes.
func TestConformanceWithRxe(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	for _, c := range []struct {
		mtuDir string
		mtu    ib.MTU
		names  []string
	}{
		{"mtu4096", ib.MTU4096, []string{"rc_send", "rc_write", "rc_read", "rc_atomic", "rc_write_lat_small"}},
		{"mtu1024", ib.MTU1024, []string{"rc_send", "rc_write", "rc_read"}},
	} {
		for _, name := range c.names {
			t.Run(c.mtuDir+"/"+name, func(t *testing.T) {
				path := filepath.Join(dir, c.mtuDir, name+".pcap")
				frames, err := readPcap(path)
				if err != nil {
					if os.IsNotExist(err) {
						t.Skipf("%s not present", path)
					}
					t.Fatal(err)
				}
				var pkts []*capPkt
				for i, f := range frames {
					cp := &capPkt{}
					if err := ib.Parse(f, &cp.p); err != nil {
						t.Fatalf("frame %d: %v", i+1, err)
					}
					if cp.p.IPv4 == nil {
						t.Fatalf("frame %d: not IPv4", i+1)
					}
					cp.src, cp.dst = cp.p.IPv4.Src(), cp.p.IPv4.Dst()
					pkts = append(pkts, cp)
				}
				// Every direction that carries requests is replayed separately.
				dirs := map[[2]netip.Addr]bool{}
				for _, cp := range pkts {
					if !isResponse(cp.p.BTH.Opcode()) {
						dirs[[2]netip.Addr{cp.src, cp.dst}] = true
					}
				}
				if len(dirs) == 0 {
					t.Fatal("no requests in capture")
				}
				compared := 0
				for d := range dirs {
					compared += replayDirection(t, pkts, d[0], d[1], c.mtu)
				}
				t.Logf("%d responses compared", compared)
			})
		}
	}
}

func replayDirection(t *testing.T, pkts []*capPkt, reqSrc, reqDst netip.Addr, mtu ib.MTU) int {
	t.Helper()
	var reqs, resps []*capPkt
	for _, cp := range pkts {
		switch {
		case cp.src == reqSrc && cp.dst == reqDst && !isResponse(cp.p.BTH.Opcode()):
			reqs = append(reqs, cp)
		case cp.src == reqDst && cp.dst == reqSrc && isResponse(cp.p.BTH.Opcode()):
			resps = append(resps, cp)
		}
	}
	if len(resps) == 0 {
		t.Fatalf("%v→%v: requests without responses", reqSrc, reqDst)
	}
	clock := &qptest.Clock{}
	e, err := qp.New(qp.Config{Clock: clock, PortMTU: mtu})
	if err != nil {
		t.Fatal(err)
	}
	qp.SetNextQPN(e, reqs[0].p.BTH.DestQP())
	ep, err := qptest.NewEndpoint(e, qp.RC, 256)
	if err != nil {
		t.Fatal(err)
	}
	if ep.QP.QPN() != reqs[0].p.BTH.DestQP() {
		t.Fatalf("QPN %#x, want %#x", ep.QP.QPN(), reqs[0].p.BTH.DestQP())
	}
	q := ep.QP
	steps := []struct {
		a    qp.QPAttr
		mask qp.AttrMask
	}{
		{qp.QPAttr{State: qp.StateInit, Port: 1, AccessFlags: allAccess}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrAccessFlags},
		{qp.QPAttr{State: qp.StateRTR, PathMTU: mtu, DestQPN: resps[0].p.BTH.DestQP(), RQPSN: uint32(reqs[0].p.BTH.PSN()),
			MaxDestRdAtomic: 128, MinRNRTimer: 12,
			AV: qp.AddressVector{DGID: ib.GIDFromAddr(reqSrc), SGID: ib.GIDFromAddr(reqDst), HopLimit: 64}},
			qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN | qp.AttrMaxDestRdAtomic | qp.AttrMinRNRTimer},
		{qp.QPAttr{State: qp.StateRTS, SQPSN: 0, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			qp.AttrState | qp.AttrSQPSN | qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := q.Modify(&s.a, s.mask); err != nil {
			t.Fatal(err)
		}
	}

	// Memory: one region per R_Key spanning every address the requests use,
	// prefilled with what rxe answered so READ payloads and atomic originals
	// can be compared.
	type span struct{ lo, hi uint64 }
	spans := map[uint32]*span{}
	add := func(rkey uint32, va uint64, n uint64) {
		s := spans[rkey]
		if s == nil {
			s = &span{va, va + n}
			spans[rkey] = s
		}
		s.lo, s.hi = min(s.lo, va), max(s.hi, va+n)
	}
	for _, r := range reqs {
		if r.p.RETH != nil && r.p.RETH.DMALen() > 0 {
			add(r.p.RETH.RKey(), r.p.RETH.VA(), uint64(r.p.RETH.DMALen()))
		}
		if r.p.AtomicETH != nil {
			add(r.p.AtomicETH.RKey(), r.p.AtomicETH.VA(), 8)
		}
	}
	mems := map[uint32][]byte{}
	for rkey, s := range spans {
		if s.hi-s.lo > 64<<20 {
			t.Fatalf("R_Key %#x spans %d bytes", rkey, s.hi-s.lo)
		}
		mem := make([]byte, s.hi-s.lo)
		if _, err := qp.RegMRWithKey(ep.PD, mem, s.lo, allAccess, rkey); err != nil {
			t.Fatal(err)
		}
		mems[rkey] = mem
	}
	respByPSN := map[ib.PSN]*capPkt{}
	for _, r := range resps {
		respByPSN[r.p.BTH.PSN()] = r
	}
	m := uint64(mtu.Bytes())
	for _, r := range reqs {
		switch {
		case r.p.BTH.Opcode() == ib.RCReadRequest:
			va, n := r.p.RETH.VA(), uint64(r.p.RETH.DMALen())
			mem, lo := mems[r.p.RETH.RKey()], spans[r.p.RETH.RKey()].lo
			for k := uint64(0); k*m < n; k++ {
				if rp := respByPSN[r.p.BTH.PSN().Add(uint32(k))]; rp != nil {
					copy(mem[va-lo+k*m:], rp.p.Payload)
				}
			}
		case r.p.AtomicETH != nil:
			if rp := respByPSN[r.p.BTH.PSN()]; rp != nil && rp.p.AtomicAckETH != nil {
				mem, lo := mems[r.p.AtomicETH.RKey()], spans[r.p.AtomicETH.RKey()].lo
				binary.NativeEndian.PutUint64(mem[r.p.AtomicETH.VA()-lo:], rp.p.AtomicAckETH.Orig())
			}
		}
	}
	// Receive buffers for SENDs.
	rbuf := make([]byte, 64<<16)
	rmr, err := ep.PD.RegMR(rbuf, 0, qp.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 64; i++ {
		if err := q.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: uint64(i << 16), Length: 1 << 16, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}

	slots := make([]qp.TxPacket, 8)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
	}
	var outs []ib.Packet
	src := qp.Source{SGID: ib.GIDFromAddr(reqSrc), DGID: ib.GIDFromAddr(reqDst)}
	for i, r := range reqs {
		if err := e.Receive(&r.p, &src); err != nil {
			t.Fatalf("request %d (%v psn %#x): %v", i, r.p.BTH.Opcode(), r.p.BTH.PSN(), err)
		}
		for {
			n := e.Transmit(slots)
			for k := 0; k < n; k++ {
				b := append([]byte(nil), slots[k].Payload()...)
				var p ib.Packet
				if err := ib.ParseIB(b, &p); err != nil {
					t.Fatalf("our response does not parse: %v", err)
				}
				if slots[k].AV.DGID != ib.GIDFromAddr(reqSrc) {
					t.Fatalf("response addressed to %v", slots[k].AV.DGID)
				}
				outs = append(outs, p)
			}
			if n < len(slots) {
				break
			}
		}
	}
	if len(outs) != len(resps) {
		t.Fatalf("%v→%v: we sent %d responses, rxe sent %d", reqSrc, reqDst, len(outs), len(resps))
	}
	for i := range outs {
		got, want := &outs[i], &resps[i].p
		where := fmt.Sprintf("response %d (rxe: %v psn %#x)", i, want.BTH.Opcode(), want.BTH.PSN())
		if got.BTH.Opcode() != want.BTH.Opcode() || got.BTH.PSN() != want.BTH.PSN() || got.BTH.DestQP() != want.BTH.DestQP() ||
			got.BTH.PKey() != want.BTH.PKey() || got.BTH.PadCount() != want.BTH.PadCount() || got.BTH.AckReq() != want.BTH.AckReq() {
			t.Fatalf("%s: BTH %+v, rxe %+v", where, got.BTH.Fields(), want.BTH.Fields())
		}
		if (got.AETH == nil) != (want.AETH == nil) {
			t.Fatalf("%s: AETH presence differs", where)
		}
		if want.AETH != nil && (got.AETH.Syndrome() != want.AETH.Syndrome() || got.AETH.MSN() != want.AETH.MSN()) {
			t.Fatalf("%s: AETH syndrome %#x MSN %d, rxe %#x MSN %d", where, got.AETH.Syndrome(), got.AETH.MSN(),
				want.AETH.Syndrome(), want.AETH.MSN())
		}
		if want.AtomicAckETH != nil && (got.AtomicAckETH == nil || got.AtomicAckETH.Orig() != want.AtomicAckETH.Orig()) {
			t.Fatalf("%s: atomic original differs", where)
		}
		if !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("%s: payload differs (%d vs %d bytes)", where, len(got.Payload), len(want.Payload))
		}
	}
	// The data the requests carried landed where they said.
	var msg []byte
	var wva uint64
	var wkey uint32
	recvIdx := 0
	// Later writes to the same address overwrite earlier ones: check the last.
	lastWrite := map[[2]uint64][]byte{}
	for _, r := range reqs {
		low := uint8(r.p.BTH.Opcode()) & 0x1F
		if r.p.RETH != nil && low != 0x0C {
			wva, wkey, msg = r.p.RETH.VA(), r.p.RETH.RKey(), nil
		}
		if low <= 0x0B || low == 0x16 || low == 0x17 {
			msg = append(msg, r.p.Payload...)
		}
		switch low {
		case 0x08, 0x09, 0x0A, 0x0B: // end of a WRITE
			if len(msg) > 0 {
				lastWrite[[2]uint64{uint64(wkey), wva}] = msg
			}
			msg = nil
		case 0x02, 0x03, 0x04, 0x05, 0x16, 0x17: // end of a SEND
			if !bytes.Equal(rbuf[recvIdx<<16:recvIdx<<16+len(msg)], msg) {
				t.Fatal("SEND data not placed in the receive buffer")
			}
			recvIdx++
			msg = nil
		}
	}
	for k, msg := range lastWrite {
		mem, lo := mems[uint32(k[0])], spans[uint32(k[0])].lo
		if !bytes.Equal(mem[k[1]-lo:k[1]-lo+uint64(len(msg))], msg) {
			t.Fatalf("RDMA WRITE data not placed at %#x", k[1])
		}
	}
	return len(outs)
}

// TestRequesterConformanceWithRxe rebuilds the work requests behind each
// request stream of the reference captures, runs them through our requester
// (feeding it rxe's responses in capture order) and checks that we send the
// packets rxe sent: opcodes, PSNs, AckReq, extension headers and payloads.
func TestRequesterConformanceWithRxe(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	for _, c := range []struct {
		mtuDir string
		mtu    ib.MTU
		names  []string
	}{
		{"mtu4096", ib.MTU4096, []string{"rc_send", "rc_write", "rc_read", "rc_atomic", "rc_write_lat_small"}},
		{"mtu1024", ib.MTU1024, []string{"rc_send", "rc_write", "rc_read"}},
	} {
		for _, name := range c.names {
			t.Run(c.mtuDir+"/"+name, func(t *testing.T) {
				frames, err := readPcap(filepath.Join(dir, c.mtuDir, name+".pcap"))
				if err != nil {
					t.Skip(err)
				}
				var pkts []*capPkt
				for _, f := range frames {
					cp := &capPkt{}
					if err := ib.Parse(f, &cp.p); err != nil {
						t.Fatal(err)
					}
					cp.src, cp.dst = cp.p.IPv4.Src(), cp.p.IPv4.Dst()
					pkts = append(pkts, cp)
				}
				dirs := map[[2]netip.Addr]bool{}
				for _, cp := range pkts {
					if !isResponse(cp.p.BTH.Opcode()) {
						dirs[[2]netip.Addr{cp.src, cp.dst}] = true
					}
				}
				total := 0
				for d := range dirs {
					total += replayRequester(t, pkts, d[0], d[1], c.mtu)
				}
				t.Logf("%d request packets compared", total)
			})
		}
	}
}

func replayRequester(t *testing.T, pkts []*capPkt, reqSrc, reqDst netip.Addr, mtu ib.MTU) int {
	t.Helper()
	var stream, reqs []*capPkt
	for _, cp := range pkts {
		isReq := cp.src == reqSrc && cp.dst == reqDst && !isResponse(cp.p.BTH.Opcode())
		isResp := cp.src == reqDst && cp.dst == reqSrc && isResponse(cp.p.BTH.Opcode())
		if isReq {
			reqs = append(reqs, cp)
		}
		if isReq || isResp {
			stream = append(stream, cp)
		}
	}
	var respQPN uint32
	for _, cp := range stream {
		if isResponse(cp.p.BTH.Opcode()) {
			respQPN = cp.p.BTH.DestQP()
			break
		}
	}
	clock := &qptest.Clock{}
	e, err := qp.New(qp.Config{Clock: clock, PortMTU: mtu})
	if err != nil {
		t.Fatal(err)
	}
	qp.SetNextQPN(e, respQPN)
	ep, err := qptest.NewEndpoint(e, qp.RC, 256)
	if err != nil {
		t.Fatal(err)
	}
	if err := qptest.BringUp(ep.QP, reqs[0].p.BTH.DestQP(), qptest.RCParams{MTU: mtu, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MinRNRTimer: 12, RdAtomic: 128, Access: allAccess}, uint32(reqs[0].p.BTH.PSN()), 0,
		ib.GIDFromAddr(reqSrc), ib.GIDFromAddr(reqDst)); err != nil {
		t.Fatal(err)
	}
	// Rebuild the messages: data goes into a local buffer, one region per WR.
	local := make([]byte, 64<<20)
	lmr, _ := ep.PD.RegMR(local, 0, qp.AccessLocalWrite)
	type msg struct {
		wr   qp.SendWR
		off  int
		data []byte // what the message carried, or what READ should bring back
	}
	var msgs []*msg
	var cur *msg
	off := 0
	for _, r := range reqs {
		op := uint8(r.p.BTH.Opcode()) & 0x1F
		cl := op
		first := cl == 0x00 || cl == 0x04 || cl == 0x05 || cl == 0x06 || cl == 0x0A || cl == 0x0B || cl == 0x0C ||
			cl == 0x13 || cl == 0x14 || cl == 0x17
		if first {
			cur = &msg{off: off}
			msgs = append(msgs, cur)
			cur.wr.ID = uint64(len(msgs))
			cur.wr.Flags = qp.SendSignaled
		}
		if cur == nil {
			t.Fatalf("capture starts mid-message (%v)", r.p.BTH.Opcode())
		}
		w := &cur.wr
		switch {
		case op <= 0x05 || op == 0x16 || op == 0x17:
			w.Opcode = qp.WRSend
		case op <= 0x0B:
			w.Opcode = qp.WRRDMAWrite
		case op == 0x0C:
			w.Opcode = qp.WRRDMARead
		case op == 0x13:
			w.Opcode = qp.WRAtomicCmpAndSwp
		case op == 0x14:
			w.Opcode = qp.WRAtomicFetchAndAdd
		}
		if r.p.RETH != nil {
			w.RemoteAddr, w.RKey = r.p.RETH.VA(), r.p.RETH.RKey()
			if op == 0x0C {
				cur.data = make([]byte, r.p.RETH.DMALen())
			}
		}
		if r.p.AtomicETH != nil {
			w.RemoteAddr, w.RKey = r.p.AtomicETH.VA(), r.p.AtomicETH.RKey()
			if op == 0x13 {
				w.Swap, w.CompareAdd = r.p.AtomicETH.SwapAdd(), r.p.AtomicETH.Compare()
			} else {
				w.CompareAdd = r.p.AtomicETH.SwapAdd()
			}
			cur.data = make([]byte, 8)
		}
		if r.p.ImmDt != nil {
			w.Imm = r.p.ImmDt.Imm()
			if w.Opcode == qp.WRSend {
				w.Opcode = qp.WRSendWithImm
			} else {
				w.Opcode = qp.WRRDMAWriteWithImm
			}
		}
		if r.p.IETH != nil {
			w.Opcode, w.InvalidateRKey = qp.WRSendWithInv, r.p.IETH.RKey()
		}
		if r.p.BTH.Solicited() {
			w.Flags |= qp.SendSolicited
		}
		if op <= 0x0B || op == 0x16 || op == 0x17 {
			cur.data = append(cur.data, r.p.Payload...)
		}
	}
	for _, m := range msgs {
		m.off = off
		if m.wr.Opcode == qp.WRRDMARead || m.wr.Opcode == qp.WRAtomicCmpAndSwp || m.wr.Opcode == qp.WRAtomicFetchAndAdd {
			// Expected results come from rxe's responses, filled in below.
		} else {
			copy(local[off:], m.data)
		}
		m.wr.SGL = []qp.SGE{{Addr: uint64(off), Length: uint32(len(m.data)), LKey: lmr.LKey()}}
		off += (len(m.data) + 63) &^ 63
		if err := ep.QP.PostSend(&m.wr); err != nil {
			t.Fatal(err)
		}
	}
	slots := make([]qp.TxPacket, 16)
	for i := range slots {
		slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
	}
	var ours []ib.Packet
	pull := func() {
		for {
			n := e.Transmit(slots)
			for k := 0; k < n; k++ {
				var p ib.Packet
				if err := ib.ParseIB(append([]byte(nil), slots[k].Payload()...), &p); err != nil {
					t.Fatal(err)
				}
				ours = append(ours, p)
			}
			if n < len(slots) {
				return
			}
		}
	}
	src := qp.Source{SGID: ib.GIDFromAddr(reqDst), DGID: ib.GIDFromAddr(reqSrc)}
	compared := 0
	readResp := map[ib.PSN][]byte{}
	for _, cp := range stream {
		if isResponse(cp.p.BTH.Opcode()) {
			readResp[cp.p.BTH.PSN()] = cp.p.Payload
			if cp.p.AtomicAckETH != nil {
				b := make([]byte, 8)
				binary.NativeEndian.PutUint64(b, cp.p.AtomicAckETH.Orig())
				readResp[cp.p.BTH.PSN()] = b
			}
			if err := e.Receive(&cp.p, &src); err != nil {
				t.Fatalf("rxe response %v psn %#x rejected: %v", cp.p.BTH.Opcode(), cp.p.BTH.PSN(), err)
			}
			continue
		}
		if len(ours) == 0 {
			pull()
		}
		if len(ours) == 0 {
			t.Fatalf("rxe sent %v psn %#x; we had nothing to send", cp.p.BTH.Opcode(), cp.p.BTH.PSN())
		}
		got, want := &ours[0], &cp.p
		ours = ours[1:]
		where := fmt.Sprintf("request %d (rxe: %v psn %#x)", compared, want.BTH.Opcode(), want.BTH.PSN())
		if got.BTH.Fields() != want.BTH.Fields() {
			t.Fatalf("%s: BTH %+v, rxe %+v", where, got.BTH.Fields(), want.BTH.Fields())
		}
		for _, h := range [][2][]byte{{got.RETH, want.RETH}, {got.AtomicETH, want.AtomicETH}, {got.ImmDt, want.ImmDt},
			{got.IETH, want.IETH}, {got.Payload, want.Payload}} {
			if !bytes.Equal(h[0], h[1]) {
				t.Fatalf("%s: headers or payload differ: % x vs rxe % x", where, h[0], h[1])
			}
		}
		compared++
	}
	pull()
	if len(ours) != 0 {
		t.Fatalf("we sent %d more packets than rxe (first %v psn %#x)", len(ours), ours[0].BTH.Opcode(), ours[0].BTH.PSN())
	}
	wcs := pollAll(ep.SCQ, nil)
	if len(wcs) != len(msgs) {
		t.Fatalf("%d completions for %d messages", len(wcs), len(msgs))
	}
	for i, wc := range wcs {
		if wc.Status != qp.WCSuccess || wc.WRID != uint64(i+1) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	// READ and atomic results are what rxe answered.
	for _, r := range reqs {
		op := r.p.BTH.Opcode()
		if op != ib.RCReadRequest && op != ib.RCFetchAdd && op != ib.RCCompareSwap {
			continue
		}
		var want []byte
		for k := uint32(0); ; k++ {
			b, ok := readResp[r.p.BTH.PSN().Add(k)]
			if !ok {
				break
			}
			want = append(want, b...)
			if op != ib.RCReadRequest || uint32(len(want)) >= r.p.RETH.DMALen() {
				break
			}
		}
		var m *msg
		for _, x := range msgs {
			if x.wr.RemoteAddr == rAddr(r) && x.wr.Opcode != qp.WRRDMAWrite {
				m = x
			}
		}
		if m == nil || !bytes.Equal(local[m.off:m.off+len(want)], want) {
			t.Fatalf("result of %v psn %#x differs from rxe's response", op, r.p.BTH.PSN())
		}
	}
	return compared
}

func rAddr(r *capPkt) uint64 {
	if r.p.RETH != nil {
		return r.p.RETH.VA()
	}
	return r.p.AtomicETH.VA()
}

// TestUDConformanceWithRxe checks UD against ibv_ud_pingpong traffic: our UD
// sends carry what rxe's did (BTH with the running PSN, DETH Q_Key and source
// QP, payload), and rxe's packets are received with the 40-byte GRH area and
// the source QP in the completion.
func TestUDConformanceWithRxe(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	for _, mtuDir := range []string{"mtu4096", "mtu1024"} {
		t.Run(mtuDir, func(t *testing.T) {
			frames, err := readPcap(filepath.Join(dir, mtuDir, "ud_send.pcap"))
			if err != nil {
				t.Skip(err)
			}
			var pkts []*capPkt
			for _, f := range frames {
				cp := &capPkt{}
				if err := ib.Parse(f, &cp.p); err != nil {
					t.Fatal(err)
				}
				cp.src, cp.dst = cp.p.IPv4.Src(), cp.p.IPv4.Dst()
				pkts = append(pkts, cp)
			}
			senders := map[netip.Addr][]*capPkt{}
			for _, cp := range pkts {
				senders[cp.src] = append(senders[cp.src], cp)
			}
			for srcAddr, sent := range senders {
				first := sent[0].p
				e, _ := qp.New(qp.Config{Clock: &qptest.Clock{}, PortMTU: ib.MTU4096})
				qp.SetNextQPN(e, first.DETH.SrcQP())
				ep, err := qptest.NewEndpoint(e, qp.UD, 16)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range []struct {
					a    qp.QPAttr
					mask qp.AttrMask
				}{
					{qp.QPAttr{State: qp.StateInit, Port: 1, QKey: first.DETH.QKey()}, qp.AttrState | qp.AttrPKeyIndex | qp.AttrPort | qp.AttrQKey},
					{qp.QPAttr{State: qp.StateRTR}, qp.AttrState},
					{qp.QPAttr{State: qp.StateRTS, SQPSN: uint32(first.BTH.PSN())}, qp.AttrState | qp.AttrSQPSN},
				} {
					if err := ep.QP.Modify(&s.a, s.mask); err != nil {
						t.Fatal(err)
					}
				}
				buf := make([]byte, 64<<10)
				mr, _ := ep.PD.RegMR(buf, 0, qp.AccessLocalWrite)
				ah, _ := ep.PD.CreateAH(qp.AddressVector{DGID: ib.GIDFromAddr(sent[0].dst), SGID: ib.GIDFromAddr(srcAddr)})
				for i, cp := range sent {
					copy(buf[i*4096:], cp.p.Payload)
					wr := qp.SendWR{ID: uint64(i), Opcode: qp.WRSend, AH: ah, RemoteQPN: cp.p.BTH.DestQP(), RemoteQKey: cp.p.DETH.QKey(),
						SGL: []qp.SGE{{Addr: uint64(i * 4096), Length: uint32(len(cp.p.Payload)), LKey: mr.LKey()}}}
					if cp.p.ImmDt != nil {
						wr.Opcode, wr.Imm = qp.WRSendWithImm, cp.p.ImmDt.Imm()
					}
					if err := ep.QP.PostSend(&wr); err != nil {
						t.Fatal(err)
					}
				}
				slots := make([]qp.TxPacket, len(sent)+1)
				for i := range slots {
					slots[i] = qp.TxPacket{Buf: make([]byte, 4096+256), Headroom: 64}
				}
				if n := e.Transmit(slots); n != len(sent) {
					t.Fatalf("sent %d packets, rxe %d", n, len(sent))
				}
				for i, cp := range sent {
					var p ib.Packet
					if err := ib.ParseIB(slots[i].Payload(), &p); err != nil {
						t.Fatal(err)
					}
					if p.BTH.Fields() != cp.p.BTH.Fields() || !bytes.Equal(p.DETH, cp.p.DETH) || !bytes.Equal(p.Payload, cp.p.Payload) {
						t.Fatalf("UD send %d: BTH %+v DETH % x, rxe BTH %+v DETH % x", i, p.BTH.Fields(), []byte(p.DETH),
							cp.p.BTH.Fields(), []byte(cp.p.DETH))
					}
					if slots[i].AV.DGID != ib.GIDFromAddr(cp.dst) {
						t.Fatal("UD send addressed wrongly")
					}
				}
				// Receive what the peer sent to this address.
				rbuf := make([]byte, 16*(40+4096))
				rmr, _ := ep.PD.RegMR(rbuf, 1<<20, qp.AccessLocalWrite)
				var in []*capPkt
				for _, cp := range pkts {
					if cp.dst == srcAddr {
						in = append(in, cp)
					}
				}
				for i := range in {
					ep.QP.PostRecv(&qp.RecvWR{ID: uint64(i), SGL: []qp.SGE{{Addr: 1<<20 + uint64(i*(40+4096)), Length: 40 + 4096, LKey: rmr.LKey()}}})
				}
				for _, cp := range in {
					src := qp.Source{SGID: ib.GIDFromAddr(cp.src), NetworkHeader: cp.p.IPv4[:20]}
					if err := e.Receive(&cp.p, &src); err != nil {
						t.Fatal(err)
					}
				}
				wcs := pollAll(ep.RCQ, nil)
				if len(wcs) != len(in) {
					t.Fatalf("%d receive completions for %d packets", len(wcs), len(in))
				}
				for i, wc := range wcs {
					b := rbuf[i*(40+4096):]
					n := len(in[i].p.Payload)
					if wc.Status != qp.WCSuccess || wc.ByteLen != uint32(40+n) || wc.SrcQP != in[i].p.DETH.SrcQP() ||
						!bytes.Equal(b[20:40], in[i].p.IPv4[:20]) || !bytes.Equal(b[40:40+n], in[i].p.Payload) {
						t.Fatalf("receive %d: %+v", i, wc)
					}
				}
			}
		})
	}
}
