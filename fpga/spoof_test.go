package fpga_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce/fpga"
	"github.com/goroce/goroce/fpga/emulator"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/link/faultnet"
	"github.com/goroce/goroce/roce"
)

// spoof sends RC SEND_ONLY packets to the server's QP from src at the
// given PSNs, written straight onto the FPGA side's wire.
func spoof(t *testing.T, fdev, host *roce.Device, s *fpga.Server, src netip.Addr, psns ...uint32) {
	t.Helper()
	frames := make([][]byte, 0, len(psns))
	for _, psn := range psns {
		spec := ib.FrameSpec{
			Src: src, Dst: hostAddr, HopLimit: 64, DontFragment: true,
			BTH:     ib.BTHFields{Opcode: ib.RCSendOnly, PKey: 0xffff, DestQP: s.QPN(), PSN: ib.PSN(psn & ib.PSNMask)},
			Payload: make([]byte, 64),
		}
		copy(spec.SrcMAC[:], fdev.Info().HardwareAddr)
		copy(spec.DstMAC[:], host.Info().HardwareAddr)
		buf := make([]byte, spec.Len())
		n, err := ib.Build(buf, &spec)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, buf[:n])
	}
	if n, err := fdev.Link().WriteBatch(frames); err != nil || n != len(frames) {
		t.Fatalf("spoofed frames: %d of %d written: %v", n, len(frames), err)
	}
}

// TestSpoofedPSNsDoNotEndServe: packets spoofed from the FPGA's address at
// wrong PSNs before its first frame (a duplicate and one beyond a gap, in
// two bursts) are refused as RC refuses any, Serve goes on, and the server
// receives the FPGA's real frames, after which Err reports nothing; packets
// spoofed from another address never reach the QP. A sender that keeps
// being refused ends Serve (TestStalePSNReconnect).
func TestSpoofedPSNsDoNotEndServe(t *testing.T) {
	host, fdev := memDevices(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 16, emulator.Config{}, 1)
	c := newChecker(4096, 20)
	serr := make(chan error, 1)
	go func() { serr <- s.Serve(context.Background(), c.check) }()

	before := host.Counters()
	// The FPGA sends from the PSN it was programmed with: the host's SqPSN.
	rq := s.SqPSN()
	spoof(t, fdev, host, s, fpgaAddr, rq-3, rq+1000)
	time.Sleep(150 * time.Millisecond)
	spoof(t, fdev, host, s, fpgaAddr, rq-7, rq+77)
	spoof(t, fdev, host, s, netip.MustParseAddr("10.0.0.99"), rq, rq+1)
	// Longer than the check needs to call a sender stale.
	time.Sleep(1500 * time.Millisecond)
	select {
	case err := <-serr:
		t.Fatalf("Serve ended after four spoofed packets: %v", err)
	default:
	}
	// Err may suspect a stale sender meanwhile (that is how a stale
	// sender's first burst looks); Serve must go on.
	t.Logf("Err while only spoofed packets came: %v", s.Err())
	after := host.Counters()
	if d := after.DuplicateRequest - before.DuplicateRequest; d < 2 {
		t.Errorf("duplicate_request rose by %d, want the two spoofed duplicates", d)
	}
	// One sequence NAK per gap; the second packet beyond it is dropped.
	if d, dropped := after.OutOfSeqRequest-before.OutOfSeqRequest, after.RcvdDropped-before.RcvdDropped; d < 1 || dropped < 1 {
		t.Errorf("out_of_sequence rose by %d and rcvd_dropped by %d, want the spoofed gap NAKed and the next dropped", d, dropped)
	}
	if d := after.BadAddr - before.BadAddr; d < 2 {
		t.Errorf("bad_addr rose by %d, want the two packets from another address", d)
	}

	sendAll(t, e, 20, 4096)
	c.wait(t, s, 30*time.Second)
	if err := s.Err(); err != nil {
		t.Fatalf("Err after the real frames: %v", err)
	}
	select {
	case err := <-serr:
		t.Fatalf("Serve ended: %v", err)
	default:
	}
}
