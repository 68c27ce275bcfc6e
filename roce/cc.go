package roce

import (
	"github.com/goroce/goroce/internal/qp"
	"github.com/goroce/goroce/link"
)

// Congestion control (Options.CC): DCQCN in the engine (internal/qp/ccrate.go,
// internal/qp/dcqcn.go).
type (
	// CCConfig turns on congestion control; its zero value is off.
	CCConfig = qp.CCConfig
	// DCQCNParams are DCQCN's settings, named as mlx5's.
	DCQCNParams = qp.DCQCNParams
)

// CCRate returns the QP's DCQCN rate in bits per second and whether it is
// limited below DCQCNParams.MaxRate; with congestion control off it is
// (0, false).
func (q *QP) CCRate() (int64, bool) {
	d := q.d
	d.mu.Lock()
	defer d.mu.Unlock()
	return q.q.CCRate()
}

// CCMinRate returns the lowest current DCQCN rate of a rate-limited QP in
// bits per second, or 0 when none is limited.
func (d *Device) CCMinRate() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.CCMinRate()
}

// ect0 is the ECN field ECT(0), which data packets carry under congestion
// control.
const ect0 = 2

// setDefaultTOS gives a link that builds IP headers itself (the kernel UDP
// link) the TOS most packets carry, Options.DSCP with ECT(0) under
// congestion control, so that they leave without a control message each.
// A link that refuses still sends each frame's TOS, at that cost.
func (d *Device) setDefaultTOS() {
	tos := d.dscp
	if d.opts.CC.DCQCN {
		tos |= ect0
	}
	if tos == 0 {
		return
	}
	if s, ok := d.link.(link.TOSDefaulter); ok {
		if err := s.SetDefaultTOS(tos); err != nil {
			d.log.Warn("roce: link keeps TOS 0: the TOS goes per packet", "tos", tos, "err", err)
		}
	}
}
