// Package wire is the Rogue RoCEv2 (SLAC) FPGA-to-host stream as pure data:
// the immediate layout, the connection values both sides are set up with,
// the PSN pairing, and the checks Rogue's host server applies to each
// received frame. It performs no I/O.
//
// # Frames
//
// The current FPGA engine (surf RoCEv2AxiStreamRdmaCore, Rogue's "gen 2")
// sends one RC SEND WITH IMM per AXI-stream frame into the host's pre-posted
// receives: single-packet messages of at most 4096 bytes (128 beats of 32
// bytes; longer frames are dropped on the FPGA and counted), signaled, not
// solicited. The immediate, big-endian on the wire and read with ntohl, is
//
//	bits 31:8  counter: the FPGA's ring position (addrCount), wrapping at AddrWrapCount; diagnostic
//	bits 7:0   channel: the Rogue stream channel (the engine sends 1)
//
// so wire bytes [c2, c1, c0, channel]. The host receive for slot i is one SGE
// at slab + i·maxPayload of maxPayload bytes, wr_id = i; a frame is the first
// byte_len bytes of that slot, delivered with firstUser 0x02 (SSI SOF) and
// re-posted when released.
//
// The first generation (until mid-2026) used RDMA WRITE WITH IMM into the
// slab (address slab + counter·Len) with immediate 1, and its host took
// imm_data & 0xFF without ntohl: on a little-endian host the first ImmDt byte
// (Gen1Channel), so immediate 1 was channel 0. Checker.AcceptWrite admits
// that form too.
//
// # Frame checks
//
// In Rogue's order (Server::processCompletion): wr_id not below the slot
// count → drop; status flush (QP in error) → stop the poller; any other error
// status → re-post; not a receive with immediate → re-post; byte_len 0 or
// above maxPayload → re-post; otherwise deliver. Checker.Check returns the
// action and a typed error naming the check.
//
// # Setup
//
// Host server defaults: maxPayload 9000 (PyRogue 4096), 256 receive slots,
// slab aligned to 4096 and below 4 GiB (the FPGA's MR length is a 32-bit
// field). Host RC QP: 1 send WR, 1 SGE; RTR path MTU 1..5 (default 4096),
// dest QPN = FPGA QPN, max_dest_rd_atomic 16, min RNR timer (C++ default
// code 1 = 0.01 ms, PyRogue 12 = 0.64 ms), GRH hop limit 64, SL 0; RTS
// timeout 14, retry 3, RNR retry 7, max_rd_atomic 16. The host's two PSNs are
// random 24-bit values.
//
// PSN pairing: the host RTR's rq_psn is the fpgaRqPsn argument of
// completeConnection, and PyRogue passes the host's own SQ PSN there; the
// FPGA's RTS sq_psn is programmed with that same host SQ PSN. The FPGA's
// first SEND therefore carries hostSqPsn, which is what the host expects.
// The host RQ PSN goes only to the FPGA's RTR (its unused receive side). The
// API text ("the FPGA's send-queue PSN must match getRqPsn") describes
// something else; the code wins. NewSetup returns the paired values.
//
// FPGA side (metadata bus): MR access 0x0F over the host slab, QP type RC (2),
// QP access 0x0E, P_Key 0xFFFF, timeout 14, retry 3, RNR retry 7 (retry
// forever on RNR NAK, which is the flow control: the host answers RNR NAK when
// every slot is held downstream).
//
// # Errors
//
// Errors are fixed *Error values (no allocation) of two categories, matched
// with errors.Is; Reason is a stable token (ReasonOf):
//
//	ErrInvalid  qpn, psn, pmtu, rnr-timer, retry (NewSetup); config,
//	            slab-size (SlabLen)
//	ErrFrame    slot, flushed, status, opcode, zero-length, too-long
//	            (Checker.Check, whose Action says what to do with the slot)
package wire
