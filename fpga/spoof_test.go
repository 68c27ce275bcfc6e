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
	"github.com/goroce/goroce/link/memlink"
)

// spoof writes, on the FPGA's link, RC SEND ONLY packets from src to the
// server's QP with the given PSNs: frames no QP of the FPGA's device sent.
func spoof(t *testing.T, from, to *memlink.Link, src netip.Addr, s *fpga.Server, psns ...uint32) {
	t.Helper()
	frames := make([][]byte, 0, len(psns))
	for _, psn := range psns {
		spec := ib.FrameSpec{
			Src: src, Dst: hostAddr, HopLimit: 64, DontFragment: true,
			SrcPort: ib.RXESourcePort(0x99),
			BTH: ib.BTHFields{Opcode: ib.RCSendOnly, PKey: 0xffff, DestQP: s.QPN(),
				AckReq: true, PSN: ib.PSN(psn & ib.PSNMask)},
			Payload: make([]byte, 64),
		}
		copy(spec.SrcMAC[:], from.HardwareAddr())
		copy(spec.DstMAC[:], to.HardwareAddr())
		buf := make([]byte, 256)
		n, err := ib.Build(buf, &spec)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, buf[:n])
	}
	if n, err := from.WriteBatch(frames); n != len(frames) || err != nil {
		t.Fatalf("wrote %d of %d spoofed frames: %v", n, len(frames), err)
	}
}

// serveAsync runs Serve with the checker; the channel gets its result.
func serveAsync(s *fpga.Server, c *checker) (stop func(), result <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	serr := make(chan error, 1)
	go func() { serr <- s.Serve(ctx, c.check) }()
	return cancel, serr
}

// stillServing fails the test if Serve has returned or Err is set after d.
func stillServing(t *testing.T, s *fpga.Server, serr <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-serr:
		t.Fatalf("Serve returned %v after spoofed packets", err)
	case <-time.After(d):
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Err %v after spoofed packets", err)
	}
}

// A packet spoofed from another address, even at the expected PSN, is
// dropped by the RC address check (bad_addr): Serve goes on and the FPGA's
// frames are delivered, the spoofed one never.
func TestSpoofedOtherAddress(t *testing.T) {
	host, fdev, la, lb := memDevicesLinks(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 16, emulator.Config{}, 1)
	c := newChecker(4096, 20)
	stop, serr := serveAsync(s, c)
	defer stop()

	before := host.Counters()
	other := netip.MustParseAddr("10.0.0.3")
	spoof(t, lb, la, other, s, s.SqPSN(), s.SqPSN()+1, s.SqPSN()-1)
	deadline := time.Now().Add(10 * time.Second)
	for host.Counters().BadAddr-before.BadAddr < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("spoofed packets not counted as bad_addr: %v", host.Counters().Map())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stillServing(t, s, serr, 700*time.Millisecond)

	sendAll(t, e, 20, 4096)
	c.wait(t, s, 10*time.Second)
	stillServing(t, s, serr, 0)
	if got := s.FrameCount(); got != 20 {
		t.Fatalf("%d frames, want the FPGA's 20", got)
	}
}

// Packets spoofed from the FPGA's own address with wrong PSNs are, as RC
// defines them, duplicates (behind the expected PSN: acknowledged and
// discarded) or out of sequence (ahead: NAKed and discarded). A few of
// them, before the FPGA's first frame and between its frames, must not end
// Serve: every real frame is delivered. (TestStalePSNReconnect covers the
// sender whose PSNs are wrong for good.)
func TestSpoofedWrongPSN(t *testing.T) {
	host, fdev, la, lb := memDevicesLinks(t, faultnet.Config{}, faultnet.Config{})
	s, e := bringUp(t, host, fdev, 4096, 16, emulator.Config{}, 1)
	const n = 40
	c := newChecker(4096, n)
	stop, serr := serveAsync(s, c)
	defer stop()

	// The FPGA sends from the host's SqPSN (bringUp checks it).
	epsn := s.SqPSN()
	behind, ahead := epsn-100, epsn+1<<22 // a duplicate, an out-of-sequence PSN
	before := host.Counters()
	spoof(t, lb, la, fpgaAddr, s, behind, ahead)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := host.Counters()
		if c.DuplicateRequest > before.DuplicateRequest && c.OutOfSeqRequest > before.OutOfSeqRequest {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spoofed packets not taken as duplicate and out of sequence: %v", c.Map())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Longer than the PSN check's grace before the FPGA's first frame.
	stillServing(t, s, serr, 1500*time.Millisecond)

	sendAll(t, e, n/2, 4096)
	spoof(t, lb, la, fpgaAddr, s, behind, ahead)
	time.Sleep(100 * time.Millisecond)
	// The rest of the frames continue the FPGA's pattern.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	buf := make([]byte, 4096)
	for i := n / 2; i < n; i++ {
		if err := e.Send(ctx, uint8(i%4), payload(buf[:frameSize(i, 4096)], i)); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c.wait(t, s, 10*time.Second)
	stillServing(t, s, serr, 0)
	if got := s.FrameCount(); got != n {
		t.Fatalf("%d frames, want the FPGA's %d", got, n)
	}
}
