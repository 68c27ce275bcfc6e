package qp

import "github.com/goroce/goroce/ib"

// Operation codes (the low five bits of the BTH opcode) shared by RC and UC,
// and the transports, as ib defines them: an RC opcode is its operation code,
// since the RC transport is zero.
const (
	opSendFirst      = uint8(ib.RCSendFirst)
	opSendMiddle     = uint8(ib.RCSendMiddle)
	opSendLast       = uint8(ib.RCSendLast)
	opSendLastImm    = uint8(ib.RCSendLastImm)
	opSendOnly       = uint8(ib.RCSendOnly)
	opSendOnlyImm    = uint8(ib.RCSendOnlyImm)
	opWriteFirst     = uint8(ib.RCWriteFirst)
	opWriteMiddle    = uint8(ib.RCWriteMiddle)
	opWriteLast      = uint8(ib.RCWriteLast)
	opWriteLastImm   = uint8(ib.RCWriteLastImm)
	opWriteOnly      = uint8(ib.RCWriteOnly)
	opWriteOnlyImm   = uint8(ib.RCWriteOnlyImm)
	opReadRequest    = uint8(ib.RCReadRequest)
	opReadRespFirst  = uint8(ib.RCReadResponseFirst)
	opReadRespMiddle = uint8(ib.RCReadResponseMiddle)
	opReadRespLast   = uint8(ib.RCReadResponseLast)
	opReadRespOnly   = uint8(ib.RCReadResponseOnly)
	opAck            = uint8(ib.RCAck)
	opAtomicAck      = uint8(ib.RCAtomicAck)
	opCompareSwap    = uint8(ib.RCCompareSwap)
	opFetchAdd       = uint8(ib.RCFetchAdd)
	opSendLastInv    = uint8(ib.RCSendLastInv)
	opSendOnlyInv    = uint8(ib.RCSendOnlyInv)
	opFlush          = uint8(ib.RCFlush)
	opAtomicWrite    = uint8(ib.RCAtomicWrite)

	transportRC = uint8(ib.TransportRC)
	transportUC = uint8(ib.TransportUC)
	transportUD = uint8(ib.TransportUD)
)

// Opcode classes, indexed by the low five bits.
const (
	clSend = 1 << iota
	clWrite
	clRead
	clAtomic
	clFirst
	clMiddle
	clLast
	clImm
	clInv
	clRecv     // consumes a receive WQE
	clComplete // generates a receive completion
	clRETH
	clResponse
	clUnsupported // defined by the IBTA but not implemented here (answered with NAK invalid request)
	clAtomicWrite
	clFlush
)

// opClass is the responder's view of ib's opcode table, one entry per RC
// operation code (UC and UD use the same codes). A response is only
// clResponse: the responder looks no further into it.
var opClass = func() (t [32]uint16) {
	for low := range t {
		in := ib.Opcode(low).Info()
		if !in.Valid {
			continue
		}
		if !in.IsRequest {
			t[low] = clResponse
			continue
		}
		for _, c := range [...]struct {
			has bool
			cl  uint16
		}{
			{in.IsSend, clSend}, {in.IsWrite, clWrite}, {in.IsRead, clRead}, {in.IsAtomic, clAtomic},
			{in.IsAtomicWrite, clAtomicWrite}, {in.IsFlush, clFlush},
			{in.Position.IsStart(), clFirst}, {in.Position == ib.PositionMiddle, clMiddle},
			{in.Position.IsEnd(), clLast}, {in.HasImm, clImm}, {in.HasInv, clInv},
			{in.ConsumesRecvWQE, clRecv}, {in.Completes, clComplete}, {in.Headers&ib.HdrRETH != 0, clRETH},
		} {
			if c.has {
				t[low] |= c.cl
			}
		}
	}
	return t
}()

// isRdAtomicWR reports the operations answered by a response the responder
// saves (READ, atomics, ATOMIC_WRITE): they count against max_rd_atomic.
func isRdAtomicWR(op WROpcode) bool {
	return op == WRRDMARead || op == WRAtomicCmpAndSwp || op == WRAtomicFetchAndAdd || op == WRAtomicWrite || op == WRFlush
}

// isEmptyReadRespWR reports the operations answered by an empty READ_RESPONSE_ONLY.
func isEmptyReadRespWR(op WROpcode) bool { return op == WRAtomicWrite || op == WRFlush }

func isAtomicWR(op WROpcode) bool {
	return op == WRAtomicCmpAndSwp || op == WRAtomicFetchAndAdd
}

func roundUpPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// writeBTH encodes a BTH at the start of b.
func writeBTH(b []byte, op uint8, se, ackReq bool, padCount int, destQP uint32, psn ib.PSN) {
	ib.BTH(b[:ib.BTHSize]).Encode(&ib.BTHFields{
		Opcode:    ib.Opcode(op),
		Solicited: se,
		PadCount:  uint8(padCount),
		PKey:      defaultPKey,
		DestQP:    destQP,
		AckReq:    ackReq,
		PSN:       psn,
	})
}

// finish zeroes the pad and the ICRC reserve after a payload ending at end and
// returns the packet length.
func finish(b []byte, end, padCount int) int {
	for i := 0; i < padCount+ib.ICRCSize; i++ {
		b[end+i] = 0
	}
	return end + padCount + ib.ICRCSize
}
