package mad

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/goroce/goroce/ib"
)

// TestBitLayout encodes messages the captures do not contain (MRA, REJ, LAP,
// APR, SIDR_REP with info) and checks the bytes the kernel field macros
// (ibta_vol1_c12.h) put each field in, then decodes them back.
func TestBitLayout(t *testing.T) {
	d := make([]byte, DataSize)

	MRA(d).Encode(&MRAFields{LocalCommID: 0x01020304, RemoteCommID: 0x05060708, MessageMRAed: MsgOther, ServiceTimeout: 24, PrivateData: []byte{0xEE}})
	check(t, "MRA", d, map[int]byte{0: 1, 3: 4, 4: 5, 7: 8, 8: 0x80, 9: 24 << 3, 10: 0xEE})
	if f := MRA(d).Fields(); f.ServiceTimeout != 24 || f.MessageMRAed != MsgOther {
		t.Errorf("MRA %+v", f)
	}

	REJ(d).Encode(&REJFields{LocalCommID: 1, RemoteCommID: 2, MessageRejected: MsgREP, ARILength: 72,
		Reason: RejConsumerDefined, ARI: []byte{0xAA}, PrivateData: []byte{0xBB}})
	check(t, "REJ", d, map[int]byte{3: 1, 7: 2, 8: 0x40, 9: 72 << 1, 10: 0, 11: 28, 12: 0xAA, 84: 0xBB})
	if f := REJ(d).Fields(); f.ARILength != 72 || f.Reason != RejConsumerDefined || f.MessageRejected != MsgREP {
		t.Errorf("REJ %+v", f)
	}

	REP(d).Encode(&REPFields{LocalQPN: 0xABCDEF, VendorID: 0x112233, LocalEECN: 0x445566, StartingPSN: 0x778899,
		ResponderResources: 9, InitiatorDepth: 10, TargetACKDelay: 15, FailoverAccepted: 3, FlowControl: true,
		RNRRetryCount: 6, SRQ: true, LocalCAGUID: 0x0102030405060708})
	check(t, "REP", d, map[int]byte{12: 0xAB, 14: 0xEF, 15: 0x11, 16: 0x44, 19: 0x22, 20: 0x77, 23: 0x33,
		24: 9, 25: 10, 26: 15<<3 | 3<<1 | 1, 27: 6<<5 | 1<<4, 28: 1, 35: 8})

	req := REQFields{ResponderResources: 1, RemoteCMResponseTimeout: 31, Transport: TransportUC, FlowControl: true,
		LocalCMResponseTimeout: 1, RetryCount: 5, PathMTU: ib.MTU4096, RDCExists: true, RNRRetryCount: 3,
		MaxCMRetries: 15, SRQ: true, ExtTransportType: 1, SAPSupported: true,
		Alternate: PathFields{FlowLabel: 0xFFFFF, PacketRate: 0x3F, SL: 15, SubnetLocal: true, LocalACKTimeout: 31}}
	REQ(d).Encode(&req)
	check(t, "REQ", d, map[int]byte{43: 31<<3 | 1<<1 | 1, 47: 1<<3 | 5, 50: 5<<4 | 1<<3 | 3, 51: 15<<4 | 1<<3 | 1,
		132: 0xFF, 134: 0xF0, 135: 0x3F, 138: 0xF8, 139: 31<<3 | 1<<2})
	if f := REQ(d).Fields(); !reflect.DeepEqual(f.Alternate, req.Alternate) || !f.SAPSupported || f.PathMTU != ib.MTU4096 {
		t.Errorf("REQ %+v", f)
	}

	lap := LAPFields{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0x123456, RemoteCMResponseTimeout: 20,
		Alternate: PathFields{LocalLID: 0xFFFF, RemoteLID: 0xFFFE, FlowLabel: 0xABCDE, TrafficClass: 0x42,
			HopLimit: 64, PacketRate: 7, SL: 3, SubnetLocal: true, LocalACKTimeout: 18}}
	LAP(d).Encode(&lap)
	check(t, "LAP", d, map[int]byte{12: 0x12, 14: 0x56, 15: 20 << 3, 20: 0xFF, 23: 0xFE, 56: 0xAB, 57: 0xCD, 58: 0xE0,
		59: 0x42, 60: 64, 61: 7, 62: 3<<4 | 1<<3, 63: 18 << 3})
	if f := LAP(d).Fields(); !reflect.DeepEqual(f.Alternate, lap.Alternate) || f.RemoteQPN != 0x123456 {
		t.Errorf("LAP %+v", f)
	}

	APR(d).Encode(&APRFields{LocalCommID: 1, RemoteCommID: 2, InfoLength: 3, Status: APRUnsupported, Info: []byte{9}, PrivateData: []byte{8}})
	check(t, "APR", d, map[int]byte{8: 3, 9: 2, 12: 9, 84: 8})

	SIDRREP(d).Encode(&SIDRREPFields{RequestID: 1, Status: SIDRUnsupported, InfoLength: 2, VendorID: 0xAABBCC,
		QPN: 0x010203, ServiceID: 0x1111C06, QKey: UDPQKey, Info: []byte{7}, PrivateData: []byte{6}})
	check(t, "SIDR_REP", d, map[int]byte{4: 1, 5: 2, 6: 0xAA, 7: 0xBB, 8: 1, 10: 3, 11: 0xCC, 19: 0x06, 20: 0x01, 23: 0x67, 24: 7, 96: 6})
	if f := SIDRREP(d).Fields(); f.VendorID != 0xAABBCC || f.QPN != 0x010203 {
		t.Errorf("SIDR_REP %+v", f)
	}

	SIDRREQ(d).Encode(&SIDRREQFields{RequestID: 0x01020304, PKey: 0xFFFF, ServiceID: 0x1111C06, PrivateData: []byte{5}})
	check(t, "SIDR_REQ", d, map[int]byte{0: 1, 4: 0xFF, 5: 0xFF, 6: 0, 15: 0x06, 16: 5})

	DREQ(d).Encode(&DREQFields{LocalCommID: 1, RemoteCommID: 2, RemoteQPN: 0x1b, PrivateData: []byte{4}})
	check(t, "DREQ", d, map[int]byte{10: 0x1b, 11: 0, 12: 4})
}

func check(t *testing.T, name string, d []byte, want map[int]byte) {
	t.Helper()
	for off, v := range want {
		if d[off] != v {
			t.Errorf("%s byte %d = %#02x, want %#02x", name, off, d[off], v)
		}
	}
}

// TestEncodeOverwrites checks that Encode writes every byte of the CM data,
// so a reused buffer never leaks an earlier message.
func TestEncodeOverwrites(t *testing.T) {
	zero := make([]byte, DataSize)
	encs := map[string]func([]byte){
		"REQ":      func(b []byte) { REQ(b).Encode(&REQFields{}) },
		"MRA":      func(b []byte) { MRA(b).Encode(&MRAFields{}) },
		"REJ":      func(b []byte) { REJ(b).Encode(&REJFields{}) },
		"REP":      func(b []byte) { REP(b).Encode(&REPFields{}) },
		"RTU":      func(b []byte) { RTU(b).Encode(&RTUFields{}) },
		"DREQ":     func(b []byte) { DREQ(b).Encode(&DREQFields{}) },
		"DREP":     func(b []byte) { DREP(b).Encode(&DREPFields{}) },
		"SIDR_REQ": func(b []byte) { SIDRREQ(b).Encode(&SIDRREQFields{}) },
		"SIDR_REP": func(b []byte) { SIDRREP(b).Encode(&SIDRREPFields{}) },
		"LAP":      func(b []byte) { LAP(b).Encode(&LAPFields{}) },
		"APR":      func(b []byte) { APR(b).Encode(&APRFields{}) },
	}
	for name, enc := range encs {
		b := bytes.Repeat([]byte{0xFF}, DataSize)
		enc(b)
		if !bytes.Equal(b, zero) {
			t.Errorf("%s: Encode of zero fields left %x", name, b)
		}
	}
	h := bytes.Repeat([]byte{0xFF}, HeaderSize)
	MAD(h).Encode(&MADFields{})
	if !bytes.Equal(h, make([]byte, HeaderSize)) {
		t.Errorf("MAD header: %x", h)
	}
}
