package mad

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/goroce/goroce/ib"
)

// The CM REQ test vector of ib-wire.md §8.9 (rdma_cm on rxe, invented IDs).
const vectorMAD = `
01 07 02 03 00 00 00 00 00 00 00 01 1a 2b 3c 4d
00 10 00 00 00 00 00 00 1a 2b 3c 4d 00 00 00 00
00 00 00 00 01 06 4e 21 00 00 00 ff fe 00 00 01
00 00 00 00 00 00 00 00 00 00 11 80 00 00 00 80
00 00 00 a0 12 34 56 a7 ff ff 37 f0 ff ff ff ff
00 00 00 00 00 00 00 00 00 00 ff ff c0 a8 01 01
00 00 00 00 00 00 00 00 00 00 ff ff c0 a8 01 02
83 ca 00 03 00 40 00 88 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 40 c5 a1 00 00 00 00 00 00 00 00
00 00 00 00 c0 a8 01 01 00 00 00 00 00 00 00 00
00 00 00 00 c0 a8 01 02 48 45 4c 4c 4f 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00`

const vectorFrame = "020000000002020000000001080045000134000340004011b662c0a80101c0a80102d87212b7012000006400ffff000000010000000080010000000000010107" +
	"020300000000000000011a2b3c4d00100000000000001a2b3c4d000000000000000001064e21000000fffe000001000000000000000000001180000000800000" +
	"00a0123456a7ffff37f0ffffffff00000000000000000000ffffc0a8010100000000000000000000ffffc0a8010283ca00030040008800000000000000000000" +
	"000000000000000000000000000000000000000000000000000000000000000000000040c5a1000000000000000000000000c0a8010100000000000000000000" +
	"0000c0a8010248454c4c4f000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000bb6c" +
	"3d9a"

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func vectorREQ() (MADFields, REQFields) {
	src, dst := netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.1.2")
	pd := make([]byte, CMAHeaderSize, REQPrivateDataSize)
	CMAHeader(pd).Encode(&CMAHeaderFields{SrcPort: 0xC5A1, Src: src, Dst: dst})
	pd = append(pd, "HELLO"...)
	return CMHeader(AttrREQ, 0x000000011A2B3C4D), REQFields{
		LocalCommID: 0x1A2B3C4D, ServiceID: ServiceID(PortSpaceTCP, 20001),
		LocalCAGUID: 0x000000FFFE000001, LocalQPN: 0x11,
		ResponderResources: 0x80, InitiatorDepth: 0x80,
		RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20, Transport: TransportRC,
		StartingPSN: 0x123456, RetryCount: 7, PKey: 0xFFFF, PathMTU: ib.MTU1024,
		RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: PathFields{LocalLID: 0xFFFF, RemoteLID: 0xFFFF,
			LocalGID: ib.GIDFromAddr(src), RemoteGID: ib.GIDFromAddr(dst),
			FlowLabel: (0xC5A1*31 + 20001) & 0xFFFFF, PacketRate: 3, HopLimit: 64, LocalACKTimeout: 17},
		PrivateData: pd,
	}
}

func TestVectorREQ(t *testing.T) {
	want := unhex(t, vectorMAD)
	h, r := vectorREQ()
	got := make(MAD, Size)
	got.Encode(&h)
	got.REQ().Encode(&r)
	if !bytes.Equal(got, want) {
		t.Fatalf("REQ MAD differs:\n got %x\nwant %x", []byte(got), want)
	}
	if r.Primary.FlowLabel != 0x83CA0 {
		t.Errorf("flow label %#x", r.Primary.FlowLabel)
	}
	// Decoding gives the fields back.
	m, err := ParseCM(want)
	if err != nil {
		t.Fatal(err)
	}
	back := m.REQ().Fields()
	if fmt.Sprint(back.Primary) != fmt.Sprint(r.Primary) || back.ServiceID != r.ServiceID ||
		back.StartingPSN != r.StartingPSN || !bytes.HasPrefix(back.PrivateData, r.PrivateData) {
		t.Errorf("decoded %+v", back)
	}
	cma, err := ParseCMAHeader(back.PrivateData)
	if err != nil {
		t.Fatal(err)
	}
	if cma.Src().String() != "192.168.1.1" || cma.Dst().String() != "192.168.1.2" || cma.SrcPort() != 0xC5A1 {
		t.Errorf("cma_hdr %+v", cma.Fields())
	}
}

func TestVectorFrame(t *testing.T) {
	h, r := vectorREQ()
	payload := make(MAD, Size)
	payload.Encode(&h)
	payload.REQ().Encode(&r)
	spec := ib.FrameSpec{
		SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddr("192.168.1.1"), Dst: netip.MustParseAddr("192.168.1.2"),
		HopLimit: 64, IPID: 3, DontFragment: true, SrcPort: 0xD872,
		BTH:     ib.BTHFields{Opcode: ib.UDSendOnly, PKey: 0xFFFF, DestQP: 1},
		DETH:    &ib.DETHFields{QKey: 0x80010000, SrcQP: 1},
		Payload: payload,
	}
	buf := make([]byte, 512)
	n, err := ib.Build(buf, &spec)
	if err != nil {
		t.Fatal(err)
	}
	if want := unhex(t, vectorFrame); !bytes.Equal(buf[:n], want) {
		t.Fatalf("frame differs:\n got %x\nwant %x", buf[:n], want)
	}
	if n != 322 {
		t.Errorf("frame length %d, want 322", n)
	}
}

func TestServiceID(t *testing.T) {
	for _, c := range []struct {
		ps   PortSpace
		port uint16
		sid  uint64
	}{
		{PortSpaceTCP, 20001, 0x0000000001064E21},
		{PortSpaceUDP, 7174, 0x0000000001111C06},
		{PortSpaceIB, 1, 0x00000000013F0001},
		{PortSpaceIPoIB, 0xFFFF, 0x000000000002FFFF},
	} {
		if got := ServiceID(c.ps, c.port); got != c.sid {
			t.Errorf("ServiceID(%v, %d) = %#x, want %#x", c.ps, c.port, got, c.sid)
		}
		ps, port, ok := SplitServiceID(c.sid)
		if !ok || ps != c.ps || port != c.port {
			t.Errorf("SplitServiceID(%#x) = %v %d %v", c.sid, ps, port, ok)
		}
	}
	for _, sid := range []uint64{0, 0x0000000001070000, 0x1000000001060001} {
		if _, _, ok := SplitServiceID(sid); ok {
			t.Errorf("SplitServiceID(%#x) accepted", sid)
		}
	}
}

func TestCMAHeaderIPv6AndErrors(t *testing.T) {
	b := make([]byte, CMAHeaderSize)
	f := CMAHeaderFields{IPVersion: 6, SrcPort: 1, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2")}
	CMAHeader(b).Encode(&f)
	h, err := ParseCMAHeader(b)
	if err != nil || h.IPVersion() != 6 || h.Fields() != f {
		t.Fatalf("v6 round trip: %+v %v", h.Fields(), err)
	}
	if _, err := ParseCMAHeader(b[:35]); !errors.Is(err, ib.ErrTruncated) {
		t.Errorf("short: %v", err)
	}
	b[0] = 1
	if _, err := ParseCMAHeader(b); !errors.Is(err, ib.ErrUnsupported) {
		t.Errorf("version 1: %v", err)
	}
	b[0], b[1] = 0, 0x50
	if _, err := ParseCMAHeader(b); !errors.Is(err, ib.ErrMalformed) {
		t.Errorf("IP version 5: %v", err)
	}
	// v4-mapped input is written as plain IPv4.
	CMAHeader(b).Encode(&CMAHeaderFields{Src: netip.MustParseAddr("::ffff:10.0.0.1"), Dst: netip.MustParseAddr("::ffff:10.0.0.2")})
	if h := CMAHeader(b); h.IPVersion() != 4 || h.Src() != netip.MustParseAddr("10.0.0.1") || b[15] != 0 || b[16] != 10 {
		t.Errorf("v4-mapped encode: %x", b)
	}
}

func TestRejectError(t *testing.T) {
	m := make(MAD, Size)
	h := CMHeader(AttrREJ, 7)
	m.Encode(&h)
	m.REJ().Encode(&REJFields{RemoteCommID: 5, MessageRejected: MsgREQ, Reason: RejInvalidServiceID,
		ARILength: 3, ARI: []byte{1, 2, 3, 4}, PrivateData: []byte("no")})
	err := error(RejectErrorFrom(m.REJ()))
	if !errors.Is(err, RejInvalidServiceID) || !errors.Is(err, ErrRejected) || errors.Is(err, RejStaleConn) {
		t.Errorf("errors.Is mismatch for %v", err)
	}
	var re *RejectError
	if !errors.As(fmt.Errorf("dial: %w", err), &re) || !bytes.Equal(re.ARI, []byte{1, 2, 3}) ||
		!bytes.HasPrefix(re.PrivateData, []byte("no")) || re.MessageRejected != MsgREQ {
		t.Errorf("RejectError %+v", re)
	}
	if s := err.Error(); s != "cm: rejected: INVALID_SERVICE_ID" {
		t.Errorf("Error() = %q", s)
	}
	if RejectReason(34).String() != "REJ_REASON_34" || RejectReason(999).String() != "REJ_REASON_999" || RejConsumerDefined.String() != "CONSUMER_DEFINED" {
		t.Error("names")
	}
	if !errors.Is(RejTimeout, ErrRejected) {
		t.Error("a bare reason should match ErrRejected")
	}
}

func TestParseErrors(t *testing.T) {
	good := unhex(t, vectorMAD)
	if _, err := ParseCM(good[:255]); !errors.Is(err, ib.ErrTruncated) {
		t.Errorf("255 bytes: %v", err)
	}
	for _, c := range []struct {
		off     int
		val     byte
		wantOff int
	}{{0, 2, 0}, {1, 0x81, 1}, {2, 1, 2}, {3, 0x83, 3}, {3, 0x01, 3}, {17, 0x1b, 16}, {17, 0x01, 16}} {
		b := bytes.Clone(good)
		b[c.off] = c.val
		_, err := ParseCM(b)
		var pe *ParseError
		if !errors.Is(err, ib.ErrUnsupported) || !errors.As(err, &pe) || pe.Offset != c.wantOff {
			t.Errorf("byte %d = %#x: %v", c.off, c.val, err)
		}
	}
	// Longer input (a receive buffer) is cut to one MAD.
	m, err := ParseCM(append(bytes.Clone(good), 1, 2, 3))
	if err != nil || len(m) != Size {
		t.Errorf("long input: %d %v", len(m), err)
	}
	// Fields on short hand-made views do not panic.
	_ = REQ(good[:3]).Fields()
	_ = SIDRREP(nil).Fields()
	_ = MAD(nil).Fields()
	_ = CMAHeader(nil).Fields()
}

func TestPrivateDataSizes(t *testing.T) {
	// Each message's private data ends exactly at the end of the MAD.
	m := make(MAD, Size)
	for a, pd := range map[AttrID][]byte{
		AttrREQ: m.REQ().PrivateData(), AttrMRA: m.MRA().PrivateData(), AttrREJ: m.REJ().PrivateData(),
		AttrREP: m.REP().PrivateData(), AttrRTU: m.RTU().PrivateData(), AttrDREQ: m.DREQ().PrivateData(),
		AttrDREP: m.DREP().PrivateData(), AttrSIDRREQ: m.SIDRREQ().PrivateData(),
		AttrSIDRREP: m.SIDRREP().PrivateData(), AttrLAP: m.LAP().PrivateData(), AttrAPR: m.APR().PrivateData(),
	} {
		if len(pd) != PrivateDataSize(a) || &pd[len(pd)-1] != &m[Size-1] {
			t.Errorf("%v: private data %d bytes, not ending at the MAD end", a, len(pd))
		}
	}
}
