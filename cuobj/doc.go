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
// the token's lid field and, in the qp field, its endpoint number or, for
// a memory window token, the QPN of the connection the window is bound
// through (see [Token]). The server connects to the client through
// package cm the first time a channel serves that client with a token
// naming the endpoint, and keeps the connection: each channel has its own
// RC connection to each client it serves, as each DC channel is a DCI of
// its own. A token naming a connection by its QPN runs on that
// connection, whichever channel the request came on (the server borrows
// the connection's channel for the request), so a failure on a QP (and
// the reset that follows) disturbs the requests on that QP alone. The
// rkey of a GET token grants remote WRITE only, that of a PUT token
// remote READ only, each over the token's range alone (see Threat model).
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
//
// # Threat model
//
// A token travels in the clear on the control path (an HTTP header), so
// anyone on that path may read it, and anyone may send a server a token
// of their own making. What a token grants, to whom, for how long:
//
//   - What: remote WRITE (GET token) or READ (PUT token) of exactly
//     [raddr, raddr+rsize) of the client's memory, through an rkey of its
//     own. An RC token is by default a type 2 memory window over exactly
//     that range of the buffer's one registration, bound through one
//     connection of the server the token is for; a DC token (a DCT posts
//     no binds), an RC token with ClientOptions.RegionTokens, or one the
//     client cannot bind (below) is a memory region registered over the
//     range alone. The registration's own regions grant no remote access
//     (they allow binding windows, which grants nothing by itself) and
//     their keys never leave the client. A widened token (rsize or raddr
//     changed) reaches nothing outside the range: the access fails with a
//     remote access error (IBV_WC_REM_ACCESS_ERR at the server), counted
//     by the client as ClientStats.AccessErrors (RC) and by its device as
//     rkey_violation.
//   - For how long: the window is invalidated (LOCAL_INV) and the region
//     deregistered when the callback attempt that made it returns
//     (success, failure, timeout or cancellation of the request), or, for
//     GetRDMAToken, at PutRDMAToken, Deregister or Close. A replayed token
//     is dead: its rkey is never honoured again (keys are not reused).
//     Server work still in flight when the request ends fails the same
//     way. A remote access error fails the client's QP (as rxe's): the
//     client then ends that connection (ClientStats.Failures), so that a
//     server which missed the NAK (a stale duplicate READ of a token
//     already dead draws it for a PSN the server has long completed)
//     learns from the DREQ and dials again, instead of resending into a
//     QP that drops everything.
//   - Through which QP (RC windows): a window is honoured on the QP it
//     was bound through alone. The token's qp field names that
//     connection by the client's QPN; the server runs the request on the
//     connection whose client end has that GID, port and QPN, whichever
//     of its channels the request came on, and a qp field naming none of
//     its live connections is an endpoint number, as without windows (the
//     client refuses any but its own: a QPN of a connection that has
//     ended, or of the client's connection with another server, is
//     refused as stale). Any other QP, even a connection from the
//     server's own address, gets a remote access error with the token,
//     and a server's kept connection reaches only the windows bound
//     through it. The client binds a token's window through a live
//     connection of the token's server (RDMAInfo.AllowServer,
//     GetRDMATokenFor, the one address of ClientOptions.Servers, or, for
//     a callback, the server the last callback named, else, with no
//     Servers, the only server connected) that no other live window is
//     bound through, so that concurrent tokens run on as many QPs and
//     channels as there are; never through a connection whose QPN is its
//     endpoint number, so the two cannot be confused; and only through a
//     connection the server has already sent a request on (the client's
//     accept completes at the RTU, before the server has indexed the
//     connection, so a window through it could reach the server first and
//     be taken for an endpoint number). A callback's window
//     guessed for one server and handed to another is refused there as
//     stale; the callback is retried with a region, and the client
//     guesses from its connections no more. A server that has lost a
//     connection the client still holds (its disconnect lost with the
//     path) dials its QPN the same way: the client refuses it and closes
//     its end, and the retry is a region. Where there
//     is none (a client's first request to a server, more tokens at once
//     than the server has connections, a server not named) the token is a
//     region (ClientStats.WindowGrants and RegionGrants count which): the
//     server has no connection for the client to bind through before it
//     has seen a token, and the token must exist before the callback
//     sends it. Requests on one QP share its fate: one that fails (a
//     forged token naming the QP, say) ends the connection and fails the
//     others in flight on it, which the client retries. goroce's windows
//     are qualified against rxe's in both directions (interop/mw).
//   - To whom (RC): the client's listener accepts a connection only from
//     an address a live token was handed to (RDMAInfo.AllowServer,
//     GetRDMATokenFor) or, for tokens that name no server, one of
//     ClientOptions.Servers; with neither, any address while such a token
//     lives (weaker: set one of them). Others are refused, counted as
//     ClientStats.Strangers, with a REJ that carries nothing (no reason,
//     no endpoint). Admission is by address: a host that can send from
//     the server's address, or the server itself, can use any live region
//     token handed to that server; and a connection, once accepted, is
//     kept, so its server can reach every later live region token of the
//     client (not only its own) if it guesses the rkey, which is not
//     secret (an index and a generation). A window token is not reachable
//     that way: only through the QP it was bound through. DC has no
//     connection: a DC token is usable by anyone who reaches the client's
//     DCT with its DC key, for as long as it lives.
//
// A region grant costs the client about a microsecond (BenchmarkGrant)
// and one key: the device never honours a key twice and retires a key
// slot after 255 uses, so one client can make about 2^24 × 255 (4 × 10^9)
// tokens in its life, some two days at 25,000 tokens a second; past that
// a token fails with ENOMEM. A window grant costs the same key, plus a
// bind and an invalidation that each wait for their completion: a few
// microseconds (BenchmarkGrantWindow, about three times a region's). The
// transfer itself costs the same through either for 4 KiB and some 10 %
// more through a window for 1 MiB (BenchmarkGetWindow against
// BenchmarkGet, over memlink). A request whose window token names
// another channel's connection waits for any request running on that
// connection, and is asynchronous only in name: it returns once
// complete, its event left for Poll.
//
// The server admits work so that tokens naming clients that do not exist
// cost little (Tunables): a front end takes a channel with
// AllocateChannelFor (at most MaxChannelsPerClient per client address),
// reaches the client with Connect (bounded by ConnectTimeout), and only
// then reserves memory with Reserve (bounded by MaxHeldBytes), allocates
// its buffer and reads its file. Refusals are an *OverloadError
// (ErrOverloaded; the S3 gateway, cuobj/s3gw, answers 503 SlowDown with
// Retry-After) or ErrConnectTimeout (s3gw: 504), each counted in
// ServerStats.
package cuobj
