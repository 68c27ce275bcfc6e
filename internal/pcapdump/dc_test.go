package pcapdump

import (
	"strings"
	"testing"

	"github.com/goroce/goroce/ib"
)

// dcFrame builds a DC frame: an RC SEND_ONLY frame of the same IB length
// with its IB part replaced and the ICRC recomputed.
func dcFrame(t *testing.T, op ib.Opcode, payload int, fill func(ib []byte)) []byte {
	t.Helper()
	info := ib.DCInfo(op)
	s := baseSpec(ib.RCSendOnly, false)
	s.Payload = make([]byte, info.HeaderLen-ib.BTHSize+payload)
	f := build(t, s)
	b := f[len(f)-ib.ICRCSize-len(s.Payload)-ib.BTHSize:]
	ib.BTH(b).Encode(&ib.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x2a, PSN: 77})
	if info.IsRequest {
		ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{Key: 0xffeeddcc})
	} else {
		ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{DCTN: 0x2b})
	}
	if o := info.Offset(ib.HdrRDETH); o > 0 {
		ib.RDETH(b[o:]).Encode(&ib.RDETHFields{EEC: 3})
	}
	if o := info.Offset(ib.HdrDETH); o > 0 {
		ib.DETH(b[o:]).Encode(&ib.DETHFields{SrcQP: 0x11})
	}
	if fill != nil {
		fill(b)
	}
	if err := ib.SetFrameICRC(f); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestDCFrames(t *testing.T) {
	frames := [][]byte{
		dcFrame(t, ib.DCConnect, 0, func(b []byte) {
			ib.DCCETH(b[ib.BTHSize+ib.DCETHSize:]).Encode(&ib.DCCETHFields{DCI: 0x11, Conn: 3})
		}),
		dcFrame(t, ib.DCWriteOnly, 8, func(b []byte) {
			ib.RETH(b[ib.DCInfo(ib.DCWriteOnly).Offset(ib.HdrRETH):]).Encode(&ib.RETHFields{VA: 0x1000, RKey: 0x55, DMALen: 8})
		}),
		dcFrame(t, ib.DCAck, 0, nil),
	}
	file := writePCAP(t, frames)
	// Without --dc the RD space is IBTA RD: goroce's DC frames do not fit.
	if code, _, _ := runPcap(t, file); code != 1 {
		t.Fatalf("DC frames decoded as RD: exit %d", code)
	}
	code, out, errOut := runPcap(t, "--dc", file)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	for _, want := range []string{
		"DC CONNECT qp=0x00002a psn=77 dckey=0xffeeddcc dci=0x11 conn=3",
		"DC RDMA_WRITE_ONLY", "dckey=0xffeeddcc eec=0x3 qkey=0x0 srcqp=0x11 va=0x1000 rkey=0x55 dmalen=8",
		"DC ACKNOWLEDGE qp=0x00002a psn=77 dctn=0x2b eec=0x3", "3 frames: 3 RoCEv2, 0 bad ICRC, 0 undecodable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = runPcap(t, "--json", "--dc", writePCAP(t, frames[:1]))
	m := jsonLines(t, out)[0]
	if m["opcode_name"] != "DC CONNECT" || m["dceth"].(map[string]any)["key"].(float64) != 0xffeeddcc || m["dcceth"].(map[string]any)["dci"].(float64) != 0x11 {
		t.Fatalf("%v", m)
	}
}
