// Package cuobj is a Go cuObject: the client and server of NVIDIA's
// cuObjClient/cuObjServer, which move object data by RDMA while the
// application keeps its own control path (S3 over HTTP in practice).
//
// The client registers memory and hands out descriptor tokens ([Token]);
// the server, given a token on the control path, RDMA WRITEs the object
// into the client's memory for a GET and RDMA READs it from there for a
// PUT. Errors match the errno values of the C API with errors.Is
// (syscall.EIO, ENODEV, ENOMEM, EAFNOSUPPORT, EINVAL) and carry the
// reason and, for a failed completion, the ibv_wc_status.
//
// # Transports
//
// Protocol 1002 (RC, "external RC"): the client listens
// with rdma_cm on its address and a port of its own and puts that port in
// the token's lid field and its endpoint number in the qp field (see
// [Token]). The server connects to the client through package cm the first
// time a channel serves that client, and keeps the connection: each
// channel has its own RC connection to each client it serves, as each DC
// channel is a DCI of its own, so a failure on one channel (and the QP
// reset that follows) never disturbs another. The client grants remote
// WRITE to the rkey of GET tokens and remote READ to that of PUT tokens
// only (two memory regions per registration).
//
// Protocol 1001 (DC, CUOBJ_PROTO_RDMA_DC_V1) runs on goroce's DC
// transport (docs/dc.md). The client creates one DCT (with the SRQ DC
// requires; cuObject's WRITEs and READs never consume it) and puts its
// number in the token's qp field and 0 in the lid field; nothing listens.
// The server keeps one DCI per channel (Tunables.NumDCIs, default 128)
// and reaches any client by naming, in each work request, an address
// handle for the token's GID, the token's DCT number and its DC key: no
// per-client connection is set up or kept. Per client the server holds
// only one address handle, shared by every channel, where RC holds a
// connection per channel (a QP and its queues). The DC CONNECT and the
// DCT's NAKs are goroce's own wire (ConnectX's is not public), so DC runs
// between goroce peers.
//
// The DC key is not in the token: the descriptor format the public
// integrations print has no field for it, and cuObject configures it on
// both ends instead, as goroce does: the client's rdma_dc_key (32-bit
// hex, default 0xffeeddcc, zero-extended to DC's 64-bit access key) is
// its DCT's key, and the server's Tunables.DCKey (same default) is the
// key its DCIs send. A mismatch is refused by the client's device (a
// remote access error at the server, counted as BadKey by the client's
// device). A token of a client that has gone names a DCT that no longer
// exists: the request fails with EIO and the remote invalid request
// status. A failed completion puts the DCI in the error state; with
// qp_reset_on_failure the channel's next request takes the DCI back
// through RESET (or, if flushed completions are still to come, replaces
// it), so one client's failure never touches another channel. A client
// whose rdma_transport_type is "dc" speaks DC unless ClientOptions.Proto
// says otherwise.
//
// # Multipath
//
// With rdma_multipath_enabled a client runs on several devices
// (ClientOptions.Backups, selected and ordered by rdma_dev_addr_list),
// registers memory on each, and names in each callback attempt's token
// the device it currently uses. A retryable failure on a device whose
// port went down (or that failed rdma_unhealthy_threshold times in a row)
// is retried on the next healthy one; the health check moves back to the
// first device once it has been up for rdma_failback_delay_ms
// (rdma_failback_enabled). ClientStats counts failovers and failbacks.
package cuobj
