package udplink

import (
	"encoding/binary"
	"net/netip"

	"github.com/goroce/goroce/link"
)

// mkframe builds the frame the transport would send from src to dst.
func mkframe(src, dst netip.AddrPort, tos uint8, payload []byte) []byte {
	h := link.Header{SrcAddr: src.Addr(), DstAddr: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port(),
		TTL: 64, DF: true, TOS: tos}
	b := make([]byte, h.HeaderSize()+len(payload))
	copy(b[h.Put(b, len(payload)):], payload)
	return b
}

// payload is datagram i of a test: its number, then where a BTH has its
// destination QPN, zeros (the datagrams of a test are one QP's, which a
// GSO run may join), then a pattern.
func payload(i, size int) []byte {
	p := make([]byte, size)
	binary.BigEndian.PutUint32(p, uint32(i))
	for j := 8; j < size; j++ {
		p[j] = byte(i ^ j)
	}
	return p
}
