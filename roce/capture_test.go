package roce

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
)

// The capture tap writes every frame sent and received; each one parses as
// RoCEv2 with a good ICRC, and tshark reads the file.
func TestCaptureTap(t *testing.T) {
	var buf bytes.Buffer
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, &buf)
	a := newEndpoint(t, da, RC, 3*4096+64)
	b := newEndpoint(t, db, RC, 3*4096+64)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	exerciseRC(t, a, b, 4096)
	c := da.Counters()
	da.Close()

	r, err := pcapgo.NewReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeEthernet {
		t.Fatalf("link type %v", r.LinkType())
	}
	var p ib.Packet
	n := 0
	ops := map[ib.Opcode]int{}
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		n++
		if ci.CaptureLength != len(data) || ci.Length != len(data) {
			t.Fatalf("frame %d: capture info %+v for %d bytes", n, ci, len(data))
		}
		if err := ib.Parse(data, &p); err != nil {
			t.Fatalf("frame %d: %v", n, err)
		}
		if err := p.VerifyICRC(); err != nil {
			t.Fatalf("frame %d (%v): %v", n, p.BTH.Opcode(), err)
		}
		ops[p.BTH.Opcode()]++
	}
	if want := int(c.SentPkts + c.RcvdPkts); n != want {
		t.Fatalf("%d frames captured, counters say %d sent + %d received", n, c.SentPkts, c.RcvdPkts)
	}
	for _, op := range []ib.Opcode{ib.RCSendFirst, ib.RCSendLast, ib.RCWriteFirst, ib.RCWriteLastImm, ib.RCReadRequest,
		ib.RCReadResponseFirst, ib.RCFetchAdd, ib.RCCompareSwap, ib.RCAtomicAck, ib.RCAck} {
		if ops[op] == 0 {
			t.Errorf("no %v frame captured (%v)", op, ops)
		}
	}

	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt install tshark): pcap checked with pcapgo only")
	}
	f := filepath.Join(t.TempDir(), "cap.pcap")
	if err := os.WriteFile(f, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tshark, "-r", f, "-Y", "infiniband.bth", "-T", "fields", "-e", "infiniband.bth.opcode")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.Bytes())
	}
	lines := strings.Fields(string(out))
	if len(lines) != n {
		t.Fatalf("tshark decoded %d InfiniBand frames of %d:\n%s", len(lines), n, out)
	}
}

// Capture can be switched on and off on a running device.
func TestSetCapture(t *testing.T) {
	da, db := memPair(t, faultnet.Config{}, faultnet.Config{}, nil)
	a := newEndpoint(t, da, RC, 8192)
	b := newEndpoint(t, db, RC, 8192)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	var buf bytes.Buffer
	if err := da.SetCapture(&buf); err != nil {
		t.Fatal(err)
	}
	if err := pingPong(a, b, 100, 1); err != nil {
		t.Fatal(err)
	}
	if err := da.SetCapture(nil); err != nil {
		t.Fatal(err)
	}
	size := buf.Len()
	if err := pingPong(a, b, 100, 1); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != size {
		t.Fatal("frames captured after SetCapture(nil)")
	}
	r, err := pcapgo.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, _, err := r.ReadPacketData(); err != nil {
			break
		}
		n++
	}
	if n < 2 { // the SEND and its ACK at least
		t.Fatalf("%d frames captured", n)
	}
}
