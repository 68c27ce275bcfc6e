// Package naaice is a NAAICE host (client) and software NAA (server) on the
// goroce stack, wire-compatible with the public NAAICE C library
// (naa-communication-library) in both roles. The wire protocol itself,
// the MRSP messages, immediates and state machines, is package
// naaice/mrsp; this package runs it over cm connections.
//
// # Host
//
// A Context is the C library's communication context with its AP1 calls
// in Go shape:
//
//	NewContext               naaice_init_communication_context (+ naaice_register_mrs)
//	SetInput/SetOutput       naaice_set_input_mr / naaice_set_output_mr
//	SetSingleSend            naaice_set_singlesend_mr
//	SetInternal              naaice_set_internal_mrs
//	SetImmediate             naaice_set_immediate
//	SetBytesToSend           naaice_set_bytes_to_send
//	Connect                  naaice_setup_connection
//	StartMRSP / DoMRSP       naaice_init_mrsp / naaice_do_mrsp
//	StartRPC / DoRPC         naaice_init_data_transfer / naaice_do_data_transfer
//	Poll / Wait / PollBusy   naaice_poll_cq_nonblocking / _blocking / _busy
//	State, Result, RPCs      state, naa_returncode + bytes_received, no_rpc_calls
//	Abort                    naaice_write_data with function code 0 (the host's error signal)
//	Disconnect, Close        naaice_disconnect_and_cleanup
//
// The rest of AP1 is folded in: naaice_init_rdma_resources and
// naaice_register_mrs happen in NewContext, the connection events
// (naaice_poll_connection_event, naaice_poll_and_handle_connection_event)
// are package cm's and Connect returns at ESTABLISHED; naaice_send_message,
// naaice_post_recv_mrsp, naaice_post_recv_data and naaice_write_data are
// the steps of StartMRSP and StartRPC; naaice_handle_work_completion is
// what Poll does with each completion; naaice_set_parameter_mrs is the
// params argument.
//
// Parameter regions are the caller's slices, registered in place. Client.Call
// is the one-call form: connect, MRSP, one RPC, disconnect. A non-zero return
// code of the NAA is an *RPCError, an MRSP error message an *MRSPError, a
// failed work completion a *CompletionError.
//
// What the host does on the wire is what the C host does: rdma_cm with
// RDMA_PS_TCP and no private data, retry 7, RNR retry 6, initiator depth and
// responder resources 1; the AAR as a solicited SEND; per RPC one receive
// for the NAA's answer, then RDMA WRITEs of the input regions, the last one
// WRITE WITH IMM (solicited) with the function code, the start bit and the
// user bytes. Two things are more tolerant than the C host: an answer that
// arrives before the host's own sends completed (its ACK was lost and the
// NAA went on) is kept and handled in order instead of failing the
// connection, and the MRSP uses separate send and receive buffers (the C
// host receives the A into the buffer its AAR may still be retransmitted
// from).
//
// # Software NAA
//
// A Server accepts connections (Serve, ListenAndServe), each on its own
// goroutine: it posts the AAR's receive before accepting, checks the AAR
// against its Limits and memory budget (an MRSP error message with the
// code otherwise), allocates and registers the regions, posts the first
// RPC's receive before it sends the A (the C server posts it only after
// its A's send completed, leaving a fast host to RNR retries), and then
// for each RPC posts the next receive, runs the Routine registered for the
// function code on the regions in place, and writes back every output
// region at its full length, the last write carrying the return code
// shifted by 8 (what the C host reads) with the solicited bit. A non-zero
// code, an unknown function code (RCUnknownFunction) or a panicking routine
// (RCRoutinePanic) is answered with a zero-length write carrying only the
// code; the C server instead stops serving the connection. Regions keep
// their contents between RPCs, as the C server's do.
//
// Bad input ends only its connection and is counted (ServerCounters): an
// AAR with too many regions, an absurd size, unaligned or overlapping
// addresses (MRSP error message), a write outside the regions (the QP
// fails: CompletionErrors), a message out of order (OutOfOrder), a host
// error write (HostAborts), a host that leaves mid-RPC (Disconnects).
// Memory is bounded by Limits.MaxTotal per connection, MaxMemory in all
// and MaxConns connections. A connection that sends no AAR, or no next
// RPC, within IdleTimeout is closed (IdleTimeouts), and when every slot
// is taken, or the memory budget is spent, a new connection displaces the
// one idle longest (IdleEvicted); only a server whose connections are all busy rejects,
// with the C server's "Server overlad".
//
// # Where the description and the library differ
//
// The wire follows the library (see package mrsp): SetBytesToSend restores
// the full size on a negative count, not on 0; there is no metadata region
// (mr_return_idx is 0); the immediate's low byte carries bit 7 besides the
// function code; the NAA's return code travels in bits 8-15. Besides:
//
//   - naaice_poll_cq_blocking "blocks until at least one completion is
//     available"; the library arms its CQ for solicited completions only,
//     so it wakes for the peer's solicited SENDs and writes with immediate
//     (and errors), not for the host's own write completions. Wait wakes
//     for any completion; the NAA sets the solicited bit for C hosts.
//   - naaice_poll_cq_busy gives up after POLLING_TIMEOUT (500 ms), so a
//     routine that runs longer fails a busy-polling C host; PollBusy waits
//     until ctx ends.
//   - naaice_post_recv_data's receive "specifies the MRSP region"; the
//     library posts an empty one (address 0, length 0).
//   - The C software NAA never answers a DREQ (it leaves rdma_disconnect
//     to the host), so a graceful Disconnect from it waits for the CM's
//     retries; Close, like the C host, does not wait (seen on rxe).
//   - An unknown function code: the C software NAA logs it and stops
//     serving the connection without an answer; goroce's answers with
//     RCUnknownFunction.
package naaice
