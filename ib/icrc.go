package ib

import (
	"encoding/binary"
	"hash/crc32"
)

// icrcSeed is the raw CRC-32 state (no final inversion) after 8 bytes of
// 0xFF starting from 0xFFFFFFFF: the masked LRH that RoCEv2 lacks. rxe starts
// from the same constant.
const icrcSeed = 0xDEBB20E3

// ICRC returns the Invariant CRC of a RoCEv2 packet. ipHeader is the 20-byte
// IPv4 or 40-byte IPv6 header exactly as transmitted (IPv4 ID and flags
// included); udpAndIB is the UDP header followed by BTH … pad, without the
// ICRC itself. The variant fields are masked as rxe does: IPv4 TOS, TTL and
// checksum; IPv6 traffic class, flow label and hop limit; the UDP checksum;
// BTH byte 4 (FECN, BECN, reserved). The IP version is taken from the first
// nibble of ipHeader; bytes beyond the fixed header size are ignored, and
// short inputs are treated as they are (never read out of bounds). ICRC does
// not allocate.
func ICRC(ipHeader, udpAndIB []byte) uint32 { return icrc(ipHeader, udpAndIB, nil) }

// ICRCSplit is ICRC for a UDP header and IB packet (BTH … pad, without the
// ICRC) held in separate buffers, as on a kernel UDP socket link where the
// sender composes the headers the kernel will transmit.
func ICRCSplit(ipHeader, udpHeader, ibPacket []byte) uint32 {
	return icrc(ipHeader, udpHeader, ibPacket)
}

// icrc computes the ICRC over ipHeader and the concatenation a‖b (UDP header
// onwards).
func icrc(ipHeader, a, b []byte) uint32 {
	// The masked headers are fed from stack copies through a local table-driven
	// CRC: handing a stack slice to crc32.Update would move it to the heap
	// (the IEEE implementation is called through a function variable).
	var hdr [IPv6Size]byte
	n := copy(hdr[:], ipHeader)
	// Only the fixed header is covered: 40 bytes for IPv6, 20 otherwise.
	if n > 0 && hdr[0]>>4 == ipv6Version {
		for _, i := range [...]int{1, 2, 3, ipv6Hop} { // traffic class low nibble, flow label, hop limit
			hdr[i] = 0xff
		}
		hdr[0] |= 0x0f // traffic class high nibble
	} else {
		n = min(n, IPv4Size)
		for _, i := range [...]int{ipv4TOS, ipv4TTL, ipv4Csum, ipv4Csum + 1} {
			hdr[i] = 0xff
		}
	}
	crc := crcUpdateRaw(icrcSeed, hdr[:n])

	// UDP header and BTH: the first 20 bytes of a‖b.
	var ub [UDPSize + BTHSize]byte
	ka := copy(ub[:], a)
	kb := copy(ub[ka:], b) // 0 unless a is shorter than 20 bytes
	ub[udpCsum], ub[udpCsum+1], ub[UDPSize+bthQPN] = 0xff, 0xff, 0xff
	crc = crcUpdateRaw(crc, ub[:ka+kb])
	// crc32.Update inverts on entry and exit: switch to the inverted form.
	c := ^crc
	if ka < len(a) {
		c = crc32.Update(c, crc32.IEEETable, a[ka:])
	}
	if kb < len(b) {
		c = crc32.Update(c, crc32.IEEETable, b[kb:])
	}
	return c
}

// crcUpdateRaw advances a raw (non-inverted) reflected CRC-32 state over b
// using slicing-by-8 over the standard IEEE table family.
func crcUpdateRaw(crc uint32, b []byte) uint32 {
	t := &slicing8
	for len(b) >= 8 {
		crc ^= binary.LittleEndian.Uint32(b)
		crc = t[0][b[7]] ^ t[1][b[6]] ^ t[2][b[5]] ^ t[3][b[4]] ^
			t[4][crc>>24] ^ t[5][(crc>>16)&0xff] ^ t[6][(crc>>8)&0xff] ^ t[7][crc&0xff]
		b = b[8:]
	}
	for _, c := range b {
		crc = t[0][byte(crc)^c] ^ crc>>8
	}
	return crc
}

// slicing8 holds the eight IEEE CRC-32 tables for slicing-by-8.
var slicing8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := 0; i < 256; i++ {
		c := t[0][i]
		for j := 1; j < 8; j++ {
			c = t[0][c&0xff] ^ c>>8
			t[j][i] = c
		}
	}
	return t
}()

// PutICRC stores crc in b[0:4] in wire order (little-endian, the only
// little-endian field of a RoCEv2 packet).
func PutICRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// GetICRC reads a wire-order ICRC from b[0:4].
func GetICRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
