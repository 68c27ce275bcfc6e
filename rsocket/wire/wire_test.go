package wire

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"
)

// A REP as rstream on x86 sends it: version 1, flags 0x02, 384 credits, no
// iomap, target SGL of 2 entries, half of a 1 MiB ring.
const rstreamREP = "01" + "02" + "0180" + "000000" + "00" +
	"00005555aaaa1000" + "00001234" + "00000002" +
	"00007f0000200000" + "00005678" + "00080000"

func mustHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConnDataGolden(t *testing.T) {
	b := mustHex(t, rstreamREP)
	c, err := ParseConnData(b)
	if err != nil {
		t.Fatal(err)
	}
	want := ConnData{Version: 1, Flags: ConnFlagIOMap, Credits: 384,
		TargetSGL: SGE{Addr: 0x5555aaaa1000, Key: 0x1234, Length: 2},
		DataBuf:   SGE{Addr: 0x7f0000200000, Key: 0x5678, Length: 512 << 10}}
	if c != want {
		t.Fatalf("got %+v want %+v", c, want)
	}
	if c.EntryOrder() != binary.LittleEndian || c.IOMapSize() != 0 || c.IOMapAddr() != 0x5555aaaa1020 {
		t.Fatalf("derived fields: %v %d %#x", c.EntryOrder(), c.IOMapSize(), c.IOMapAddr())
	}
	got := c.AppendTo(nil)
	if hex.EncodeToString(got) != rstreamREP {
		t.Fatalf("re-encode %x", got)
	}
	n := NewConnData(384, 0, 0x5555aaaa1000, 0x1234, 0x7f0000200000, 0x5678, 1<<20, false)
	if n != want {
		t.Fatalf("NewConnData %+v", n)
	}
	// Longer private data (REQ padding) is accepted.
	if _, err := ParseConnData(append(b, make([]byte, 16)...)); err != nil {
		t.Fatal(err)
	}
}

func TestConnDataErrors(t *testing.T) {
	base := mustHex(t, rstreamREP)
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:39] }, errShort},
		{"version0", func(b []byte) []byte { b[0] = 0; return b }, errVersion},
		{"version2", func(b []byte) []byte { b[0] = 2; return b }, errVersion},
		{"flags", func(b []byte) []byte { b[1] = 0x06; return b }, errReservedFlags},
		{"reserved", func(b []byte) []byte { b[5] = 1; return b }, errReservedBytes},
		{"sgl1", func(b []byte) []byte { b[23] = 1; return b }, errSGLLength},
		{"sgl0", func(b []byte) []byte { b[23] = 0; return b }, errSGLLength},
		{"zero buf", func(b []byte) []byte { copy(b[36:40], []byte{0, 0, 0, 0}); return b }, errZeroLength},
		{"buf wraps", func(b []byte) []byte { copy(b[24:32], mustHex(t, "fffffffffffffff0")); return b }, errWrap},
		{"list wraps", func(b []byte) []byte { copy(b[8:16], mustHex(t, "fffffffffffffff0")); return b }, errWrap},
		{"overlap", func(b []byte) []byte { copy(b[24:32], mustHex(t, "00005555aaaa1010")); return b }, errOverlap},
		{"overlap iomap", func(b []byte) []byte {
			b[7] = 2
			copy(b[24:32], mustHex(t, "00005555aaaa1040"))
			return b
		}, errOverlap},
	} {
		b := tc.mod(append([]byte(nil), base...))
		if _, err := ParseConnData(b); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v want %v", tc.name, err, tc.want)
		}
	}
	// Without the IOMAP flag the iomap size is ignored, so the same buffer
	// no longer overlaps.
	b := append([]byte(nil), base...)
	b[1], b[7] = 0, 2
	copy(b[24:32], mustHex(t, "00005555aaaa1040"))
	if _, err := ParseConnData(b); err != nil {
		t.Errorf("no IOMAP flag: %v", err)
	}
}

func TestIOMapScale(t *testing.T) {
	for _, tc := range []struct {
		v    int
		b    uint8
		back int
	}{
		{0, 0, 0}, {1, 1, 1}, {128, 128, 128}, {129, 0x80, 128}, {255, 0x80, 128},
		{256, 0x81, 256}, {300, 0x81, 256}, {1024, 0x84, 1024}, {MaxIOMapSize, 0xFF, MaxIOMapSize},
		{0xFFFE, 0xFF, MaxIOMapSize},
	} {
		b := IOMapSizeToScale(tc.v)
		if b != tc.b || IOMapSizeFromScale(b) != tc.back {
			t.Errorf("%d: scale %#x back %d, want %#x %d", tc.v, b, IOMapSizeFromScale(b), tc.b, tc.back)
		}
	}
}

func TestClampQPSize(t *testing.T) {
	for _, tc := range [][3]int{{0, 0, 16}, {384, 0, 384}, {70000, 0, 0xFFFE}, {384, 256, 256}, {8, 256, 16}} {
		if got := ClampQPSize(tc[0], tc[1]); got != tc[2] {
			t.Errorf("ClampQPSize(%d,%d)=%d want %d", tc[0], tc[1], got, tc[2])
		}
	}
}

func TestImm(t *testing.T) {
	for _, tc := range []struct {
		v    uint32
		op   Op
		data uint32
		err  error
	}{
		{0x00000800, OpData, 2048, nil},
		{0x00010000, OpData, 65536, nil},
		{0x00000000, OpData, 0, errZeroData},
		{0x20000001, OpRsvdDataMore, 1, errReservedOp},
		{0x40000001, OpWrite, 1, errReservedOp},
		{0x60000001, OpRsvdDRAMore, 1, errReservedOp},
		{0x80000180, OpSGL, 384, nil},
		{0xA0000000, OpRsvd, 0, errReservedOp},
		{0xC0000003, OpIOMapSGL, 3, nil},
		{0xC0010000, OpIOMapSGL, 0x10000, errIOMapReserved},
		{0xE0000000, OpCtrl, CtrlDisconnect, nil},
		{0xE0000001, OpCtrl, CtrlKeepalive, nil},
		{0xE0000002, OpCtrl, CtrlShutdown, nil},
		{0xE0000003, OpCtrl, 3, errBadCtrl},
	} {
		m, err := ParseImm(tc.v)
		if m.Op() != tc.op || m.Data() != tc.data || err != tc.err {
			t.Errorf("%#08x: %v %d %v, want %v %d %v", tc.v, m.Op(), m.Data(), err, tc.op, tc.data, tc.err)
		}
		if MakeImm(tc.op, tc.data) != Imm(tc.v) {
			t.Errorf("MakeImm(%v,%d)=%#x", tc.op, tc.data, MakeImm(tc.op, tc.data))
		}
	}
	if ImmDisconnect != 0xE0000000 || ImmShutdown != 0xE0000002 {
		t.Fatal("ctrl constants")
	}
	if !OpData.ConsumesCredit() || !OpIOMapSGL.ConsumesCredit() || OpSGL.ConsumesCredit() || OpCtrl.ConsumesCredit() {
		t.Fatal("ConsumesCredit")
	}
}

func TestSGEAndIOMap(t *testing.T) {
	s := SGE{Addr: 0x1122334455667788, Key: 0xaabbccdd, Length: 0x10000}
	var b [IOMapEntryLen]byte
	s.Put(b[:], binary.LittleEndian)
	if hex.EncodeToString(b[:16]) != "8877665544332211ddccbbaa00000100" {
		t.Fatalf("LE sge %x", b[:16])
	}
	s.Put(b[:], binary.BigEndian)
	if hex.EncodeToString(b[:16]) != "1122334455667788aabbccdd00010000" {
		t.Fatalf("BE sge %x", b[:16])
	}
	if got, err := ParseAdvert(b[:16], binary.BigEndian); err != nil || got != s {
		t.Fatal(got, err)
	}
	if _, err := ParseAdvert(b[:15], binary.BigEndian); err != errShort {
		t.Fatal(err)
	}
	e := IOMapEntry{Offset: 4096, SGE: SGE{Addr: 0x10000, Key: 7, Length: 4096}}
	e.Put(b[:], binary.LittleEndian)
	if hex.EncodeToString(b[:]) != "0010000000000000"+"0000010000000000"+"07000000"+"00100000" {
		t.Fatalf("iomap %x", b)
	}
	if !e.Contains(4096) || !e.Contains(8191) || e.Contains(8192) || e.Contains(4095) {
		t.Fatal("Contains")
	}
	if TargetListLen(0) != 32 || TargetListLen(2) != 80 || IOMapOffset(1) != 56 {
		t.Fatal("layout")
	}
	tbl := make([]byte, 3*IOMapEntryLen)
	e.Put(tbl, binary.LittleEndian)
	f := IOMapEntry{Offset: 0, SGE: SGE{Addr: 0x20000, Key: 8, Length: 4096}}
	f.Put(tbl[2*IOMapEntryLen:], binary.LittleEndian)
	got, err := ParseIOMapTable(tbl, 3, binary.LittleEndian, nil)
	if err != nil || len(got) != 3 || got[0] != e || got[1].Length != 0 || got[2] != f {
		t.Fatal(got, err)
	}
	f.Offset = 5000 // offset range overlaps e's
	f.Put(tbl[2*IOMapEntryLen:], binary.LittleEndian)
	if _, err := ParseIOMapTable(tbl, 3, binary.LittleEndian, nil); err != errOverlap {
		t.Fatal(err)
	}
	var sgl [32]byte
	SGE{Addr: 100, Key: 1, Length: 50}.Put(sgl[:], binary.LittleEndian)
	SGE{Addr: 120, Key: 1, Length: 50}.Put(sgl[16:], binary.LittleEndian)
	if _, err := ParseTargetSGL(sgl[:], binary.LittleEndian); err != errOverlap {
		t.Fatal(err)
	}
	SGE{Addr: 150, Key: 1, Length: 50}.Put(sgl[16:], binary.LittleEndian)
	if _, err := ParseTargetSGL(sgl[:], binary.LittleEndian); err != nil {
		t.Fatal(err)
	}
}
