package mrsp

// Immediate data of the final RDMA WRITE WITH IMM of each direction. Values
// here are host-order (what ntohl of the ImmDt gives); on the wire they are
// big-endian.
const (
	// StartRPCMask is START_RPC_MASK: set in the host's immediate.
	StartRPCMask = 0x80
	// FnCodeMask selects the function code (SWNAA masks with 0x7F).
	FnCodeMask = 0x7F
	// ReturnShift is IMMEDIATE_OFFSET: the host reads the NAA's return code
	// as imm >> 8.
	ReturnShift = 8
)

// RPC return codes (enum naa_error and the protocol description).
const (
	RCSuccess       = 0x00
	RCSocketUnavail = 0x01
	RCKernelTimeout = 0x02
	RCReservedFirst = 0x03 // 0x03-0x0f reserved
	RCAppFirst      = 0x10 // 0x10-0x7f application errors
	RCAppLast       = 0x7f
	HostAbortImm    = 0 // a host-side error: zero-length write, immediate 0
)

// HostImm builds the host's immediate: bits 0-6 function code, bit 7 start
// RPC, bits 8-15/16-23/24-31 user bytes 0/1/2 (naaice_set_immediate). On the
// wire: [user2, user1, user0, 0x80|fn].
func HostImm(fn uint8, user [3]byte) (uint32, error) {
	if fn == 0 || fn > FnCodeMask {
		return 0, errFnCode
	}
	return uint32(user[2])<<24 | uint32(user[1])<<16 | uint32(user[0])<<8 | StartRPCMask | uint32(fn), nil
}

// ParseHostImm decodes the host's immediate as an NAA receives it. 0 is the
// host's error signal (ErrAborted). The C software NAA only masks the
// function code; this parser also requires the start bit and a non-zero
// function code.
func ParseHostImm(v uint32) (fn uint8, user [3]byte, err error) {
	if v == HostAbortImm {
		return 0, user, errHostAbort
	}
	user = [3]byte{byte(v >> 8), byte(v >> 16), byte(v >> 24)}
	if v&StartRPCMask == 0 {
		return 0, user, errNoStart
	}
	fn = uint8(v & FnCodeMask)
	if fn == 0 {
		return 0, user, errFnCode
	}
	return fn, user, nil
}

// NAAImm builds the NAA's final immediate for return code rc, shifted so the
// C host's imm >> 8 reads it (the C software NAA puts codes in the low byte,
// which that host reads as 0; see the package doc).
func NAAImm(rc uint8) uint32 { return uint32(rc) << ReturnShift }

// ParseNAAImm decodes the NAA's final immediate as a host: failed is true
// for any non-zero value; code is imm >> 8 as the C host reports it, or
// the low byte when only that is set (the C software NAA's placement).
func ParseNAAImm(v uint32) (code uint32, failed bool) {
	if v == 0 {
		return 0, false
	}
	if v>>ReturnShift == 0 {
		return v, true
	}
	return v >> ReturnShift, true
}
