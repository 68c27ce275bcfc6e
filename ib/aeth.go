package ib

import (
	"strconv"
	"time"
)

// Syndrome is the AETH syndrome byte: bit 7 reserved, bits 6-5 the type,
// bits 4-0 a credit count code, RNR timer code or NAK code.
type Syndrome uint8

// SyndromeType is bits 6-5 of a Syndrome.
type SyndromeType uint8

// Syndrome types.
const (
	SyndromeACK      SyndromeType = 0
	SyndromeRNRNAK   SyndromeType = 1
	SyndromeReserved SyndromeType = 2
	SyndromeNAK      SyndromeType = 3
)

// SyndromeACKUnlimited is the ACK syndrome with credit code 0x1F ("invalid",
// i.e. no end-to-end flow control), the only positive ACK rxe sends.
const SyndromeACKUnlimited Syndrome = 0x1F

// String returns "ACK", "RNR NAK", "reserved" or "NAK".
func (t SyndromeType) String() string {
	switch t {
	case SyndromeACK:
		return "ACK"
	case SyndromeRNRNAK:
		return "RNR NAK"
	case SyndromeNAK:
		return "NAK"
	}
	return "reserved"
}

// Type returns the syndrome type.
func (s Syndrome) Type() SyndromeType { return SyndromeType(s>>5) & 3 }

// CreditCode returns the 5-bit credit count code of an ACK syndrome.
func (s Syndrome) CreditCode() uint8 { return uint8(s) & 0x1f }

// RNRTimer returns the RNR timer code of an RNR NAK syndrome.
func (s Syndrome) RNRTimer() RNRTimer { return RNRTimer(s & 0x1f) }

// NAKCode returns the NAK code of a NAK syndrome.
func (s Syndrome) NAKCode() NAKCode { return NAKCode(s & 0x1f) }

// String describes the syndrome, e.g. "ACK credits=unlimited", "NAK PSN sequence error".
func (s Syndrome) String() string {
	switch s.Type() {
	case SyndromeACK:
		n, limited := Credits(s.CreditCode())
		if !limited {
			return "ACK credits=unlimited"
		}
		return "ACK credits=" + strconv.Itoa(n)
	case SyndromeRNRNAK:
		return "RNR NAK timer=" + s.RNRTimer().Duration().String()
	case SyndromeNAK:
		return "NAK " + s.NAKCode().String()
	}
	return "reserved syndrome 0x" + strconv.FormatUint(uint64(s), 16)
}

// ACKSyndrome returns the ACK syndrome carrying creditCode (low 5 bits).
func ACKSyndrome(creditCode uint8) Syndrome { return Syndrome(creditCode & 0x1f) }

// RNRNAKSyndrome returns the RNR NAK syndrome carrying timer t.
func RNRNAKSyndrome(t RNRTimer) Syndrome { return Syndrome(0x20 | uint8(t)&0x1f) }

// NAKSyndrome returns the NAK syndrome carrying code c.
func NAKSyndrome(c NAKCode) Syndrome { return Syndrome(0x60 | uint8(c)&0x1f) }

// creditTable maps AETH credit codes 0..0x1E to credit counts (IBTA vol 1
// Table 45; rdmavt credit_table).
var creditTable = [31]uint16{
	0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
}

// Credits decodes an ACK credit count code: n is the number of credits and
// limited is false for code 0x1F, which means no end-to-end flow control.
func Credits(code uint8) (n int, limited bool) {
	code &= 0x1f
	if code == 0x1f {
		return 0, false
	}
	return int(creditTable[code]), true
}

// RNRTimer is the 5-bit RNR NAK timer code (ibverbs enum ib_rnr_timeout).
type RNRTimer uint8

// rnrTable holds each RNR timer code's delay in units of 10 µs (code 0 is
// the longest, 655.36 ms).
var rnrTable = [32]uint32{
	65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
	256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
}

// Duration returns the minimum delay the code asks for before a retry.
func (t RNRTimer) Duration() time.Duration {
	return time.Duration(rnrTable[t&0x1f]) * 10 * time.Microsecond
}

// NAKCode is the 5-bit value of a NAK syndrome.
type NAKCode uint8

// NAK codes (IBTA vol 1 Table 44; ib_hdrs.h IB_NAK_*).
const (
	NAKPSNSequenceError       NAKCode = 0
	NAKInvalidRequest         NAKCode = 1
	NAKRemoteAccessError      NAKCode = 2
	NAKRemoteOperationalError NAKCode = 3
	NAKInvalidRDRequest       NAKCode = 4
)

// String returns the NAK code's name.
func (c NAKCode) String() string {
	switch c {
	case NAKPSNSequenceError:
		return "PSN sequence error"
	case NAKInvalidRequest:
		return "invalid request"
	case NAKRemoteAccessError:
		return "remote access error"
	case NAKRemoteOperationalError:
		return "remote operational error"
	case NAKInvalidRDRequest:
		return "invalid RD request"
	}
	return "reserved NAK code " + strconv.Itoa(int(c))
}
