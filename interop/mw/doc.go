// Package mw qualifies goroce's memory windows (internal/qp/mw.go) against
// rdma_rxe's: type 2 windows, bound by a BIND_MW work request and usable
// through the binding QP alone, in both directions over RC connections
// made with rdma_cm.
//
// The guest side is cpeer/mwpeer.c, built on the host against
// libibverbs-dev and librdmacm-dev (the test skips, naming them, when the
// headers are absent) and copied into the guest's share. It registers a
// buffer with MW_BIND and no remote access, accepts goroce's connections
// and runs the steps the test writes into the share (bind a window,
// invalidate one, RDMA READ or WRITE goroce's memory, dump its buffer),
// answering each in a file; the share is the out-of-band channel that
// carries addresses and rkeys.
//
// rxe's windows, goroce the requester: through a window the guest bound
// (ibv_alloc_mw IBV_MW_TYPE_2, IBV_WR_BIND_MW), goroce READs and WRITEs in
// range, every byte checked; past the region rxe answers with a remote
// access error NAK; after the guest's IBV_WR_LOCAL_INV, and through
// another connection's QP, likewise. goroce's windows, rxe the requester:
// goroce binds a type 2 window (WRBindMW) and the guest READs and WRITEs
// through it in range; past the window (inside the region), through
// another QP and after goroce's WRLocalInv the guest's work request
// completes with IBV_WC_REM_ACCESS_ERR and goroce counts rkey_violation.
// Guest memory outside what was written through a window is checked
// unchanged, as is goroce's.
//
// rxe checks an access through a window against the region's range, not
// the window's (check_rkey in rxe_resp.c calls mr_check_range); the test
// reports what rxe does for an access past a window that stays inside the
// region instead of requiring a NAK.
//
// The lab runs at MTU 1500 (path MTU 1024) so that every frame fits an
// AF_XDP chunk.
package mw
