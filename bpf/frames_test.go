//go:build linux

package bpf

import (
	"encoding/binary"
	"net/netip"
)

// frame describes a test frame; zero values give IPv4/UDP to DefaultPort.
type frame struct {
	tags     []uint16 // TPIDs of VLAN tags, outermost first
	ethType  uint16   // overrides the EtherType after the tags
	ipv6     bool
	version  byte       // overrides the IP version nibble
	ihl      byte       // IPv4 header length in words (0: 5)
	optFill  []byte     // IPv4 option bytes (repeated to fill IHL)
	proto    byte       // 0: UDP
	nextHdr  byte       // IPv6 next header (0: proto)
	extHdr   bool       // IPv6: insert a hop-by-hop header before the transport
	fragment uint16     // IPv4 flags+fragment offset field (0: DF)
	dst      netip.Addr // destination address (zero: 10.77.0.2 or fd00::2)
	sport    uint16
	dport    uint16 // 0: DefaultPort
	payload  int
}

func (f frame) bytes() []byte {
	b := make([]byte, 0, 128+f.payload)
	b = append(b, 0x52, 0x54, 0, 0x4d, 0, 2) // dst MAC
	b = append(b, 0x52, 0x54, 0, 0x4d, 0, 1) // src MAC
	for i, tpid := range f.tags {
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, uint16(100+i)) // VID
	}
	et := f.ethType
	if et == 0 {
		et = 0x0800
		if f.ipv6 {
			et = 0x86dd
		}
	}
	b = binary.BigEndian.AppendUint16(b, et)
	proto := f.proto
	if proto == 0 {
		proto = 17
	}
	dport := f.dport
	if dport == 0 {
		dport = DefaultPort
	}
	sport := f.sport
	if sport == 0 {
		sport = 49152
	}
	l4 := make([]byte, 8, 8+f.payload+20)
	if proto == 6 {
		l4 = make([]byte, 20, 20+f.payload)
		l4[12] = 5 << 4
	}
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	for i := range f.payload {
		l4 = append(l4, byte(i))
	}
	if proto == 17 {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	switch {
	case et == 0x0806: // ARP request
		b = append(b, 0, 1, 8, 0, 6, 4, 0, 1)
		b = append(b, make([]byte, 20)...)
		return b
	case f.ipv6:
		v := f.version
		if v == 0 {
			v = 6
		}
		nh := f.nextHdr
		if nh == 0 {
			nh = proto
		}
		var ext []byte
		if f.extHdr {
			ext = []byte{nh, 0, 1, 4, 0, 0, 0, 0} // hop-by-hop, PadN
			nh = 0
		}
		h := make([]byte, 40)
		h[0] = v << 4
		binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
		h[6] = nh
		h[7] = 64
		h[8], h[23] = 0xfd, 1
		h[24], h[39] = 0xfd, 2
		if f.dst.IsValid() {
			a := f.dst.As16()
			copy(h[24:], a[:])
		}
		b = append(b, h...)
		b = append(b, ext...)
	default:
		v := f.version
		if v == 0 {
			v = 4
		}
		ihl := f.ihl
		if ihl == 0 {
			ihl = 5
		}
		hl := int(ihl) * 4
		if hl < 20 {
			hl = 20
		}
		h := make([]byte, hl)
		h[0] = v<<4 | ihl
		binary.BigEndian.PutUint16(h[2:], uint16(hl+len(l4)))
		frag := f.fragment
		if frag == 0 {
			frag = 0x4000 // DF
		}
		binary.BigEndian.PutUint16(h[6:], frag)
		h[8] = 64
		h[9] = proto
		copy(h[12:], []byte{10, 77, 0, 1, 10, 77, 0, 2})
		if f.dst.Is4() {
			a := f.dst.As4()
			copy(h[16:], a[:])
		}
		for i := 20; i < hl; i++ {
			if len(f.optFill) > 0 {
				h[i] = f.optFill[(i-20)%len(f.optFill)]
			} else {
				h[i] = 1 // NOP
			}
		}
		b = append(b, h...)
	}
	return append(b, l4...)
}

// headerLen is the length up to the end of the transport header.
func (f frame) headerLen() int {
	return len(f.bytes()) - f.payload
}
