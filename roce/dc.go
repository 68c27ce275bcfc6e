package roce

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/qp"
)

// DC queue pair types (docs/dc.md): a DCI reaches one DCT at a time, naming
// it in every SendWR (AH, RemoteQPN = the DCT number, DCKey); a DCT serves
// many DCIs through its SRQ. DC runs between goroce devices; rxe has none.
const (
	DCI = qp.DCI
	DCT = qp.DCT
)

// DCInitAttr configures a DCT: its access key and how many initiators it
// keeps state for.
type DCInitAttr = qp.DCInitAttr

// DCStats are the device's DC event counts.
type DCStats = qp.DCStats

// ErrBadDCKey reports a DC CONNECT whose key is not the DCT's (counted and refused).
var ErrBadDCKey = qp.ErrBadDCKey

// DCCounters returns a snapshot of the DC counters.
func (d *Device) DCCounters() DCStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eng.Stats().DC
}

// DCTInitiators returns how many initiators a DCT currently holds state for
// (0 for other QPs).
func (q *QP) DCTInitiators() int {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.q.DCTInitiators()
}

// DCAttr are the attributes ActivateDC applies; zero fields get the
// defaults of ConnectAttr.
type DCAttr struct {
	// PathMTU defaults to the port's active MTU.
	PathMTU ib.MTU
	// Access is what a DCT allows (default: remote read, write and atomic).
	Access Access
	// DCI: Timeout (default 14), RetryCnt and RNRRetry (default 7),
	// RdAtomic (initiator depth, default 16). DCT: MinRNRTimer (default
	// 12), RdAtomic (responder resources per initiator, default 16).
	Timeout, RetryCnt, RNRRetry, MinRNRTimer, RdAtomic uint8
	// NoDefaults takes Timeout, RetryCnt, RNRRetry and MinRNRTimer as given.
	NoDefaults bool
	// LocalPSN is a DCI's first PSN.
	LocalPSN uint32
}

// ActivateDC brings a DCI from RESET to RTS, or a DCT from RESET to RTR
// (where a DCT serves), as mlx5's DC bring-up does. A DCI has no remote
// end: each SendWR names its target.
func (q *QP) ActivateDC(ctx context.Context, c *DCAttr) error {
	if q.typ != DCI && q.typ != DCT {
		return fmt.Errorf("roce: activate DC on a %v QP: %w", q.typ, qp.ErrInvalidArgument)
	}
	a := QPAttr{State: StateInit, Port: 1}
	mask := AttrState | AttrPKeyIndex | AttrPort
	if q.typ == DCT {
		a.AccessFlags = c.Access
		if a.AccessFlags == 0 {
			a.AccessFlags = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessLocalWrite
		}
		mask |= AttrAccessFlags
	}
	if err := q.Modify(ctx, &a, mask); err != nil {
		return err
	}
	a = QPAttr{State: StateRTR, PathMTU: c.PathMTU}
	if a.PathMTU == 0 {
		a.PathMTU = q.d.activeMTU()
	}
	// A DC request carries DCETH, RDETH and DETH beyond what an RC packet
	// of the same operation does (docs/dc.md); the largest must fit an
	// IPv4 frame at least (a DCI's targets may be of either family).
	need := ib.BTHSize + ib.DCETHSize + ib.RDETHSize + ib.DETHSize + ib.RETHSize + ib.ImmDtSize + a.PathMTU.Bytes() + ib.ICRCSize
	if limit := q.d.ibLimit(true); a.PathMTU.Bytes() > 0 && need > limit {
		return fmt.Errorf("roce: DC path MTU %d needs %d-byte IB packets, the link carries %d: %w",
			a.PathMTU.Bytes(), need, limit, ErrMTU)
	}
	mask = AttrState | AttrPathMTU
	if q.typ == DCT {
		a.MinRNRTimer = orDefault(c.MinRNRTimer, 12, c.NoDefaults)
		a.MaxDestRdAtomic = orDefault(c.RdAtomic, 16, false)
		mask |= AttrMinRNRTimer | AttrMaxDestRdAtomic
	}
	if err := q.Modify(ctx, &a, mask); err != nil || q.typ == DCT {
		return err
	}
	a = QPAttr{State: StateRTS, SQPSN: c.LocalPSN,
		Timeout:     orDefault(c.Timeout, 14, c.NoDefaults),
		RetryCnt:    orDefault(c.RetryCnt, 7, c.NoDefaults),
		RNRRetry:    orDefault(c.RNRRetry, 7, c.NoDefaults),
		MaxRdAtomic: orDefault(c.RdAtomic, 16, false)}
	return q.Modify(ctx, &a, AttrState|AttrSQPSN|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrMaxQPRdAtomic)
}

// maxLearnedNeighbours bounds the neighbour cache entries DC traffic may add.
const maxLearnedNeighbours = 4096

// learnDCPeer remembers the source MAC of a received DC frame for its source
// address when the neighbour cache has none. A DCT answers initiators it
// never resolved an address for, along the path their requests came (as a
// responder replies to a request's source); without this its responses
// would find no neighbour. Only frames that passed the ICRC and DGID checks
// get here, and the cache grows by at most maxLearnedNeighbours.
func (d *Device) learnDCPeer(f []byte, src netip.Addr) {
	if d.linfo.Synthetic {
		return
	}
	src = src.Unmap()
	n := d.neigh
	if _, ok := n.lookup(src); ok {
		return
	}
	var mac [6]byte
	copy(mac[:], f[6:12])
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(*n.cache.Load()) < maxLearnedNeighbours {
		n.storeLocked(map[netip.Addr][6]byte{src: mac})
	}
}
