package wire

import "github.com/goroce/goroce/ib"

// Imm is the 32-bit immediate of an FPGA frame, as ntohl of the ImmDt gives
// it: bits 7:0 the Rogue stream channel, bits 31:8 the FPGA's free-running
// ring counter (addrCount, wrapping at AddrWrapCount; diagnostic only).
type Imm uint32

// MakeImm builds (counter << 8) | channel; the counter keeps 24 bits.
func MakeImm(counter uint32, channel uint8) Imm { return Imm(counter<<8 | uint32(channel)) }

// Channel is the Rogue frame channel (Server::processCompletion: imm & 0xFF).
func (m Imm) Channel() uint8 { return uint8(m) }

// Counter is the FPGA's ring position (imm >> 8).
func (m Imm) Counter() uint32 { return uint32(m) >> 8 }

// Gen1Channel is the channel the first-generation host decoded: it took
// wc.imm_data & 0xFF without ntohl, which on a little-endian host is the
// first ImmDt byte, i.e. bits 31:24 of the big-endian value. The gen-1 FPGA
// sent immediate 1, which that host saw as channel 0.
func Gen1Channel(m Imm) uint8 { return uint8(m >> 24) }

// Values of Rogue's host server (rogue Server.cpp / Core.h) and of the
// surf FPGA engine it pairs with.
const (
	DefaultMaxPayload   = 9000 // C++ Server default
	PyRogueMaxPayload   = 4096 // PyRogue RoCEv2ServerCfg default (one 4096 PMTU)
	DefaultRxQueueDepth = 256
	SlabAlign           = 4096
	FPGAChannel         = 1    // channel the surf engine stamps
	FPGAMaxFrame        = 4096 // MAX_BEATS_C 128 x 32-byte beats; longer frames are dropped
	FPGARingSlots       = 16   // RING_SLOTS_G replay ring default
	SsiSOF              = 0x02 // firstUser of every delivered frame
	HostMaxSendWR       = 1
	HostMaxSGE          = 1
	HostMaxDestRdAtomic = 16
	HostMaxRdAtomic     = 16
	HostHopLimit        = 64
	HostSL              = 0
	HostTimeout         = 14 // local ACK timeout code
	HostRetryCount      = 3
	HostRNRRetry        = 7               // infinite
	DefaultMinRNRTimer  = ib.RNRTimer(1)  // C++ completeConnection default, 0.01 ms
	PyRogueMinRNRTimer  = ib.RNRTimer(12) // PyRogue RoCEv2TransportCfg default, 0.64 ms
	DefaultPMTU         = ib.MTU4096
	FPGAMRAccess        = 0x0F
	FPGAQPAccess        = 0x0E
	FPGAPKey            = 0xFFFF
	FPGAQPTypeRC        = 2
	FPGARNRRetry        = 7
	FPGARetryCount      = 3
	FPGATimeout         = 14
	FPGAMaxReadAtomic   = 16
	FPGAMaxDestRd       = 16
	PollBatch           = 16     // completions per ibv_poll_cq
	SpinBudget          = 100000 // empty polls before arming the CQ
)
