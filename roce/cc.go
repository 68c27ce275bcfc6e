package roce

import "github.com/goroce/goroce/qp"

// Congestion control (Options.CC): DCQCN in the engine (qp/ccrate.go,
// qp/dcqcn.go).
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
