package qp

// Test-only hooks for replaying captured traffic, where keys and QPNs were
// chosen by the peer that produced the capture.

// RegMRWithKey registers an MR whose L_Key/R_Key is exactly key.
func RegMRWithKey(pd *PD, buf []byte, iova uint64, acc Access, key uint32) (*MR, error) {
	k := &pd.e.keys
	idx := key >> 8
	if idx == 0 || idx >= maxMRIndex {
		return nil, ErrInvalidArgument
	}
	for uint32(len(k.mrs)) <= idx {
		k.mrs = append(k.mrs, nil)
		k.gens = append(k.gens, 0)
		k.uses = append(k.uses, 0)
	}
	if k.mrs[idx] != nil {
		return nil, ErrBusy
	}
	mr := &MR{pd: pd, buf: buf, iova: iova, access: acc, valid: true, key: key}
	k.mrs[idx] = mr
	k.gens[idx] = uint8(key)
	k.uses[idx]++
	pd.refs++
	return mr, nil
}

// SetNextQPN makes the next CreateQP try qpn first.
func SetNextQPN(e *Engine, qpn uint32) { e.nextQPN = qpn }
