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
	if len(a) >= UDPSize+BTHSize {
		if crc, ok := icrcHeaders(ipHeader, a); ok {
			c := ^crc
			if len(a) > UDPSize+BTHSize {
				c = crc32.Update(c, crc32.IEEETable, a[UDPSize+BTHSize:])
			}
			if len(b) > 0 {
				c = crc32.Update(c, crc32.IEEETable, b)
			}
			return c
		}
	}
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

// Masks of the variant fields, as little-endian words of the header bytes
// they cover.
const (
	maskV4Word0  = 0xff << (8 * ipv4TOS)                            // IPv4 bytes 0-7
	maskV4Word1  = 0xff<<(8*(ipv4TTL-8)) | 0xffff<<(8*(ipv4Csum-8)) // IPv4 bytes 8-15
	maskV6Word0  = 0x0f | 0xffffff<<8 | 0xff<<(8*ipv6Hop)           // IPv6 bytes 0-7
	maskUDPWord0 = 0xffff << (8 * udpCsum)                          // UDP header
	maskUDPAt4   = 0xffff << (8 * (udpCsum - 4))                    // UDP bytes 4-7, BTH bytes 0-3
	maskBTHWord0 = 0xff << (8 * bthQPN)                             // BTH bytes 0-7
	maskBTHAt4   = 0xff << (8 * (bthQPN - 4))                       // BTH bytes 4-11
)

// icrcHeaders returns the raw CRC state after the masked IP header and the
// first 20 bytes of a (UDP header and BTH), read a word at a time from
// where they lie with the masks applied in registers. It reports false for
// an IP header too short for its version, which icrc then takes byte by
// byte as it is.
func icrcHeaders(ip, a []byte) (uint32, bool) {
	le := binary.LittleEndian
	crc := uint32(icrcSeed)
	switch {
	case len(ip) >= IPv6Size && ip[0]>>4 == ipv6Version:
		crc = crcWord(crc, le.Uint64(ip[0:])|maskV6Word0)
		crc = crcWord(crc, le.Uint64(ip[8:]))
		crc = crcWord(crc, le.Uint64(ip[16:]))
		crc = crcWord(crc, le.Uint64(ip[24:]))
		crc = crcWord(crc, le.Uint64(ip[32:]))
		crc = crcWord(crc, le.Uint64(a[0:])|maskUDPWord0)
		crc = crcWord(crc, le.Uint64(a[8:])|maskBTHWord0)
		return crcUpdateRaw(crc, a[16:20]), true
	case len(ip) >= IPv4Size && ip[0]>>4 != ipv6Version:
		crc = crcWord(crc, le.Uint64(ip[0:])|maskV4Word0)
		crc = crcWord(crc, le.Uint64(ip[8:])|maskV4Word1)
		crc = crcWord(crc, uint64(le.Uint32(ip[16:]))|uint64(le.Uint32(a[0:]))<<32)
		crc = crcWord(crc, le.Uint64(a[4:])|maskUDPAt4)
		crc = crcWord(crc, le.Uint64(a[12:])|maskBTHAt4)
		return crc, true
	}
	return 0, false
}

// crcWord advances a raw CRC-32 state over the 8 bytes of w (little-endian:
// the first byte in the low bits), one slicing-by-8 step.
func crcWord(crc uint32, w uint64) uint32 {
	t := &slicing8
	crc ^= uint32(w)
	return t[0][byte(w>>56)] ^ t[1][byte(w>>48)] ^ t[2][byte(w>>40)] ^ t[3][byte(w>>32)] ^
		t[4][crc>>24] ^ t[5][byte(crc>>16)] ^ t[6][byte(crc>>8)] ^ t[7][byte(crc)]
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
