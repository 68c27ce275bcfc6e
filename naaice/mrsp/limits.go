package mrsp

// Limits bounds what an NAA accepts in an AAR.
type Limits struct {
	// MaxRegions caps the entry count (at most MaxAAREntries).
	MaxRegions int
	// MaxRegionSize caps one region; 0 means MaxRegionSize.
	MaxRegionSize uint32
	// MaxTotal caps the sum of all region sizes; 0 means no cap.
	MaxTotal uint64
	// NAAMemSize is the size of the NAA address space requested addresses
	// must fall in; 0 means the whole 56-bit space.
	NAAMemSize uint64
	// AnyAlignment accepts requested NAA addresses that are not multiples
	// of PageWidth.
	AnyAlignment bool
}

// DefaultLimits: the C library's own limits (31 entries, 2 GiB regions,
// page-aligned non-overlapping NAA addresses).
var DefaultLimits = Limits{MaxRegions: MaxAAREntries}

// Check applies the region rules to decoded AAR entries:
//   - only the four known flags; an internal region carries no other flag
//     and publishes no host buffer (address and rkey 0); single-send implies
//     input, as naaice_set_singlesend_mr makes it;
//   - every size non-zero and at most MaxRegionSize, their sum at most
//     MaxTotal (ErrCode 1, not enough memory);
//   - host ranges do not wrap; requested NAA addresses are page-aligned,
//     inside NAAMemSize and their page-rounded ranges do not overlap
//     (ErrCode 2, invalid address; a range ending past NAAMemSize is ErrCode 1).
func (l *Limits) Check(rs []Region) error {
	max := MaxAAREntries
	if l.MaxRegions > 0 && l.MaxRegions < max {
		max = l.MaxRegions
	}
	if len(rs) > max {
		return errTooManyRegions
	}
	if len(rs) == 0 {
		return errNoRegions
	}
	maxSize := uint64(MaxRegionSize)
	if l.MaxRegionSize != 0 {
		maxSize = uint64(l.MaxRegionSize)
	}
	mem := uint64(MaxNAAAddr) + 1
	if l.NAAMemSize != 0 && l.NAAMemSize < mem {
		mem = l.NAAMemSize
	}
	var total uint64
	for i, r := range rs {
		if r.Flags&^flagsKnown != 0 {
			return errFlags
		}
		if r.Internal() {
			if r.Flags != FlagInternal || r.HostAddr != 0 || r.RKey != 0 {
				return errFlags
			}
		} else if r.Flags&FlagSingleSend != 0 && r.Flags&FlagInput == 0 {
			return errFlags
		}
		if r.Size == 0 {
			return errZeroSize
		}
		if uint64(r.Size) > maxSize {
			return errRegionTooLarge
		}
		total += uint64(r.Size)
		if l.MaxTotal != 0 && total > l.MaxTotal {
			return errTotalTooLarge
		}
		if r.HostAddr+uint64(r.Size) < r.HostAddr {
			return errWrap
		}
		if !l.AnyAlignment && r.NAAAddr%PageWidth != 0 {
			return errUnaligned
		}
		if r.NAAAddr >= mem {
			return errInvalidAddress
		}
		end := r.NAAAddr + pages(r.Size)
		if end > mem {
			return errOutOfMemory
		}
		for _, o := range rs[:i] {
			if r.NAAAddr < o.NAAAddr+pages(o.Size) && o.NAAAddr < end {
				return errOverlap
			}
		}
	}
	return nil
}

func pages(n uint32) uint64 { return (uint64(n) + PageWidth - 1) / PageWidth * PageWidth }
