package cm

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/goroce/goroce/cm/mad"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/roce"
)

type capturedFrame struct {
	src, dst netip.Addr
	op       ib.Opcode
	psn      uint32
	mad      mad.MAD // CM frames only
}

func readCapture(t *testing.T, name string) []capturedFrame {
	t.Helper()
	dir := repoDir(t)
	path := filepath.Join(dir, "..", "shared", "rxe-lab", "captures", name)
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("rxe captures not present (%v); CI provides ../shared next to the repository", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []capturedFrame
	var p ib.Packet
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if ib.Parse(data, &p) != nil {
			continue
		}
		cf := capturedFrame{src: p.IPv4.Src(), dst: p.IPv4.Dst(), op: p.BTH.Opcode(), psn: uint32(p.BTH.PSN())}
		if cf.op == ib.UDSendOnly && p.BTH.DestQP() == 1 {
			m, err := mad.ParseCM(p.Payload)
			if err != nil {
				t.Fatal(err)
			}
			cf.mad = append(mad.MAD(nil), m...)
		}
		out = append(out, cf)
	}
}

func repoDir(t *testing.T) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found")
		}
		dir = parent
	}
}

// fixedRand returns first, then pseudo-random values.
func fixedRand(first uint32) func() uint32 {
	n := uint32(0)
	return func() uint32 {
		n++
		if n == 1 {
			return first
		}
		return n * 2654435761
	}
}

// TestReplay plays both ends of captured rdma_cm connections between two
// rxe hosts (REQ, REP, RTU, DREQ, DREP; rping's client and ucmatose's
// server disconnect) with engines configured like the captured hosts, and
// requires every MAD they send to be byte-identical to rxe's, and the QP
// attributes to match the PSNs the captured data packets carry.
func TestReplay(t *testing.T) {
	for _, name := range []string{"mtu4096/cm_rping.pcap", "mtu1024/cm_rping.pcap", "mtu4096/cm_ucmatose.pcap"} {
		t.Run(name, func(t *testing.T) { replay(t, name) })
	}
}

func replay(t *testing.T, name string) {
	frames := readCapture(t, name)
	var cms []capturedFrame
	var clientPSN, serverPSN uint32 = 1 << 31, 1 << 31
	for _, f := range frames {
		switch {
		case f.mad != nil:
			cms = append(cms, f)
		case f.op.Info().IsAck || f.op.Info().IsReadResponse:
		case clientPSN == 1<<31 && f.src == cms[0].src:
			clientPSN = f.psn
		case serverPSN == 1<<31 && f.src == cms[0].dst:
			serverPSN = f.psn
		}
	}
	if len(cms) != 5 {
		t.Fatalf("%d CM MADs in the capture", len(cms))
	}
	reqM, repM, rtuM, dreqM, drepM := cms[0].mad, cms[1].mad, cms[2].mad, cms[3].mad, cms[4].mad
	req, rep := reqM.REQ().Fields(), repM.REP().Fields()
	clk := &fakeClock{}
	client, err := NewEngine(Config{Clock: clk, Rand: fixedRand(req.LocalCommID), LocalCAGUID: req.LocalCAGUID,
		HiTID: uint32(reqM.TID() >> 32)})
	if err != nil {
		t.Fatal(err)
	}
	server, err := NewEngine(Config{Clock: clk, Rand: fixedRand(rep.LocalCommID), LocalCAGUID: rep.LocalCAGUID,
		HiTID: uint32(dreqM.TID() >> 32)}) // the TID rxe formed for its DREQ, if the server sent it
	if err != nil {
		t.Fatal(err)
	}
	cAddr, sAddr := cms[0].src, cms[0].dst
	toServer := Path{Local: sAddr, Remote: cAddr}
	toClient := Path{Local: cAddr, Remote: sAddr}
	expect := func(e *Engine, want mad.MAD, what string) mad.MAD {
		t.Helper()
		o, ok := e.PollOutbound()
		if !ok {
			t.Fatalf("%s: nothing sent", what)
		}
		if !bytes.Equal(o.MAD[:], want) {
			t.Fatalf("%s differs from rxe's:\n got %x\nwant %x", what, o.MAD[:], []byte(want))
		}
		return mad.MAD(o.MAD[:])
	}

	// Active: a REQ like rdma_cm's (life time 18 → ACK timeout 19).
	id, err := client.Connect(&ConnectParams{ServiceID: req.ServiceID,
		Path: Path{Local: cAddr, Remote: sAddr, FlowLabel: req.Primary.FlowLabel, HopLimit: req.Primary.HopLimit},
		QPN:  req.LocalQPN, StartingPSN: req.StartingPSN,
		ResponderResources: req.ResponderResources, InitiatorDepth: req.InitiatorDepth,
		RetryCount: req.RetryCount, RNRRetryCount: req.RNRRetryCount, PathMTU: req.PathMTU,
		PacketLifeTime: req.Primary.LocalACKTimeout - 1, PrivateData: req.PrivateData})
	if err != nil {
		t.Fatal(err)
	}
	sent := expect(client, reqM, "REQ")

	// Passive: the REP.
	if err := server.Listen(req.ServiceID); err != nil {
		t.Fatal(err)
	}
	if err := server.Receive(toServer, sent); err != nil {
		t.Fatal(err)
	}
	ev, _ := server.PollEvent()
	if ev.Type != EventRequest {
		t.Fatalf("server event %v", ev.Type)
	}
	if err := server.Accept(ev.ID, &AcceptParams{QPN: rep.LocalQPN, StartingPSN: rep.StartingPSN,
		ResponderResources: rep.ResponderResources, InitiatorDepth: rep.InitiatorDepth,
		RNRRetryCount: rep.RNRRetryCount}); err != nil {
		t.Fatal(err)
	}
	sent = expect(server, repM, "REP")
	if err := client.Receive(toClient, sent); err != nil {
		t.Fatal(err)
	}
	if ev, _ := client.PollEvent(); ev.Type != EventReply {
		t.Fatalf("client event %v", ev.Type)
	}
	if err := client.RTU(id, nil); err != nil {
		t.Fatal(err)
	}
	sent = expect(client, rtuM, "RTU")
	if err := server.Receive(toServer, sent); err != nil {
		t.Fatal(err)
	}
	if ev, _ := server.PollEvent(); ev.Type != EventEstablished {
		t.Fatalf("server event %v", ev.Type)
	}

	// The QPs: PSNs as the captured data packets show them.
	for _, c := range []struct {
		name     string
		e        *Engine
		id       uint32
		sq, rq   uint32
		destQPN  uint32
		maxRd    uint8
		maxDest  uint8
		rnrRetry uint8
	}{
		{"client", client, id, clientPSN, serverPSN, rep.LocalQPN, rep.ResponderResources, rep.InitiatorDepth, rep.RNRRetryCount},
		{"server", server, ev.ID, serverPSN, clientPSN, req.LocalQPN, rep.InitiatorDepth, rep.ResponderResources, req.RNRRetryCount},
	} {
		rtr, _, err := c.e.QPAttr(c.id, roce.StateRTR)
		if err != nil {
			t.Fatal(err)
		}
		rts, _, _ := c.e.QPAttr(c.id, roce.StateRTS)
		if rts.SQPSN != c.sq || rtr.RQPSN != c.rq || rtr.DestQPN != c.destQPN || rts.Timeout != 19 ||
			rts.MaxRdAtomic != c.maxRd || rtr.MaxDestRdAtomic != c.maxDest || rts.RNRRetry != c.rnrRetry || rtr.PathMTU != req.PathMTU {
			t.Errorf("%s: sq_psn %#x rq_psn %#x dest %#x timeout %d rd %d/%d rnr %d mtu %d; capture: sq %#x rq %#x dest %#x",
				c.name, rts.SQPSN, rtr.RQPSN, rtr.DestQPN, rts.Timeout, rts.MaxRdAtomic, rtr.MaxDestRdAtomic, rts.RNRRetry, rtr.PathMTU,
				c.sq, c.rq, c.destQPN)
		}
	}

	// One side disconnects: DREQ and DREP as rxe's.
	from, fromID, fromPath, to, toPath := client, id, toServer, server, toClient
	if cms[3].src == sAddr {
		from, fromID, fromPath, to, toPath = server, ev.ID, toClient, client, toServer
	}
	if err := from.Disconnect(fromID, nil); err != nil {
		t.Fatal(err)
	}
	sent = expect(from, dreqM, "DREQ")
	if err := to.Receive(fromPath, sent); err != nil {
		t.Fatal(err)
	}
	sent = expect(to, drepM, "DREP")
	if err := from.Receive(toPath, sent); err != nil {
		t.Fatal(err)
	}
	if ev, _ := from.PollEvent(); ev.Type != EventDisconnectDone {
		t.Fatalf("disconnecting side's event %v", ev.Type)
	}
}
