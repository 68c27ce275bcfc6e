package qp

import "github.com/goroce/goroce/ib"

// Operation codes (the low five bits of the BTH opcode) shared by RC and UC.
const (
	opSendFirst      = 0x00
	opSendMiddle     = 0x01
	opSendLast       = 0x02
	opSendLastImm    = 0x03
	opSendOnly       = 0x04
	opSendOnlyImm    = 0x05
	opWriteFirst     = 0x06
	opWriteMiddle    = 0x07
	opWriteLast      = 0x08
	opWriteLastImm   = 0x09
	opWriteOnly      = 0x0A
	opWriteOnlyImm   = 0x0B
	opReadRequest    = 0x0C
	opReadRespFirst  = 0x0D
	opReadRespMiddle = 0x0E
	opReadRespLast   = 0x0F
	opReadRespOnly   = 0x10
	opAck            = 0x11
	opAtomicAck      = 0x12
	opCompareSwap    = 0x13
	opFetchAdd       = 0x14
	opSendLastInv    = 0x16
	opSendOnlyInv    = 0x17
	opFlush          = 0x1C
	opAtomicWrite    = 0x1D

	transportRC = 0x00
	transportUC = 0x20
	transportUD = 0x60
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

var opClass = [32]uint16{
	opSendFirst:      clSend | clFirst | clRecv,
	opSendMiddle:     clSend | clMiddle,
	opSendLast:       clSend | clLast | clComplete,
	opSendLastImm:    clSend | clLast | clImm | clComplete,
	opSendOnly:       clSend | clFirst | clLast | clRecv | clComplete,
	opSendOnlyImm:    clSend | clFirst | clLast | clImm | clRecv | clComplete,
	opWriteFirst:     clWrite | clFirst | clRETH,
	opWriteMiddle:    clWrite | clMiddle,
	opWriteLast:      clWrite | clLast,
	opWriteLastImm:   clWrite | clLast | clImm | clRecv | clComplete,
	opWriteOnly:      clWrite | clFirst | clLast | clRETH,
	opWriteOnlyImm:   clWrite | clFirst | clLast | clImm | clRecv | clComplete | clRETH,
	opReadRequest:    clRead | clFirst | clLast | clRETH,
	opReadRespFirst:  clResponse,
	opReadRespMiddle: clResponse,
	opReadRespLast:   clResponse,
	opReadRespOnly:   clResponse,
	opAck:            clResponse,
	opAtomicAck:      clResponse,
	opCompareSwap:    clAtomic | clFirst | clLast,
	opFetchAdd:       clAtomic | clFirst | clLast,
	opSendLastInv:    clSend | clLast | clInv | clComplete,
	opSendOnlyInv:    clSend | clFirst | clLast | clInv | clRecv | clComplete,
	opFlush:          clFlush | clFirst | clLast | clRETH,
	opAtomicWrite:    clAtomicWrite | clFirst | clLast | clRETH,
}

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
