package roce

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/link/memlink"
)

// TestCaptureECN: tshark dissects what a device with congestion control
// on sends and receives, ECT(0) data and ACKs and CNPs with DSCP 48, as
// RoCEv2 with the ECN field it carries, and finds nothing malformed.
func TestCaptureECN(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (apt install tshark)")
	}
	var buf bytes.Buffer
	la, lb := memlink.PairWithOptions(memlink.Options{HardwareAddrA: macA, HardwareAddrB: macB})
	ml := &ceLink{Link: la}
	cc := CCConfig{DCQCN: true}
	da, err := OpenLink(ml, Options{Addrs: []netip.Addr{addrA}, Neighbours: map[netip.Addr]net.HardwareAddr{addrB: macB}, CC: cc, Capture: &buf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { da.Close() })
	db, err := OpenLink(lb, Options{Addrs: []netip.Addr{addrB}, Neighbours: map[netip.Addr]net.HardwareAddr{addrA: macA}, CC: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	a, b := newEndpoint(t, da, RC, 1<<16), newEndpoint(t, db, RC, 1<<16)
	connect(t, a, b, addrA, addrB, ConnectAttr{})
	for i := range 4 {
		if err := a.qp.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled,
			SGL: []SGE{a.mr.SGE(0, 8192)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		wantOK(t, waitWC(t, a.scq, 10*time.Second), WCRDMAWrite)
	}
	da.Close()
	f := filepath.Join(t.TempDir(), "ecn.pcap")
	if err := os.WriteFile(f, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tshark, "-r", f, "-T", "fields", "-E", "separator=;",
		"-e", "ip.dsfield.dscp", "-e", "ip.dsfield.ecn", "-e", "infiniband.bth.opcode", "-e", "_ws.malformed", "-e", "_ws.expert.severity")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.Bytes())
	}
	kinds := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		kinds[line]++
	}
	t.Logf("dscp/ecn/opcode/malformed/expert: %v", kinds)
	var ect, cnp int
	for k, n := range kinds {
		switch f := strings.Split(k, ";"); {
		case len(f) != 5 || f[3] != "" || f[4] != "":
			t.Errorf("%d frames dissected as %q: malformed or with expert notes", n, k)
		case f[0] == "0" && f[1] == "2" && f[2] != "":
			ect += n
		case f[0] == "48" && f[1] == "0" && f[2] == "129":
			cnp += n
		default:
			t.Errorf("%d frames dissected as %q", n, k)
		}
	}
	if ect == 0 || cnp == 0 {
		t.Errorf("%d ECT(0) RoCE frames, %d CNPs dissected", ect, cnp)
	}
}
