package roce

// Resources are the numbers of live verbs objects of a device, the figures
// `rdma resource show` prints for a kernel device. Leak tests compare them
// before and after a workload.
type Resources struct {
	PD, CQ, QP, SRQ, MR, AH int
	MW                      int // memory windows
}

// released counts one object fewer when its destruction succeeded (a
// refused Close, busy or repeated, leaves the object counted). A repeated
// Close is reported as the device's ErrClosed.
func (r *Resources) released(n *int, err error) error {
	if err == nil {
		*n--
	}
	return devErr(err)
}

// Resources returns the numbers of live PDs, CQs, QPs (the GSI QP
// included), SRQs, MRs, AHs and memory windows.
func (d *Device) Resources() Resources {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.res
}

// HasQP reports whether qpn names a live QP of the device: a destroyed QP's
// number is free in the device's table until it is handed out again.
func (d *Device) HasQP(qpn uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.QP(qpn) != nil
}
