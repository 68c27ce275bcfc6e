package qptest

import (
	"github.com/goroce/goroce/internal/qp"
)

// BringUpDCI moves a DCI from RESET to RTS with p's MTU, timers, retries
// and initiator depth; sq is its first PSN.
func BringUpDCI(q *qp.QP, p RCParams, sq uint32) error {
	a := qp.QPAttr{State: qp.StateInit, Port: 1}
	if err := q.Modify(&a, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort); err != nil {
		return err
	}
	a = qp.QPAttr{State: qp.StateRTR, PathMTU: p.MTU}
	if err := q.Modify(&a, qp.AttrState|qp.AttrPathMTU); err != nil {
		return err
	}
	a = qp.QPAttr{State: qp.StateRTS, SQPSN: sq, Timeout: p.Timeout, RetryCnt: p.RetryCnt, RNRRetry: p.RNRRetry,
		MaxRdAtomic: p.RdAtomic}
	return q.Modify(&a, qp.AttrState|qp.AttrSQPSN|qp.AttrTimeout|qp.AttrRetryCnt|qp.AttrRNRRetry|qp.AttrMaxQPRdAtomic)
}

// BringUpDCT moves a DCT from RESET to RTR, where it serves, with p's
// access flags, MTU, RNR timer and responder resources.
func BringUpDCT(q *qp.QP, p RCParams) error {
	a := qp.QPAttr{State: qp.StateInit, Port: 1, AccessFlags: p.Access}
	if err := q.Modify(&a, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags); err != nil {
		return err
	}
	a = qp.QPAttr{State: qp.StateRTR, PathMTU: p.MTU, MinRNRTimer: p.MinRNRTimer, MaxDestRdAtomic: p.RdAtomic}
	return q.Modify(&a, qp.AttrState|qp.AttrPathMTU|qp.AttrMinRNRTimer|qp.AttrMaxDestRdAtomic)
}

// DCTEndpoint is a DCT with its PD, CQ and SRQ.
type DCTEndpoint struct {
	PD  *qp.PD
	CQ  *qp.CQ
	SRQ *qp.SRQ
	QP  *qp.QP
}

// NewDCT creates a PD, a CQ, an SRQ of depth receives and a DCT with key.
func NewDCT(e *qp.Engine, key uint64, depth, maxInitiators int) (*DCTEndpoint, error) {
	pd, err := e.AllocPD()
	if err != nil {
		return nil, err
	}
	cq, err := e.CreateCQ(4 * depth)
	if err != nil {
		return nil, err
	}
	srq, err := pd.CreateSRQ(qp.SRQAttr{MaxWR: depth, MaxSGE: 4})
	if err != nil {
		return nil, err
	}
	q, err := pd.CreateQP(&qp.QPInitAttr{Type: qp.DCT, SendCQ: cq, RecvCQ: cq, SRQ: srq,
		DC: qp.DCInitAttr{Key: key, MaxInitiators: maxInitiators}})
	if err != nil {
		return nil, err
	}
	return &DCTEndpoint{PD: pd, CQ: cq, SRQ: srq, QP: q}, nil
}
