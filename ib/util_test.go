package ib

import (
	"hash/crc32"
	"net/netip"
)

func crc32IEEE(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

var netipZero netip.Addr
