// Package fpga is the host side of SLAC Rogue's RoCEv2 protocol: Server is
// the RC receive server that takes the frames an FPGA sends (detector and
// DAQ data) into a slab of pre-posted receives and hands them downstream
// without copying, as rogue::protocols::rocev2::Server does with a verbs
// driver. Package fpga/emulator is a Go sender that behaves like the FPGA.
//
// # Bring-up
//
// The host and the FPGA exchange their connection values out of band (in
// PyRogue through the FPGA's register bus):
//
//  1. NewServer creates the slab, its memory region, the CQ and the RC QP in
//     INIT, and draws random 24-bit send and receive PSNs.
//  2. SetFPGAGID names the FPGA (an IPv4-mapped GID).
//  3. The host programs the FPGA with QPN, RqPSN, SqPSN (and, for the gen-1
//     data path, MRAddr and MRRKey); the FPGA's QP starts sending at SqPSN.
//  4. CompleteConnection(ctx, fpgaQPN, fpgaRqPSN, pmtu, minRNRTimer) posts
//     every receive and moves the QP to RTR and RTS. fpgaRqPSN becomes the
//     PSN the server expects first: PyRogue passes SqPSN here, and the
//     FPGA's send PSN is programmed to SqPSN too. (Rogue's documentation says
//     the FPGA's send PSN must match RqPSN; its code does the above.)
//
// # Data paths
//
// Both data paths the firmware has used are accepted (SetDataPath narrows
// it): SEND WITH IMMEDIATE into the posted receive buffer of slot wr_id
// (gen 2, the current firmware), and RDMA WRITE WITH IMMEDIATE into the slab
// at slot·maxPayload, which consumes the receive of slot wr_id (gen 1; the
// FPGA writes its slots in order, so consumers must release gen-1 frames in
// order). The channel is the low byte of the immediate and the upper 24
// bits are the FPGA's free-running counter, decoded as Rogue's gen-2 code
// does (the gen-1 code took the low byte without byte swapping).
//
// # Frames and flow control
//
// A Frame is a view of its slot, valid until its last reference is
// released; then the slot's receive is posted again. Consumers attach to
// the server (Attach, or Serve with a function): the first attached is the
// primary and gets each frame last, after the secondaries, as in Rogue's
// stream graph. A consumer that keeps a frame past AcceptFrame calls Retain
// and later Release, from any goroutine. When consumers hold every slot the
// receive queue is empty and the device answers the FPGA with RNR NAKs
// carrying minRNRTimer; the FPGA retries forever, so nothing is lost, only
// delayed. Until the first consumer attaches, completions wait in the CQ.
//
// Completions Rogue drops are counted (Stats): slot out of range, zero or
// oversize length, unexpected opcode, error status; their slots are posted
// again. A completion of a slot whose receive is not posted (the same slot
// completed twice) is counted as BadDuplicate and ignored, and a release
// beyond a frame's references as BadRelease: a slot goes back to the receive
// queue once per completion, whatever the device or the consumers do. A
// flushed completion (the QP went to the error state) stops the server
// cleanly and Err reports it.
//
// # A reconnect with stale PSNs
//
// An FPGA that was not reset keeps sending at its old PSNs after the host
// restarts its server. The new QP then takes every packet for a duplicate
// (acknowledged and discarded) or for one out of sequence (NAKed), and no
// frame ever completes. The server watches for this until its first frame,
// reading its QP's own counts of requests refused for their PSN, so other
// RC traffic on the device cannot trip it. Refusals still seen after half a
// second make the mismatch suspected: Err reports ErrPSNMismatch until a
// frame arrives, but Serve goes on, because a few packets spoofed from the
// FPGA's address at wrong PSNs look like a stale sender's first burst (an
// rxe sender behind the QP's PSN sends its window once and then waits).
// Refusals that go on (seen in several samples over half a second) confirm
// it, and Serve returns ErrPSNMismatch. The remedy is the firmware's soft
// reset before the FPGA is programmed again. Packets from any other address
// never reach the QP (bad_addr).
//
// # Errors
//
//	ErrInvalidSetting  an argument the FPGA or Rogue cannot take (bad port,
//	                   payload, depth, GID, QPN or PSN; a slab of 4 GiB or more)
//	ErrState           a call out of order (the message names which)
//	ErrFlushed         Err: the receive queue was flushed, the server stopped
//	ErrPSNMismatch     Err and Serve: a stale FPGA QP (see above)
//
// No host GID on the FPGA's subnet, or an empty GID index, wraps
// roce.ErrNoGID.
package fpga
