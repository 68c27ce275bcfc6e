package qp

import "fmt"

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
		k.mws = append(k.mws, nil)
		k.gens = append(k.gens, 0)
		k.uses = append(k.uses, 0)
	}
	if k.mrs[idx] != nil || k.mws[idx] != nil {
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

// DebugDC describes a DCI's state for test failure messages.
func DebugDC(q *QP) string {
	d := q.dc
	if d == nil {
		return "not DC"
	}
	return fmt.Sprintf("state %v connected %v gen %d dctn %#x ctl %d retryConnect %v linger %v sq %d/%d/%d psn %d comp %d max %d needRetry %v rnrWait %v armed %v",
		q.state, d.connected, d.gen, d.target.dctn, d.ctl, d.retryConnect, d.lingerArmed, q.sqHead, q.req.idx, q.sqTail,
		q.req.psn, q.comp.psn, q.req.maxPSN, q.req.needRetry, q.req.rnrWait, q.comp.armed)
}

// DebugDCT describes a DCT's initiators.
func DebugDCT(q *QP) string {
	s := ""
	for k, c := range q.dc.ctxs {
		s += fmt.Sprintf("\n  dci %#x gen %d state %v epsn %d haveRecv %v inMsg %d out %d last %v", k.qpn, c.dc.gen, c.state, c.resp.epsn, c.resp.haveRecv, c.resp.inMsg, c.resp.outLen, c.dc.last)
	}
	return s
}

// SendWindow returns the PSNs an RC requester may have outstanding now.
func SendWindow(q *QP) int { return int(q.comp.win.window()) }

// MaxSendWindow is the window without loss (RXE_MAX_UNACKED_PSNS + 1).
const MaxSendWindow = maxWindow

// RemoteSpan is the responder's R_Key resolution: the bytes key grants q
// for an access needing need at [va, va+n).
func RemoteSpan(q *QP, key uint32, need Access, va uint64, n uint32) ([]byte, bool) {
	return q.remoteSpan(key, need, va, n)
}
