package mad

import (
	"encoding/binary"
	"net/netip"
	"strconv"

	"github.com/goroce/goroce/ib"
)

// PortSpace is an rdma_cm port space (rdma_cma.h: enum rdma_port_space).
type PortSpace uint16

// rdma_cm port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106
	PortSpaceUDP   PortSpace = 0x0111
	PortSpaceIB    PortSpace = 0x013F
)

// String returns "TCP", "UDP", "IB", "IPoIB" or the hex value.
func (ps PortSpace) String() string {
	switch ps {
	case PortSpaceIPoIB:
		return "IPoIB"
	case PortSpaceTCP:
		return "TCP"
	case PortSpaceUDP:
		return "UDP"
	case PortSpaceIB:
		return "IB"
	}
	return "PortSpace(0x" + strconv.FormatUint(uint64(ps), 16) + ")"
}

// ServiceID returns the IB CM service ID rdma_cm uses for port in ps:
// (ps << 16) + port.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// SplitServiceID returns the port space and port of an rdma_cm service ID;
// ok is false if sid is not in one of the four port spaces.
func SplitServiceID(sid uint64) (ps PortSpace, port uint16, ok bool) {
	if sid>>32 != 0 {
		return 0, 0, false
	}
	ps = PortSpace(sid >> 16)
	switch ps {
	case PortSpaceIPoIB, PortSpaceTCP, PortSpaceUDP, PortSpaceIB:
		return ps, uint16(sid), true
	}
	return 0, 0, false
}

// UDPQKey is the Q_Key rdma_cm gives UD QPs of the UDP and IB port spaces
// (RDMA_UDP_QKEY).
const UDPQKey = 0x01234567

// CMA header layout (cma.c: struct cma_hdr).
const (
	CMAHeaderSize = 36
	CMAVersion    = 0x00
	cmaVersion    = 0
	cmaIPVersion  = 1
	cmaSrcPort    = 2
	cmaSrc        = 4
	cmaDst        = 20
)

// CMAHeader is a view of the 36-byte rdma_cm header at the start of the
// private data of a REQ or SIDR_REQ.
type CMAHeader []byte

// CMAHeaderFields holds the fields of a CMA header. Src and Dst are both
// IPv4 or both IPv6.
type CMAHeaderFields struct {
	Version uint8 // CMAVersion
	// IPVersion is 4 or 6; 0 lets Encode choose 4 when both addresses are
	// IPv4 or v4-mapped, else 6.
	IPVersion uint8
	SrcPort   uint16
	Src       netip.Addr
	Dst       netip.Addr
}

// Version returns the cma_version byte.
func (h CMAHeader) Version() uint8 { return h[cmaVersion] }

// IPVersion returns the IP version nibble (4 or 6).
func (h CMAHeader) IPVersion() uint8 { return h[cmaIPVersion] >> 4 }

// SrcPort returns the active side's rdma_cm port.
func (h CMAHeader) SrcPort() uint16 { return binary.BigEndian.Uint16(h[cmaSrcPort:]) }

// Src returns the active side's address.
func (h CMAHeader) Src() netip.Addr { return cmaAddr(h.IPVersion(), h[cmaSrc:cmaSrc+16]) }

// Dst returns the passive side's address.
func (h CMAHeader) Dst() netip.Addr { return cmaAddr(h.IPVersion(), h[cmaDst:cmaDst+16]) }

func cmaAddr(v uint8, b []byte) netip.Addr {
	switch v {
	case 4:
		return netip.AddrFrom4([4]byte(b[12:16]))
	case 6:
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.Addr{}
}

func putCMAAddr(b []byte, v uint8, a netip.Addr) {
	clear(b[:16])
	switch {
	case !a.IsValid():
	case v == 4:
		a4 := a.Unmap().As4() // an IPv6 address in a v4 header keeps its last 4 bytes
		if a.Unmap().Is6() {
			a16 := a.As16()
			a4 = [4]byte(a16[12:])
		}
		copy(b[12:], a4[:])
	default:
		a16 := a.As16()
		copy(b, a16[:])
	}
}

// Encode writes f; IPv4 addresses go into the last four bytes of their
// 16-byte slots (not v4-mapped).
func (h CMAHeader) Encode(f *CMAHeaderFields) {
	_ = h[CMAHeaderSize-1]
	h[cmaVersion] = f.Version
	v := f.IPVersion
	if v == 0 {
		v = 6
		if f.Src.Unmap().Is4() && (f.Dst.Unmap().Is4() || !f.Dst.IsValid()) {
			v = 4
		}
	}
	h[cmaIPVersion] = v << 4
	binary.BigEndian.PutUint16(h[cmaSrcPort:], f.SrcPort)
	putCMAAddr(h[cmaSrc:], v, f.Src)
	putCMAAddr(h[cmaDst:], v, f.Dst)
}

// Fields decodes h; a short view reads as zero-padded.
func (h CMAHeader) Fields() CMAHeaderFields {
	h = full(h, CMAHeaderSize)
	return CMAHeaderFields{Version: h.Version(), IPVersion: h.IPVersion(), SrcPort: h.SrcPort(), Src: h.Src(), Dst: h.Dst()}
}

// ParseCMAHeader checks the header at the start of private data the way the
// kernel's rdma_cm does (version 0, IP version 4 or 6) and returns a view.
func ParseCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderSize {
		return nil, &ParseError{Msg: "cma_hdr", Offset: len(b), Err: ib.ErrTruncated, Reason: "shorter than 36 bytes"}
	}
	h := CMAHeader(b[:CMAHeaderSize:CMAHeaderSize])
	if h.Version() != CMAVersion {
		return nil, &ParseError{Msg: "cma_hdr", Offset: cmaVersion, Err: ib.ErrUnsupported, Reason: "cma_version is not 0"}
	}
	if v := h.IPVersion(); v != 4 && v != 6 {
		return nil, &ParseError{Msg: "cma_hdr", Offset: cmaIPVersion, Err: ib.ErrMalformed, Reason: "IP version is not 4 or 6"}
	}
	return h, nil
}

// CMAUserDataSize is the room left for user private data in a REQ after the
// CMA header.
const CMAUserDataSize = REQPrivateDataSize - CMAHeaderSize
