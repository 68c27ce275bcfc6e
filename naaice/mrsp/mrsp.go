package mrsp

import (
	"encoding/binary"
	"time"
)

// Message types (enum message_id), byte 0 of every MRSP message.
const (
	MsgErr uint8 = 0x00 // MSG_MR_ERR: error, either direction
	MsgAAR uint8 = 0x01 // MSG_MR_AAR: advertise and request, host -> NAA
	MsgA   uint8 = 0x02 // MSG_MR_A: advertise, NAA -> host
	MsgR   uint8 = 0x03 // MSG_MR_R: reserved, never sent
)

// Layout and limits of the C library.
const (
	HeaderLen   = 4  // type, count (or error code), 2 bytes padding
	AAREntryLen = 24 // flags(1) NAA address(7) host address(8) rkey(4) size(4)
	AEntryLen   = 16 // NAA address(8) rkey(4) size(4)
	ErrLen      = 4  // type, code, 2 bytes padding

	// MaxMRs is MAX_MRS: parameter plus internal regions.
	MaxMRs = 32
	// RecvBufLen is MR_SIZE_MRSP (24 * MAX_MRS): the receive buffer each
	// side posts for an MRSP message.
	RecvBufLen = AAREntryLen * MaxMRs
	// MaxAAREntries is the largest AAR that fits RecvBufLen (4 + 24*31 =
	// 748); 32 entries (772 bytes) would overflow the peer's receive.
	MaxAAREntries = (RecvBufLen - HeaderLen) / AAREntryLen
	// MaxAEntries bounds an A message: one entry per non-internal region.
	MaxAEntries = MaxAAREntries
	// MaxNAAAddr is the largest requested NAA address (7 bytes on the wire).
	MaxNAAAddr = 1<<56 - 1
	// PageWidth is NAA_PAGE_WIDTH: the C host places requested NAA regions
	// on multiples of it.
	PageWidth = 4096
	// MaxRegionSize is the largest region the protocol documents (2 GiB,
	// the IB message size limit).
	MaxRegionSize = 1 << 31
)

// Connection parameters of the C library.
const (
	ServerPort          = 12345 // SERVER_CONNECTION_PORT (RDMA_PS_TCP)
	RXDepth             = 1025  // RX_DEPTH: send and receive queue depth
	CQDepth             = RXDepth + 1
	MaxSGE              = 32
	RetryCount          = 7 // DEFAULT_RETRY_COUNT
	RNRRetryCount       = 6
	InitiatorDepth      = 1
	ResponderResources  = 1
	TimeoutResolveAddr  = 100 * time.Millisecond
	TimeoutResolveRoute = 500 * time.Millisecond
	DefaultTimeout      = 3600 * time.Second // blocking calls
	// RejectOverload is the REJ private data a full software NAA sends
	// (sic, NUL-terminated).
	RejectOverload = "Server overlad\x00"
)

// Flags of an AAR entry (enum naaice_mrflags_value).
type Flags uint8

const (
	FlagInternal   Flags = 0x01 // NAA-only region, never transferred
	FlagSingleSend Flags = 0x02 // written on the first RPC only
	FlagInput      Flags = 0x04 // host writes it to the NAA
	FlagOutput     Flags = 0x08 // NAA writes it back
	flagsKnown           = FlagInternal | FlagSingleSend | FlagInput | FlagOutput
)

// Region is one AAR entry.
type Region struct {
	Flags Flags
	// NAAAddr is the NAA address the host requests (56 bits). The C host
	// fills in placeholders (SequentialNAAAddrs); its software NAA ignores them.
	NAAAddr uint64
	// HostAddr/RKey publish the host buffer the NAA writes outputs to; both 0
	// for internal regions.
	HostAddr uint64
	RKey     uint32
	// Size is the registered length (parameter) or requested size (internal).
	Size uint32
}

// Internal reports whether r is an NAA-only region.
func (r Region) Internal() bool { return r.Flags&FlagInternal != 0 }

// Advert is one A entry: the NAA buffer for the non-internal AAR entry of
// the same index.
type Advert struct {
	Addr uint64
	RKey uint32
	Size uint32
}

// Type returns the message type of b.
func Type(b []byte) (uint8, error) {
	if len(b) < 1 {
		return 0, errShort
	}
	if b[0] > MsgA {
		return b[0], errBadType
	}
	return b[0], nil
}

// AppendAAR appends an AAR message for regions (parameters first, then
// internal regions, as the C host orders them).
func AppendAAR(b []byte, regions []Region) ([]byte, error) {
	if len(regions) == 0 {
		return b, errNoRegions
	}
	if len(regions) > MaxAAREntries {
		return b, errTooManyRegions
	}
	b = append(b, MsgAAR, uint8(len(regions)), 0, 0)
	for _, r := range regions {
		if r.NAAAddr > MaxNAAAddr {
			return b, errInvalidAddress
		}
		b = binary.BigEndian.AppendUint64(b, uint64(r.Flags)<<56|r.NAAAddr)
		b = binary.BigEndian.AppendUint64(b, r.HostAddr)
		b = binary.BigEndian.AppendUint32(b, r.RKey)
		b = binary.BigEndian.AppendUint32(b, r.Size)
	}
	return b, nil
}

// AppendA appends an A message.
func AppendA(b []byte, adverts []Advert) ([]byte, error) {
	if len(adverts) > MaxAEntries {
		return b, errTooManyRegions
	}
	b = append(b, MsgA, uint8(len(adverts)), 0, 0)
	for _, a := range adverts {
		b = binary.BigEndian.AppendUint64(b, a.Addr)
		b = binary.BigEndian.AppendUint32(b, a.RKey)
		b = binary.BigEndian.AppendUint32(b, a.Size)
	}
	return b, nil
}

// AppendErr appends an ERR message with code (non-zero).
func AppendErr(b []byte, code ErrCode) []byte { return append(b, MsgErr, uint8(code), 0, 0) }

// ParseErr decodes an ERR message. The code is at byte 1 (naaice.c). The C
// software NAA reads an incoming code from byte 3 instead, so it always sees
// 0 from a conforming host; the host side is unaffected.
func ParseErr(b []byte) (ErrCode, error) {
	if len(b) < ErrLen {
		return 0, errShort
	}
	if b[0] != MsgErr {
		return 0, errBadType
	}
	if len(b) != ErrLen {
		return 0, errLength
	}
	if b[2] != 0 || b[3] != 0 {
		return 0, errPadding
	}
	if b[1] == 0 {
		return 0, errZeroCode
	}
	return ErrCode(b[1]), nil
}

func header(b []byte, typ uint8, entry, max int) (int, error) {
	if len(b) < HeaderLen {
		return 0, errShort
	}
	if b[0] != typ {
		return 0, errBadType
	}
	n := int(b[1])
	if b[2] != 0 || b[3] != 0 {
		return 0, errPadding
	}
	if n > max {
		return 0, errTooManyRegions
	}
	if len(b) < HeaderLen+n*entry {
		return 0, errShort
	}
	if len(b) != HeaderLen+n*entry {
		return 0, errLength
	}
	return n, nil
}

// ParseAAR decodes an AAR, appending its entries to out (pass a slice with
// capacity MaxAAREntries to avoid allocation), and checks it against lim:
// see Limits.Check for the region rules.
func ParseAAR(b []byte, lim *Limits, out []Region) ([]Region, error) {
	max := MaxAAREntries
	if lim != nil && lim.MaxRegions > 0 && lim.MaxRegions < max {
		max = lim.MaxRegions
	}
	n, err := header(b, MsgAAR, AAREntryLen, max)
	if err != nil {
		return out, err
	}
	if n == 0 {
		return out, errNoRegions
	}
	start := len(out)
	for i := 0; i < n; i++ {
		p := b[HeaderLen+i*AAREntryLen:]
		info := binary.BigEndian.Uint64(p[0:8])
		out = append(out, Region{
			Flags:    Flags(info >> 56),
			NAAAddr:  info & MaxNAAAddr,
			HostAddr: binary.BigEndian.Uint64(p[8:16]),
			RKey:     binary.BigEndian.Uint32(p[16:20]),
			Size:     binary.BigEndian.Uint32(p[20:24]),
		})
	}
	if lim == nil {
		lim = &DefaultLimits
	}
	return out, lim.Check(out[start:])
}

// ParseA decodes an A message, appending its entries to out. Entries must
// be non-empty, must not wrap and must not overlap one another.
func ParseA(b []byte, out []Advert) ([]Advert, error) {
	n, err := header(b, MsgA, AEntryLen, MaxAEntries)
	if err != nil {
		return out, err
	}
	start := len(out)
	for i := 0; i < n; i++ {
		p := b[HeaderLen+i*AEntryLen:]
		a := Advert{Addr: binary.BigEndian.Uint64(p[0:8]), RKey: binary.BigEndian.Uint32(p[8:12]),
			Size: binary.BigEndian.Uint32(p[12:16])}
		if a.Size == 0 {
			return out, errZeroSize
		}
		if a.Addr+uint64(a.Size) < a.Addr {
			return out, errWrap
		}
		for _, o := range out[start:] {
			if a.Addr < o.Addr+uint64(o.Size) && o.Addr < a.Addr+uint64(a.Size) {
				return out, errOverlap
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// MatchA checks that an A answers the AAR the host sent: one entry per
// non-internal region, in order, each at least as large as the host region
// (the host writes its whole region there).
func MatchA(req []Region, adv []Advert) error {
	j := 0
	for _, r := range req {
		if r.Internal() {
			continue
		}
		if j >= len(adv) {
			return errCountMismatch
		}
		if adv[j].Size < r.Size {
			return errRegionTooSmall
		}
		j++
	}
	if j != len(adv) {
		return errCountMismatch
	}
	return nil
}

// SequentialNAAAddrs is the C host's placeholder for requested NAA
// addresses (get_sequential_naa_addresses): from offset, each region
// rounded up to PageWidth. The C host numbers internal regions first, then
// parameters, although the AAR lists parameters first.
func SequentialNAAAddrs(offset uint64, sizes []uint32, out []uint64) []uint64 {
	for _, s := range sizes {
		out = append(out, offset)
		offset += (uint64(s) + PageWidth - 1) / PageWidth * PageWidth
	}
	return out
}
