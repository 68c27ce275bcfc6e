package cuobj

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce/ib"
)

// TokenLen is the length of a descriptor string: seven colon-separated
// lower-case hex fields, printf "%016x:%08x:%08x:%04x:%06x:%01x:%016x%016x".
const TokenLen = 16 + 1 + 8 + 1 + 8 + 1 + 4 + 1 + 6 + 1 + 1 + 1 + 32

// MaxRegSize is the largest memory registration of a client
// (CUOBJ_MAX_MEMORY_REG_SIZE, 4 GiB − 64 KiB), and so the largest region a
// token can describe.
const MaxRegSize = 4<<30 - 64<<10

// Token is a parsed RDMA descriptor (the "RDMA token" of the S3-over-RDMA
// headers): where the server reads or writes the client's memory and how it
// reaches the client.
//
// The field layout is the one the public integrations print. goroce fills
// the two transport fields as follows:
//
//   - DC (protocol 1001): LID 0 (RoCE has no LIDs) and QPN the client's
//     DCT number.
//   - RC (protocol 1002): LID the client's rdma_cm port and QPN the
//     client's endpoint number or, for a memory window token, the client's
//     QPN of the connection the window is bound through. A server given a
//     token first looks for its live connection whose client end has the
//     token's GID, port and QPN, and runs the request there; with none,
//     the QPN is an endpoint number: the server connects to GID:LID with
//     rdma_cm and names the endpoint number in its request. The client
//     refuses any number but its endpoint, so a token of an earlier
//     client at the same address and port, or naming a connection that
//     has ended, is refused as stale instead of being served by a
//     newcomer; and it never binds a window through a connection whose
//     QPN is its endpoint number. An RC QP exists per pair of ends, so a
//     client's first token to a server names the endpoint (a region).
type Token struct {
	Addr   uint64 // raddr: the region's first byte, as the client's MR sees it
	Size   uint32 // rsize: the region's length in bytes
	RKey   uint32 // the rkey of the client's grant: a memory region or window
	LID    uint16 // see the type comment
	QPN    uint32 // 24 bits; see the type comment
	HasGID bool
	// GID is the client port's GID, printed as its 16 bytes in network
	// order (two big-endian 64-bit halves).
	GID ib.GID
}

// ErrToken is matched (errors.Is) by every TokenError.
var ErrToken = errors.New("cuobj: invalid RDMA token")

// TokenError says what is wrong with a descriptor string.
type TokenError struct {
	Field  string // "length", "raddr", "rsize", "rkey", "lid", "qp", "has_gid", "gid", "separator"
	Offset int    // byte offset of the problem in the string
	Reason string
}

func (e *TokenError) Error() string {
	return fmt.Sprintf("cuobj: invalid RDMA token: %s at offset %d: %s", e.Field, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrToken) true.
func (e *TokenError) Is(target error) bool { return target == ErrToken }

type tokenField struct {
	name  string
	width int
}

// tokenFields are the seven fields in order; the GID is one 32-digit field.
var tokenFields = [...]tokenField{{"raddr", 16}, {"rsize", 8}, {"rkey", 8}, {"lid", 4}, {"qp", 6}, {"has_gid", 1}, {"gid", 32}}

const hexDigits = "0123456789abcdef"

// AppendText appends the descriptor string to b.
func (t *Token) AppendText(b []byte) ([]byte, error) {
	if t.QPN > 0xFFFFFF {
		return b, &TokenError{Field: "qp", Reason: fmt.Sprintf("%#x does not fit 24 bits", t.QPN)}
	}
	b = appendHex(b, t.Addr, 16)
	b = append(b, ':')
	b = appendHex(b, uint64(t.Size), 8)
	b = append(b, ':')
	b = appendHex(b, uint64(t.RKey), 8)
	b = append(b, ':')
	b = appendHex(b, uint64(t.LID), 4)
	b = append(b, ':')
	b = appendHex(b, uint64(t.QPN), 6)
	b = append(b, ':')
	if t.HasGID {
		b = append(b, '1')
	} else {
		b = append(b, '0')
	}
	b = append(b, ':')
	for _, c := range t.GID {
		b = append(b, hexDigits[c>>4], hexDigits[c&15])
	}
	return b, nil
}

// String returns the descriptor string ("" if the token cannot be printed).
func (t Token) String() string {
	b, err := t.AppendText(make([]byte, 0, TokenLen))
	if err != nil {
		return ""
	}
	return string(b)
}

func appendHex(b []byte, v uint64, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		b = append(b, hexDigits[(v>>(4*uint(i)))&15])
	}
	return b
}

// ParseToken parses a descriptor string strictly: exactly TokenLen bytes,
// lower-case hex digits of the documented widths, colons between them,
// has_gid 0 or 1, a non-empty region no larger than MaxRegSize that does
// not wrap the address space, and, with has_gid 1, a GID that is an IPv6
// or IPv4-mapped unicast address (an all-zero GID otherwise). Errors are
// *TokenError.
func ParseToken(s string) (Token, error) {
	var t Token
	if len(s) != TokenLen {
		return t, &TokenError{Field: "length", Offset: min(len(s), TokenLen), Reason: fmt.Sprintf("%d bytes, want %d", len(s), TokenLen)}
	}
	var vals [6]uint64
	off := 0
	for i, f := range tokenFields {
		if i > 0 {
			if s[off] != ':' {
				return t, &TokenError{Field: "separator", Offset: off, Reason: fmt.Sprintf("%q, want ':'", s[off])}
			}
			off++
		}
		if f.name == "gid" {
			for j := range 16 {
				hi, ok1 := unhex(s[off+2*j])
				lo, ok2 := unhex(s[off+2*j+1])
				if !ok1 || !ok2 {
					bad := off + 2*j
					if ok1 {
						bad++
					}
					return t, &TokenError{Field: f.name, Offset: bad, Reason: fmt.Sprintf("%q is not a lower-case hex digit", s[bad])}
				}
				t.GID[j] = hi<<4 | lo
			}
			off += f.width
			continue
		}
		var v uint64
		for j := range f.width {
			d, ok := unhex(s[off+j])
			if !ok {
				return t, &TokenError{Field: f.name, Offset: off + j, Reason: fmt.Sprintf("%q is not a lower-case hex digit", s[off+j])}
			}
			v = v<<4 | uint64(d)
		}
		vals[i] = v
		off += f.width
	}
	t.Addr, t.Size, t.RKey = vals[0], uint32(vals[1]), uint32(vals[2])
	t.LID, t.QPN = uint16(vals[3]), uint32(vals[4])
	sizeOff, gidOff, hasOff := 17, TokenLen-32, TokenLen-34
	switch vals[5] {
	case 0:
		if t.GID != (ib.GID{}) {
			return t, &TokenError{Field: "gid", Offset: gidOff, Reason: "non-zero GID with has_gid 0"}
		}
	case 1:
		t.HasGID = true
		if err := checkGID(t.GID); err != "" {
			return t, &TokenError{Field: "gid", Offset: gidOff, Reason: err}
		}
	default:
		return t, &TokenError{Field: "has_gid", Offset: hasOff, Reason: fmt.Sprintf("%d, want 0 or 1", vals[5])}
	}
	if t.Size == 0 {
		return t, &TokenError{Field: "rsize", Offset: sizeOff, Reason: "empty region"}
	}
	if uint64(t.Size) > MaxRegSize {
		return t, &TokenError{Field: "rsize", Offset: sizeOff, Reason: fmt.Sprintf("%d bytes exceeds the %d-byte registration limit", t.Size, uint64(MaxRegSize))}
	}
	if t.Addr+uint64(t.Size) < t.Addr {
		return t, &TokenError{Field: "raddr", Offset: 0, Reason: "region wraps the address space"}
	}
	return t, nil
}

// checkGID says why g cannot name a RoCEv2 port ("" when it can).
func checkGID(g ib.GID) string {
	a := netip.AddrFrom16(g).Unmap()
	switch {
	case a.IsUnspecified():
		return "unspecified address"
	case a.IsMulticast():
		return "multicast address"
	case a.Is4() && a == netip.IPv4Unspecified():
		return "unspecified address"
	}
	if a.Is4() {
		if b := a.As4(); b[0] == 255 && b[1] == 255 && b[2] == 255 && b[3] == 255 {
			return "broadcast address"
		}
	}
	return ""
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// IPAddr returns the client's address (the GID as an IP address), if any.
func (t *Token) IPAddr() (netip.Addr, bool) {
	if !t.HasGID {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16(t.GID).Unmap(), true
}

// Contains reports whether [addr, addr+size) lies inside the region.
func (t *Token) Contains(addr, size uint64) bool {
	return addr >= t.Addr && size <= uint64(t.Size) && addr-t.Addr <= uint64(t.Size)-size
}
