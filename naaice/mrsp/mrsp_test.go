package mrsp

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// The example client's AAR for three 1024-byte regions: region 0
// single-send input, region 1 input, region 2 input and output.
var exampleRegions = []Region{
	{Flags: FlagSingleSend | FlagInput, NAAAddr: 0, HostAddr: 0x55d0a0001000, RKey: 0x1111, Size: 1024},
	{Flags: FlagInput, NAAAddr: 4096, HostAddr: 0x55d0a0002000, RKey: 0x2222, Size: 1024},
	{Flags: FlagInput | FlagOutput, NAAAddr: 8192, HostAddr: 0x55d0a0003000, RKey: 0x3333, Size: 1024},
}

const exampleAAR = "01030000" +
	"06000000000000000000" + "55d0a0001000" + "00001111" + "00000400" +
	"04000000000010000000" + "55d0a0002000" + "00002222" + "00000400" +
	"0c000000000020000000" + "55d0a0003000" + "00003333" + "00000400"

func hx(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAARGolden(t *testing.T) {
	b, err := AppendAAR(nil, exampleRegions)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 76 || hex.EncodeToString(b) != exampleAAR {
		t.Fatalf("AAR %x", b)
	}
	got, err := ParseAAR(b, nil, make([]Region, 0, MaxAAREntries))
	if err != nil || len(got) != 3 {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != exampleRegions[i] {
			t.Fatalf("%d: %+v", i, got[i])
		}
	}
	if typ, err := Type(b); typ != MsgAAR || err != nil {
		t.Fatal(typ, err)
	}
	addrs := SequentialNAAAddrs(0, []uint32{1024, 1024, 1024}, nil)
	if addrs[0] != 0 || addrs[1] != 4096 || addrs[2] != 8192 {
		t.Fatal(addrs)
	}
}

func TestAGolden(t *testing.T) {
	adv := []Advert{{0x7f00aa000000, 0xa1, 1024}, {0x7f00aa100000, 0xa2, 1024}, {0x7f00aa200000, 0xa3, 1024}}
	b, _ := AppendA(nil, adv)
	want := "02030000" + "00007f00aa000000000000a100000400" + "00007f00aa100000000000a200000400" + "00007f00aa200000000000a300000400"
	if len(b) != 52 || hex.EncodeToString(b) != want {
		t.Fatalf("A %x", b)
	}
	got, err := ParseA(b, nil)
	if err != nil || len(got) != 3 || got[2] != adv[2] {
		t.Fatal(got, err)
	}
	if err := MatchA(exampleRegions, got); err != nil {
		t.Fatal(err)
	}
	withInternal := append([]Region{}, exampleRegions...)
	withInternal = append(withInternal, Region{Flags: FlagInternal, NAAAddr: 12288, Size: 100})
	if err := MatchA(withInternal, got); err != nil {
		t.Fatal(err)
	}
	if err := MatchA(withInternal, got[:2]); err != errCountMismatch {
		t.Fatal(err)
	}
	small := append([]Advert{}, got...)
	small[1].Size = 1000
	if err := MatchA(exampleRegions, small); err != errRegionTooSmall {
		t.Fatal(err)
	}
	if err := MatchA(exampleRegions[:2], got); err != errCountMismatch {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    string
		want error
	}{
		{"short", "0201", errShort},
		{"short entries", "02020000" + "00007f00aa000000000000a100000400", errShort},
		{"trailing", "02000000ff", errLength},
		{"type", "01000000", errBadType},
		{"padding", "02000100", errPadding},
		{"zero size", "02010000" + "00007f00aa000000000000a100000000", errZeroSize},
		{"wrap", "02010000" + "fffffffffffffff0000000a100000400", errWrap},
		{"overlap", "02020000" + "00007f00aa000000000000a100000400" + "00007f00aa000200000000a200000400", errOverlap},
		{"too many", "02ff0000", errTooManyRegions},
	} {
		if _, err := ParseA(hx(t, tc.b), nil); err != tc.want {
			t.Errorf("%s: %v want %v", tc.name, err, tc.want)
		}
	}
	if _, err := ParseA(hx(t, "02000000"), nil); err != nil {
		t.Error("empty A:", err)
	}
}

func TestErrMsg(t *testing.T) {
	b := AppendErr(nil, CodeTooManyRegions)
	if hex.EncodeToString(b) != "00030000" {
		t.Fatalf("%x", b)
	}
	if c, err := ParseErr(b); c != CodeTooManyRegions || err != nil {
		t.Fatal(c, err)
	}
	for s, want := range map[string]error{"000100": errShort, "0001000000": errLength, "01010000": errBadType,
		"00010001": errPadding, "00000000": errZeroCode} {
		if _, err := ParseErr(hx(t, s)); err != want {
			t.Errorf("%s: %v want %v", s, err, want)
		}
	}
	if typ, err := Type([]byte{3}); err != errBadType || typ != MsgR {
		t.Fatal(typ, err)
	}
	if _, err := Type(nil); err != errShort {
		t.Fatal(err)
	}
}

func TestAARErrors(t *testing.T) {
	enc := func(rs ...Region) []byte {
		b, err := AppendAAR(nil, rs)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ok := Region{Flags: FlagInput, NAAAddr: 0, HostAddr: 0x1000, RKey: 1, Size: 4096}
	at := func(addr uint64, size uint32) Region { r := ok; r.NAAAddr, r.Size = addr, size; return r }
	flags := func(f Flags) Region { r := ok; r.Flags = f; return r }
	internal := Region{Flags: FlagInternal, NAAAddr: 8192, Size: 10}
	big := make([]byte, HeaderLen+32*AAREntryLen)
	big[0], big[1] = MsgAAR, 32
	for _, tc := range []struct {
		name string
		b    []byte
		lim  *Limits
		want error
		code ErrCode
	}{
		{"short", []byte{1, 1}, nil, errShort, CodeNoMemory},
		{"truncated entry", enc(ok)[:27], nil, errShort, CodeNoMemory},
		{"trailing", append(enc(ok), 0), nil, errLength, CodeNoMemory},
		{"type", enc(ok)[:0:0], nil, errShort, CodeNoMemory},
		{"empty", []byte{1, 0, 0, 0}, nil, errNoRegions, CodeNoMemory},
		{"padding", func() []byte { b := enc(ok); b[3] = 1; return b }(), nil, errPadding, CodeNoMemory},
		{"32 regions", big, nil, errTooManyRegions, CodeTooManyRegions},
		{"over limit", enc(ok, at(4096, 10)), &Limits{MaxRegions: 1}, errTooManyRegions, CodeTooManyRegions},
		{"unknown flag", enc(flags(0x14)), nil, errFlags, CodeNoMemory},
		{"internal with input", enc(flags(FlagInternal | FlagInput)), nil, errFlags, CodeNoMemory},
		{"internal with host buffer", enc(Region{Flags: FlagInternal, HostAddr: 1, Size: 1}), nil, errFlags, CodeNoMemory},
		{"single-send not input", enc(flags(FlagSingleSend)), nil, errFlags, CodeNoMemory},
		{"zero size", enc(at(0, 0)), nil, errZeroSize, CodeInvalidAddress},
		{"region too large", enc(at(0, 1<<31+1)), nil, errRegionTooLarge, CodeNoMemory},
		{"region over limit", enc(at(0, 5000)), &Limits{MaxRegionSize: 4096}, errRegionTooLarge, CodeNoMemory},
		{"total", enc(ok, at(4096, 4096)), &Limits{MaxTotal: 8000}, errTotalTooLarge, CodeNoMemory},
		{"unaligned", enc(at(100, 10)), nil, errUnaligned, CodeInvalidAddress},
		{"out of bounds", enc(at(1<<20, 10)), &Limits{NAAMemSize: 1 << 20}, errInvalidAddress, CodeInvalidAddress},
		{"ends past memory", enc(at(1<<20-4096, 4097)), &Limits{NAAMemSize: 1 << 20}, errOutOfMemory, CodeNoMemory},
		{"overlap", enc(ok, at(0, 10)), nil, errOverlap, CodeInvalidAddress},
		{"overlap rounded", enc(at(0, 10), internal, at(4096, 4097), at(8192, 1)), nil, errOverlap, CodeInvalidAddress},
		{"host wrap", enc(Region{Flags: FlagInput, HostAddr: ^uint64(0), Size: 2}), nil, errWrap, CodeInvalidAddress},
	} {
		_, err := ParseAAR(tc.b, tc.lim, nil)
		var e *Error
		if !errors.Is(err, tc.want) || !errors.As(err, &e) || e.Code != tc.code {
			t.Errorf("%s: %v want %v (code %d)", tc.name, err, tc.want, tc.code)
		}
	}
	if _, err := ParseAAR(enc(at(100, 10)), &Limits{AnyAlignment: true}, nil); err != nil {
		t.Error(err)
	}
	if _, err := ParseAAR(enc(ok, internal), nil, nil); err != nil {
		t.Error(err)
	}
	if _, err := AppendAAR(nil, []Region{{NAAAddr: 1 << 56, Size: 1}}); err != errInvalidAddress {
		t.Error(err)
	}
	if _, err := AppendAAR(nil, make([]Region, 32)); err != errTooManyRegions {
		t.Error(err)
	}
	// The largest AAR fits the C receive buffer.
	rs := make([]Region, MaxAAREntries)
	for i := range rs {
		rs[i] = at(uint64(i)*4096, 4096)
	}
	b := enc(rs...)
	if len(b) > RecvBufLen {
		t.Fatalf("%d-byte AAR exceeds %d", len(b), RecvBufLen)
	}
	if _, err := ParseAAR(b, nil, nil); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(100, func() {
		out := make([]Region, 0, MaxAAREntries)
		_, _ = ParseAAR(b, nil, out)
	})
	if n != 0 {
		t.Fatalf("ParseAAR allocates %v", n)
	}
}

func TestImmediates(t *testing.T) {
	v, err := HostImm(1, [3]byte{0, 0, 0})
	if v != 0x81 || err != nil {
		t.Fatal(v, err)
	}
	v, _ = HostImm(3, [3]byte{0xaa, 0xbb, 0xcc})
	var wire [4]byte
	wire[0], wire[1], wire[2], wire[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	if !bytes.Equal(wire[:], []byte{0xcc, 0xbb, 0xaa, 0x83}) {
		t.Fatalf("wire %x", wire)
	}
	fn, user, err := ParseHostImm(v)
	if fn != 3 || user != [3]byte{0xaa, 0xbb, 0xcc} || err != nil {
		t.Fatal(fn, user, err)
	}
	for _, fn := range []uint8{0, 128, 255} {
		if _, err := HostImm(fn, [3]byte{}); err != errFnCode {
			t.Fatal(fn, err)
		}
	}
	for v, want := range map[uint32]error{0: errHostAbort, 0x01: errNoStart, 0x80: errFnCode, 0xff000001: errNoStart} {
		if _, _, err := ParseHostImm(v); err != want {
			t.Errorf("%#x: %v want %v", v, err, want)
		}
	}
	if NAAImm(RCKernelTimeout) != 0x200 {
		t.Fatal(NAAImm(2))
	}
	for _, tc := range []struct {
		v      uint32
		code   uint32
		failed bool
	}{{0, 0, false}, {0x200, 2, true}, {0x02, 2, true}, {0x1000, 0x10, true}} {
		if c, f := ParseNAAImm(tc.v); c != tc.code || f != tc.failed {
			t.Errorf("%#x: %d %v", tc.v, c, f)
		}
	}
}
