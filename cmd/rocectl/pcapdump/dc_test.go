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
	ib.DCETH(b[ib.BTHSize:]).Encode(&ib.DCETHFields{Gen: 3, SrcQP: 0x11})
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
			ib.DCCETH(b[ib.BTHSize+ib.DCETHSize:]).Encode(&ib.DCCETHFields{Key: 0xffeeddcc})
		}),
		dcFrame(t, ib.DCWriteOnly, 8, func(b []byte) {
			ib.RETH(b[20:]).Encode(&ib.RETHFields{VA: 0x1000, RKey: 0x55, DMALen: 8})
		}),
		dcFrame(t, ib.DCAck, 0, nil),
	}
	code, out, errOut := runPcap(t, writePCAP(t, frames))
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	for _, want := range []string{
		"DC CONNECT qp=0x00002a psn=77 dc(gen=3 srcqp=0x11) dckey=0xffeeddcc",
		"DC RDMA_WRITE_ONLY", "va=0x1000 rkey=0x55 dmalen=8",
		"DC ACKNOWLEDGE", "3 frames: 3 RoCEv2, 0 bad ICRC, 0 undecodable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = runPcap(t, "--json", writePCAP(t, frames[:1]))
	m := jsonLines(t, out)[0]
	if m["opcode_name"] != "DC CONNECT" || m["dceth"] == nil || m["dcceth"].(map[string]any)["key"].(float64) != 0xffeeddcc {
		t.Fatalf("%v", m)
	}
}
