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
// Protocol 1002 (RC, "external RC") is implemented: the client listens
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
// Protocol 1001 (DC) plugs in behind the same internal interface
// (transport and path in transport.go) once DC initiators and targets
// exist in packages qp and roce; until then a server or client asked for
// it fails with ErrUnsupported.
package cuobj
