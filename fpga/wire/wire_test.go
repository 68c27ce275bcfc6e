package wire

import (
	"encoding/binary"
	"testing"

	"github.com/goroce/goroce/ib"
)

func TestImm(t *testing.T) {
	m := MakeImm(0x123456, FPGAChannel)
	if m != 0x12345601 || m.Channel() != 1 || m.Counter() != 0x123456 {
		t.Fatalf("%#x", m)
	}
	if MakeImm(0x1000000, 7) != 7 { // the counter keeps 24 bits
		t.Fatalf("%#x", MakeImm(0x1000000, 7))
	}
	// On the wire (big-endian ImmDt) the channel is the last byte.
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(m))
	if b != [4]byte{0x12, 0x34, 0x56, 0x01} {
		t.Fatalf("%x", b)
	}
	// Gen 1: immediate 1 read without ntohl on x86 gave channel 0.
	if Gen1Channel(1) != 0 || Gen1Channel(0x01000000) != 1 {
		t.Fatal("gen1")
	}
}

func TestSetupPSNPairing(t *testing.T) {
	h := HostParams{QPN: 0x11, RqPSN: 0xAAAAAA, SqPSN: 0x555555, MRAddr: 0x7f0000000000, MRLen: 4096 * 256}
	s, err := NewSetup(h, 0x22, DefaultTransport)
	if err != nil {
		t.Fatal(err)
	}
	// The FPGA sends from the host's SQ PSN and the host expects exactly that.
	if s.FPGASqPSN != h.SqPSN || s.HostRTRRqPSN != s.FPGASqPSN || s.HostRTSSqPSN != h.SqPSN || s.FPGARqPSN != h.RqPSN {
		t.Fatalf("%+v", s)
	}
	if s.HostRTRDestQPN != 0x22 || s.FPGADestQPN != 0x11 || s.FPGAPathMTU != ib.MTU4096 || s.HostMinRNRTimer != 12 {
		t.Fatalf("%+v", s)
	}
	if s.HostMinRNRTimer.Duration().Microseconds() != 640 {
		t.Fatal(s.HostMinRNRTimer.Duration())
	}
	for _, tc := range []struct {
		h    HostParams
		qpn  uint32
		tr   Transport
		want error
	}{
		{h, 0, DefaultTransport, errQPN},
		{h, 1 << 24, DefaultTransport, errQPN},
		{HostParams{QPN: 1, RqPSN: 1 << 24}, 2, DefaultTransport, errPSN},
		{h, 2, Transport{PMTU: 6}, errPMTU},
		{h, 2, Transport{PMTU: ib.MTU1024, MinRNRTimer: 32}, errRNRTimer},
		{h, 2, Transport{PMTU: ib.MTU1024, RNRRetry: 8}, errRetry},
	} {
		if _, err := NewSetup(tc.h, tc.qpn, tc.tr); err != tc.want {
			t.Errorf("%+v: %v want %v", tc, err, tc.want)
		}
	}
}

func TestSlabLen(t *testing.T) {
	if n, err := SlabLen(DefaultMaxPayload, DefaultRxQueueDepth); n != 9000*256 || err != nil {
		t.Fatal(n, err)
	}
	if _, err := SlabLen(1<<16, 1<<16); err != errSlabTooLarge {
		t.Fatal(err)
	}
	if n, err := SlabLen(1<<16, 1<<16-1); err != nil || n != (1<<32)-(1<<16) {
		t.Fatal(n, err)
	}
	if _, err := SlabLen(0, 1); err != errConfig {
		t.Fatal(err)
	}
}

func TestCheck(t *testing.T) {
	c := Checker{NumSlots: 256, MaxPayload: 4096}
	good := Completion{Slot: 3, Kind: KindSendImm, ByteLen: 100, Imm: MakeImm(9, 1)}
	f, a, err := c.Check(good)
	if err != nil || a != Deliver || f != (Frame{Slot: 3, Offset: 3 * 4096, Len: 100, Channel: 1, Counter: 9}) {
		t.Fatal(f, a, err)
	}
	for _, tc := range []struct {
		mod  func(*Completion)
		act  Action
		want error
	}{
		{func(w *Completion) { w.Slot = 256 }, Drop, errSlotRange},
		{func(w *Completion) { w.Slot = 1 << 40; w.Status = StatusFlush }, Drop, errSlotRange},
		{func(w *Completion) { w.Status = StatusFlush }, Stop, errFlushed},
		{func(w *Completion) { w.Status = StatusError }, Repost, errStatus},
		{func(w *Completion) { w.Kind = KindWriteImm }, Repost, errOpcode},
		{func(w *Completion) { w.Kind = KindSend }, Repost, errOpcode},
		{func(w *Completion) { w.Kind = KindOther }, Repost, errOpcode},
		{func(w *Completion) { w.ByteLen = 0 }, Repost, errZeroLength},
		{func(w *Completion) { w.ByteLen = 4097 }, Repost, errTooLong},
	} {
		w := good
		tc.mod(&w)
		if _, a, err := c.Check(w); a != tc.act || err != tc.want {
			t.Errorf("%+v: %v %v want %v %v", w, a, err, tc.act, tc.want)
		}
	}
	c.AcceptWrite = true
	w := good
	w.Kind = KindWriteImm
	if _, a, err := c.Check(w); a != Deliver || err != nil {
		t.Fatal(a, err)
	}
	if n := testing.AllocsPerRun(100, func() { c.Check(good) }); n != 0 {
		t.Fatal(n)
	}
}

func TestSequence(t *testing.T) {
	q := Sequence{Wrap: 10}
	for i, tc := range [][2]uint32{{0, 0}, {1, 0}, {2, 0}, {5, 2}, {9, 3}, {0, 0}, {3, 2}, {14, 0}} {
		if g := q.Observe(tc[0]); g != tc[1] {
			t.Fatalf("%d: gap %d want %d", i, g, tc[1])
		}
	}
	if q.Gaps != 7 {
		t.Fatal(q.Gaps)
	}
}

func FuzzCheck(f *testing.F) {
	f.Add(uint64(3), uint8(0), uint8(1), uint32(100), uint32(0x901), uint32(256), uint32(4096))
	f.Fuzz(func(t *testing.T, slot uint64, st, kind uint8, n, imm, slots, maxp uint32) {
		c := Checker{NumSlots: slots, MaxPayload: maxp, AcceptWrite: kind&0x80 != 0}
		fr, a, err := c.Check(Completion{Slot: slot, Status: Status(st % 4), Kind: Kind(kind % 5), ByteLen: n, Imm: Imm(imm)})
		if (a == Deliver) != (err == nil) {
			t.Fatal(a, err)
		}
		if a == Deliver && (fr.Len == 0 || fr.Len > maxp || uint64(fr.Slot) >= uint64(slots) ||
			fr.Offset+uint64(fr.Len) > uint64(slots)*uint64(maxp) || fr.Channel != uint8(imm)) {
			t.Fatalf("%+v", fr)
		}
		var q Sequence
		q.Wrap = slots
		q.Observe(imm >> 8)
		q.Observe(n)
	})
}
