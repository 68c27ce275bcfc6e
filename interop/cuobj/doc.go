// Package cuobj tests the RDMA operations of a goroce cuObject server
// (package cuobj) against real Soft-RoCE memory: no cuObject client runs
// on rxe, so cpeer/cuobjpeer.c plays the memory side of an RC client
// (protocol 1002) in the guest. It registers a buffer of known content,
// twice as a goroce client does (one MR granting remote WRITE for GET
// tokens, one remote READ for PUT tokens), listens with rdma_cm, answers
// the server's hello for its endpoint number, and checks the whole buffer
// when told to stop.
//
// The goroce side is a cuobj.Server on the lab's host interface (AF_XDP),
// driven through its ordinary API: the test builds the descriptor tokens
// from the address, length and rkeys the guest reports, and
// HandleGetObject/HandlePutObject connect the server's channel to the
// guest with rdma_cm and RDMA WRITE into / READ from the guest's MR. A
// token of another endpoint is refused by the guest as stale. A
// range past the guest's MR, in a forged token that claims more than was
// registered, is refused by rxe: the server reports EIO with
// IBV_WC_REM_ACCESS_ERR, resets the connection, and the next request
// connects again.
//
// cuobjpeer is built on the host against libibverbs-dev and librdmacm-dev
// (the tests skip, naming them, when the headers are absent) and copied
// into the guest's share. The lab runs at MTU 1500 (path MTU 1024) so
// that every frame fits an AF_XDP chunk.
package cuobj
