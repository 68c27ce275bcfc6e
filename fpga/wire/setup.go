package wire

import "github.com/goroce/goroce/ib"

// HostParams is what the host server hands to the FPGA setup
// (RoCEv2Server.getHostParams): QPN, the two random 24-bit PSNs, and the slab
// MR (used only by the gen-1 WRITE data path).
type HostParams struct {
	QPN    uint32
	RqPSN  ib.PSN // host receive-queue PSN (getRqPsn)
	SqPSN  ib.PSN // host send-queue PSN (getSqPsn)
	MRAddr uint64
	MRLen  uint32 // MaxPayload * RxQueueDepth
}

// Transport holds the knobs shared by both sides.
type Transport struct {
	PMTU        ib.MTU
	MinRNRTimer ib.RNRTimer
	RNRRetry    uint8 // FPGA side only
	RetryCount  uint8 // FPGA side only
}

// DefaultTransport is PyRogue's RoCEv2TransportCfg.
var DefaultTransport = Transport{PMTU: DefaultPMTU, MinRNRTimer: PyRogueMinRNRTimer, RNRRetry: 7, RetryCount: 3}

// Setup is the complete set of QP values both sides end up with.
//
// PSN pairing, as Rogue's code does it (which differs from its API text):
// PyRogue calls completeConnection(fpgaRqPsn = host SqPSN), so the host RTR
// expects HostRTRRqPSN = host SqPSN, and programs the FPGA RTS with
// FPGASqPSN = host SqPSN: the FPGA's first SEND carries the host's SqPSN.
// The host RqPSN only goes to the FPGA's RTR (its unused receive side). The
// seed text "the FPGA's send-queue PSN must match getRqPsn" is not what runs.
type Setup struct {
	// Host QP, INIT -> RTR -> RTS.
	HostRTRDestQPN  uint32
	HostRTRRqPSN    ib.PSN
	HostRTRPathMTU  ib.MTU
	HostMinRNRTimer ib.RNRTimer
	HostRTSSqPSN    ib.PSN
	// FPGA QP (metadata-bus modify RTR/RTS).
	FPGADestQPN  uint32
	FPGARqPSN    ib.PSN
	FPGASqPSN    ib.PSN
	FPGAPathMTU  ib.MTU
	FPGARNRTimer ib.RNRTimer
	FPGARNRRetry uint8
	FPGARetry    uint8
	// FPGA MR: the host slab (gen-1 target); length must fit 32 bits.
	FPGAMRAddr uint64
	FPGAMRLen  uint32
}

// NewSetup pairs the host's parameters with the FPGA QPN returned by the
// engine, checking every value the way Rogue does (24-bit QPN and PSNs,
// PMTU 1..5, RNR timer 0..31, retry counts of 3 bits).
func NewSetup(h HostParams, fpgaQPN uint32, t Transport) (Setup, error) {
	switch {
	case h.QPN == 0 || h.QPN > ib.PSNMask || fpgaQPN == 0 || fpgaQPN > ib.PSNMask:
		return Setup{}, errQPN
	case uint32(h.RqPSN) > ib.PSNMask || uint32(h.SqPSN) > ib.PSNMask:
		return Setup{}, errPSN
	case !t.PMTU.Valid():
		return Setup{}, errPMTU
	case t.MinRNRTimer > 31:
		return Setup{}, errRNRTimer
	case t.RNRRetry > 7 || t.RetryCount > 7:
		return Setup{}, errRetry
	}
	return Setup{
		HostRTRDestQPN: fpgaQPN, HostRTRRqPSN: h.SqPSN, HostRTRPathMTU: t.PMTU,
		HostMinRNRTimer: t.MinRNRTimer, HostRTSSqPSN: h.SqPSN,
		FPGADestQPN: h.QPN, FPGARqPSN: h.RqPSN, FPGASqPSN: h.SqPSN, FPGAPathMTU: t.PMTU,
		FPGARNRTimer: t.MinRNRTimer, FPGARNRRetry: t.RNRRetry, FPGARetry: t.RetryCount,
		FPGAMRAddr: h.MRAddr, FPGAMRLen: h.MRLen,
	}, nil
}

// SlabLen checks a server configuration (Server::Server): both values
// non-zero and maxPayload*depth below 4 GiB (it is a 32-bit metadata field
// on the FPGA side); it returns the slab length.
func SlabLen(maxPayload, depth uint32) (uint32, error) {
	if maxPayload == 0 || depth == 0 {
		return 0, errConfig
	}
	n := uint64(maxPayload) * uint64(depth)
	if n >= 1<<32 {
		return 0, errSlabTooLarge
	}
	return uint32(n), nil
}

// SlotOffset is the slab offset of receive slot i.
func SlotOffset(slot, maxPayload uint32) uint64 { return uint64(slot) * uint64(maxPayload) }
