package ib

// MTU is an InfiniBand path MTU code (ibv_mtu: 1 = 256 … 5 = 4096).
type MTU uint8

// MTU codes.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// maxHeaderLength is rxe's RXE_MAX_HDR_LENGTH: the per-packet budget for
// BTH, extended headers and ICRC subtracted from the netdev MTU.
const maxHeaderLength = 80

// Bytes returns the MTU in bytes, or 0 for an invalid code.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of MTU256..MTU4096.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

// String returns the MTU in bytes as a decimal string, or "invalid".
func (m MTU) String() string {
	switch m {
	case MTU256:
		return "256"
	case MTU512:
		return "512"
	case MTU1024:
		return "1024"
	case MTU2048:
		return "2048"
	case MTU4096:
		return "4096"
	}
	return "invalid"
}

// MTUFromBytes returns the code for exactly n bytes (256, 512, …, 4096).
func MTUFromBytes(n int) (MTU, bool) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, true
		}
	}
	return 0, false
}

// ActiveMTU returns the IB MTU rxe derives from a netdev MTU: the largest
// code not above netdevMTU−80, clamped to 256..4096 (1500 → 1024, 9000 → 4096).
func ActiveMTU(netdevMTU int) MTU {
	n := netdevMTU - maxHeaderLength
	for m := MTU4096; m > MTU256; m-- {
		if n >= m.Bytes() {
			return m
		}
	}
	return MTU256
}
