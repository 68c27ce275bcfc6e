package mad

import (
	"bufio"
	"bytes"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/pcaptest"
)

var cmCaptures = []string{
	"mtu4096/cm_rping", "mtu4096/cm_ucmatose", "mtu4096/cm_udaddy_sidr",
	"mtu4096/cm_ib_write_bw", "mtu1024/cm_rping",
}

type capturedMAD struct {
	frameNo int // 1-based, as tshark numbers frames
	frame   []byte
	mad     MAD
}

// readCMFrames returns every CM MAD of a capture: UD SEND_ONLY to QP1 whose
// payload passes ParseCM.
func readCMFrames(t *testing.T, path string) []capturedMAD {
	t.Helper()
	recs, err := pcaptest.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []capturedMAD
	var p ib.Packet
	for i, rec := range recs {
		n, data := i+1, rec.Data
		if err := ib.Parse(data, &p); err != nil {
			continue
		}
		if p.BTH.Opcode() != ib.UDSendOnly || p.BTH.DestQP() != 1 {
			continue
		}
		if err := p.VerifyICRC(); err != nil {
			t.Errorf("frame %d: %v", n, err)
		}
		if q := p.DETH.QKey(); q != 0x80010000 || p.DETH.SrcQP() != 1 {
			t.Errorf("frame %d: GSI DETH Q_Key %#x SrcQP %d", n, q, p.DETH.SrcQP())
		}
		m, err := ParseCM(p.Payload)
		if err != nil {
			t.Errorf("frame %d: %v", n, err)
			continue
		}
		out = append(out, capturedMAD{n, data, m})
	}
	return out
}

// tsharkFields returns, per frame number, the "Name: value" lines of the
// tshark verbose decode (first occurrence wins; bit-field prefixes removed).
func tsharkFields(t *testing.T, path string) map[int]map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int]map[string]string{}
	var cur map[string]string
	var inCM map[string]bool // keys already taken from the CM message block
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		line := s.Text()
		if rest, ok := strings.CutPrefix(line, "Frame "); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ':')])
			if err != nil {
				t.Fatal(err)
			}
			cur = map[string]string{}
			inCM = nil
			out[n] = cur
			continue
		}
		if strings.HasPrefix(line, "    CM ") {
			inCM = map[string]bool{}
		}
		if cur == nil {
			continue
		}
		line = strings.TrimSpace(line)
		if i := strings.Index(line, " = "); i >= 0 && strings.ContainsAny(line[:i], ".01") && !strings.Contains(line[:i], ":") {
			line = line[i+3:]
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		// Inside the CM block its own fields win over same-named ones of
		// the outer layers (the UDP "Destination Port", for example).
		if inCM != nil {
			if !inCM[k] {
				inCM[k] = true
				cur[k] = v
			}
		} else if _, dup := cur[k]; !dup {
			cur[k] = v
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// want compares a tshark value (hex, decimal or address) with ours.
func want(t *testing.T, frame int, fields map[string]string, key string, got any) {
	t.Helper()
	v, ok := fields[key]
	if !ok {
		t.Errorf("frame %d: tshark shows no %q", frame, key)
		return
	}
	switch g := got.(type) {
	case netip.Addr:
		if v != g.String() {
			t.Errorf("frame %d: %s: tshark %s, decoded %s", frame, key, v, g)
		}
		return
	}
	var gv uint64
	switch g := got.(type) {
	case uint8:
		gv = uint64(g)
	case uint16:
		gv = uint64(g)
	case uint32:
		gv = uint64(g)
	case uint64:
		gv = g
	case bool:
		if g {
			gv = 1
		}
	case ib.MTU:
		gv = uint64(g)
	case TransportType:
		gv = uint64(g)
	case AttrID:
		gv = uint64(g)
	default:
		t.Fatalf("unhandled type %T", got)
	}
	v, _, _ = strings.Cut(v, " ")
	tv, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		t.Errorf("frame %d: %s: cannot parse tshark value %q", frame, key, v)
		return
	}
	if tv != gv {
		t.Errorf("frame %d: %s: tshark %#x, decoded %#x", frame, key, tv, gv)
	}
}

// reencode builds a fresh MAD from the decoded Fields of m.
func reencode(t *testing.T, m MAD) []byte {
	t.Helper()
	out := make([]byte, Size)
	for i := range out {
		out[i] = 0xA5 // Encode must write every byte
	}
	o := MAD(out)
	h := m.Fields()
	o.Encode(&h)
	switch m.AttrID() {
	case AttrREQ:
		f := m.REQ().Fields()
		o.REQ().Encode(&f)
	case AttrMRA:
		f := m.MRA().Fields()
		o.MRA().Encode(&f)
	case AttrREJ:
		f := m.REJ().Fields()
		o.REJ().Encode(&f)
	case AttrREP:
		f := m.REP().Fields()
		o.REP().Encode(&f)
	case AttrRTU:
		f := m.RTU().Fields()
		o.RTU().Encode(&f)
	case AttrDREQ:
		f := m.DREQ().Fields()
		o.DREQ().Encode(&f)
	case AttrDREP:
		f := m.DREP().Fields()
		o.DREP().Encode(&f)
	case AttrSIDRREQ:
		f := m.SIDRREQ().Fields()
		o.SIDRREQ().Encode(&f)
	case AttrSIDRREP:
		f := m.SIDRREP().Fields()
		o.SIDRREP().Encode(&f)
	case AttrLAP:
		f := m.LAP().Fields()
		o.LAP().Encode(&f)
	case AttrAPR:
		f := m.APR().Fields()
		o.APR().Encode(&f)
	default:
		t.Fatalf("no codec for %v", m.AttrID())
	}
	return out
}

func TestCaptures(t *testing.T) {
	dir := pcaptest.CaptureDir(t)
	seen := map[AttrID]int{}
	for _, name := range cmCaptures {
		t.Run(name, func(t *testing.T) {
			mads := readCMFrames(t, filepath.Join(dir, name+".pcap"))
			if len(mads) == 0 {
				t.Fatal("no CM MADs found")
			}
			dec := tsharkFields(t, filepath.Join(dir, name+".decode.txt"))
			for _, c := range mads {
				seen[c.mad.AttrID()]++
				checkAgainstTshark(t, c, dec[c.frameNo])
				if got := reencode(t, c.mad); !bytes.Equal(got, c.mad) {
					t.Errorf("frame %d %v: re-encoding differs:\n got %x\nwant %x", c.frameNo, c.mad.AttrID(), got, []byte(c.mad))
				}
			}
		})
	}
	for _, a := range []AttrID{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrSIDRREQ, AttrSIDRREP} {
		if seen[a] == 0 {
			t.Errorf("captures held no %v", a)
		}
	}
	t.Logf("CM MADs per type: %v", seen)
}

func checkAgainstTshark(t *testing.T, c capturedMAD, f map[string]string) {
	t.Helper()
	n, m := c.frameNo, c.mad
	if f == nil {
		t.Errorf("frame %d missing from the decode", n)
		return
	}
	want(t, n, f, "Base Version", m.BaseVersion())
	want(t, n, f, "Management Class", m.MgmtClass())
	want(t, n, f, "Class Version", m.ClassVersion())
	want(t, n, f, "Status", m.Status())
	want(t, n, f, "Transaction ID", m.TID())
	want(t, n, f, "Attribute ID", m.AttrID())
	want(t, n, f, "Attribute Modifier", m.AttrMod())
	switch m.AttrID() {
	case AttrREQ:
		r := m.REQ()
		want(t, n, f, "Local Communication ID", r.LocalCommID())
		want(t, n, f, "Local CA GUID", r.LocalCAGUID())
		want(t, n, f, "Local Q_Key", r.LocalQKey())
		want(t, n, f, "Local QPN", r.LocalQPN())
		want(t, n, f, "Responder Resources", r.ResponderResources())
		want(t, n, f, "Initiator Depth", r.InitiatorDepth())
		want(t, n, f, "Remote CM Response Timeout", r.RemoteCMResponseTimeout())
		want(t, n, f, "Transport Service Type", r.Transport())
		want(t, n, f, "End-to-End Flow Control", r.FlowControl())
		want(t, n, f, "Starting PSN", r.StartingPSN())
		want(t, n, f, "Local CM Response Timeout", r.LocalCMResponseTimeout())
		want(t, n, f, "Retry Count", r.RetryCount())
		want(t, n, f, "Partition Key", r.PKey())
		want(t, n, f, "Path Packet Payload MTU", r.PathMTU())
		want(t, n, f, "RDC Exists", r.RDCExists())
		want(t, n, f, "RNR Retry Count", r.RNRRetryCount())
		want(t, n, f, "Max CM Retries", r.MaxCMRetries())
		want(t, n, f, "SRQ", r.SRQ())
		want(t, n, f, "Extended Transport", r.ExtTransportType())
		p := r.Primary()
		want(t, n, f, "Primary Local Port LID", p.LocalLID)
		want(t, n, f, "Primary Remote Port LID", p.RemoteLID)
		want(t, n, f, "Primary Local Port GID", p.LocalGID.Addr())
		want(t, n, f, "Primary Remote Port GID", p.RemoteGID.Addr())
		want(t, n, f, "Primary Traffic Class", p.TrafficClass)
		want(t, n, f, "Primary Hop Limit", p.HopLimit)
		want(t, n, f, "Primary SL", p.SL)
		want(t, n, f, "Primary Subnet Local", p.SubnetLocal)
		want(t, n, f, "Primary Local ACK Timeout", p.LocalACKTimeout)
		// Wireshark reads the flow-label word one byte early (it shows the
		// label 0x0091d and rate 0x11 for bytes 91 de 30 00), so the flow
		// label is checked against the rdma_cm rule instead:
		// (src_port * 31 + dst_port) & 0xFFFFF.
		h, err := ParseCMAHeader(r.PrivateData())
		if err != nil {
			t.Errorf("frame %d: %v", n, err)
			return
		}
		_, dport, ok := SplitServiceID(r.ServiceID())
		if !ok {
			t.Errorf("frame %d: service ID %#x is not rdma_cm", n, r.ServiceID())
		}
		want(t, n, f, "Destination Port", dport)
		if fl := (uint32(h.SrcPort())*31 + uint32(dport)) & 0xFFFFF; p.FlowLabel != fl {
			t.Errorf("frame %d: flow label %#x, rdma_cm rule gives %#x", n, p.FlowLabel, fl)
		}
		want(t, n, f, "IP CM IP Version", h.IPVersion())
		want(t, n, f, "IP CM Source Port", h.SrcPort())
		want(t, n, f, "IP CM Source IP", h.Src())
		want(t, n, f, "IP CM Destination IP", h.Dst())
		if h.Src() != p.LocalGID.Addr() || h.Dst() != p.RemoteGID.Addr() {
			t.Errorf("frame %d: cma_hdr addresses %v→%v differ from the path GIDs", n, h.Src(), h.Dst())
		}
	case AttrREP:
		r := m.REP()
		want(t, n, f, "Local Communication ID", r.LocalCommID())
		want(t, n, f, "Remote Communication ID", r.RemoteCommID())
		want(t, n, f, "Local Q_Key", r.LocalQKey())
		want(t, n, f, "Local QPN", r.LocalQPN())
		want(t, n, f, "Local EE Context Number", r.LocalEECN())
		want(t, n, f, "Starting PSN", r.StartingPSN())
		want(t, n, f, "Responder Resources", r.ResponderResources())
		want(t, n, f, "Initiator Depth", r.InitiatorDepth())
		want(t, n, f, "Target ACK Delay", r.TargetACKDelay())
		want(t, n, f, "Failover Accepted", r.FailoverAccepted())
		want(t, n, f, "End-To-End Flow Control", r.FlowControl())
		want(t, n, f, "RNR Retry Count", r.RNRRetryCount())
		want(t, n, f, "SRQ", r.SRQ())
		want(t, n, f, "Local CA GUID", r.LocalCAGUID())
		if r.TargetACKDelay() != 15 {
			t.Errorf("frame %d: rxe Target ACK Delay %d, want 15", n, r.TargetACKDelay())
		}
	case AttrRTU:
		want(t, n, f, "Local Communication ID", m.RTU().LocalCommID())
		want(t, n, f, "Remote Communication ID", m.RTU().RemoteCommID())
	case AttrDREQ:
		want(t, n, f, "Local Communication ID", m.DREQ().LocalCommID())
		want(t, n, f, "Remote Communication ID", m.DREQ().RemoteCommID())
		want(t, n, f, "Remote QPN/EECN", m.DREQ().RemoteQPN())
	case AttrDREP:
		want(t, n, f, "Local Communication ID", m.DREP().LocalCommID())
		want(t, n, f, "Remote Communication ID", m.DREP().RemoteCommID())
	case AttrSIDRREQ:
		// Wireshark has no SIDR dissector; check against the udaddy run
		// (RDMA_PS_UDP, server 10.77.0.3 port 7174).
		r := m.SIDRREQ()
		ps, port, ok := SplitServiceID(r.ServiceID())
		if !ok || ps != PortSpaceUDP || port != 7174 || r.PKey() != 0xFFFF {
			t.Errorf("frame %d: SIDR_REQ service %#x pkey %#x", n, r.ServiceID(), r.PKey())
		}
		// The kernel forms the TID from the ID in host (little-endian)
		// order: its low word is the byte-swapped request ID.
		if bits.ReverseBytes32(uint32(m.TID())) != r.RequestID() {
			t.Errorf("frame %d: SIDR_REQ TID %#x vs request ID %#x", n, m.TID(), r.RequestID())
		}
		h, err := ParseCMAHeader(r.PrivateData())
		if err != nil || h.Dst() != netip.MustParseAddr("10.77.0.3") || h.Src() != netip.MustParseAddr("10.77.0.2") {
			t.Errorf("frame %d: SIDR_REQ cma_hdr %v (%v)", n, h.Fields(), err)
		}
	case AttrSIDRREP:
		r := m.SIDRREP()
		if r.Status() != SIDRSuccess || r.QKey() != UDPQKey || r.QPN() < 16 || r.ServiceID() != ServiceID(PortSpaceUDP, 7174) {
			t.Errorf("frame %d: SIDR_REP %+v", n, r.Fields())
		}
	}
}
