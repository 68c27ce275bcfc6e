package mrsp

// Write is one RDMA write of a data phase.
type Write struct {
	// Region is the index among the non-internal regions (the A index).
	Region     int
	RemoteAddr uint64
	RKey       uint32
	Len        uint32
	// WithImm marks the last write of the phase: RDMA WRITE WITH IMM with
	// Imm, solicited.
	WithImm bool
	Imm     uint32
}

// HostWrites appends the host's writes for RPC number rpc (0 = first), as
// naaice_write_data posts them: every INPUT region in order to its NAA
// buffer, single-send regions only on the first RPC, the last write carrying
// imm. sendLen, when not nil, gives per non-internal region the byte count to
// send (naaice_set_bytes_to_send); otherwise the whole region goes.
func HostWrites(req []Region, adv []Advert, rpc int, sendLen []uint32, imm uint32, out []Write) ([]Write, error) {
	if err := MatchA(req, adv); err != nil {
		return out, err
	}
	start := len(out)
	j := 0
	for _, r := range req {
		if r.Internal() {
			continue
		}
		i := j
		j++
		if r.Flags&FlagInput == 0 || (r.Flags&FlagSingleSend != 0 && rpc > 0) {
			continue
		}
		n := r.Size
		if sendLen != nil {
			if i >= len(sendLen) || sendLen[i] > r.Size {
				return out[:start], errRegionTooSmall
			}
			n = sendLen[i]
		}
		out = append(out, Write{Region: i, RemoteAddr: adv[i].Addr, RKey: adv[i].RKey, Len: n})
	}
	if len(out) == start {
		return out, ErrNoWrites
	}
	out[len(out)-1].WithImm = true
	out[len(out)-1].Imm = imm
	return out, nil
}

// HostAbort is the host's error signal: a zero-length WRITE WITH IMM with
// immediate 0 to NAA region 0.
func HostAbort(adv []Advert) (Write, error) {
	if len(adv) == 0 {
		return Write{}, ErrNoWrites
	}
	return Write{RemoteAddr: adv[0].Addr, RKey: adv[0].RKey, WithImm: true, Imm: HostAbortImm}, nil
}

// NAAWrites appends the NAA's write-back: every OUTPUT region, whole
// registered length, to the host buffer published in the AAR, the last one
// carrying NAAImm(rc).
func NAAWrites(req []Region, rc uint8, out []Write) ([]Write, error) {
	start := len(out)
	j := 0
	for _, r := range req {
		if r.Internal() {
			continue
		}
		if r.Flags&FlagOutput != 0 {
			out = append(out, Write{Region: j, RemoteAddr: r.HostAddr, RKey: r.RKey, Len: r.Size})
		}
		j++
	}
	if len(out) == start {
		return out, ErrNoWrites
	}
	out[len(out)-1].WithImm = true
	out[len(out)-1].Imm = NAAImm(rc)
	return out, nil
}

// NAAAbort is the NAA's error path: a zero-length WRITE WITH IMM carrying
// NAAImm(rc) to the host region at mr_return_idx (always 0).
func NAAAbort(req []Region, rc uint8) (Write, error) {
	for _, r := range req {
		if !r.Internal() {
			return Write{RemoteAddr: r.HostAddr, RKey: r.RKey, WithImm: true, Imm: NAAImm(rc)}, nil
		}
	}
	return Write{}, ErrNoWrites
}
