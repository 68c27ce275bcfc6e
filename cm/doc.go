// Package cm is the InfiniBand Communication Manager of goroce: it sets up
// and tears down RC/UC connections and resolves UD services (SIDR) with CM
// MADs exchanged between the GSI QPs (QP1) of two ports, interoperating with
// the Linux IB CM and rdma_cm (rping, udaddy, ucmatose, ...).
//
// # API
//
// [Dial] and [Listen]/[Listener.Accept] are the rdma_cm of goroce: they take a
// [roce.Device] and an IP address and port (the rdma_cm port space and port
// become the IB service ID; the rdma_cm header travels at the start of the
// REQ private data) and return a [Conn] whose RC QP is in RTS, or, for the
// UDP port space, a UD QP with the peer's QPN and Q_Key from SIDR. Everything
// that waits takes a context; cancelling a pending Dial sends a REJ.
// [Conn.Close] disconnects with a DREQ; [Conn.Err] says why a connection
// ended.
//
// [Listener.Accept] answers requests with the listener's options and runs
// the handshakes in the background, returning established connections
// only. Admission follows TCP's SYN queue: a request being answered
// leaves the backlog for a bounded half-open table
// ([ListenOptions.MaxHalfOpen]; when it is full the oldest entry still
// waiting for its peer's address is abandoned with a REJ, else the oldest,
// so a real peer whose REP went out keeps its place under a flood spoofed
// from addresses that answer nothing) and lasts at most
// [ListenOptions.HalfOpenTimeout] whatever timeouts the peer's REQ asks
// for; established connections are never displaced. REQs are rate-limited
// per source address before they create any state ([Config.REQRate]). The
// CM's goroutine never waits for a neighbour: a MAD to an address not yet
// resolved is dropped for its retry while the address resolves in the
// background. [Listener.Stats] and [Manager.Stats] count what was
// dropped. [QPOptions.Release] frees what [QPOptions.Prepare] registered
// for a handshake that never completes.
// [Listener.Request] hands out requests unanswered, as rdma_get_request:
// the server reads the peer's private data and answers with
// [Request.Accept], with its own QP options, access flags and REP private
// data, or [Request.Reject].
//
// A [Manager] owns the device's QP1 and runs the CM on it; [NewManager]
// makes the owner explicit and [Manager.Close] releases QP1. The
// package-level Dial and Listen use a Manager of their own per device: the
// first of them takes QP1, and it is released a few seconds after the last
// of their listeners and connections closed, once pending disconnections
// have finished and its last MADs (a cancelled dial's REJ) are on the wire.
//
// # Engine
//
// [Engine] is the protocol core. Like package qp it does no I/O and starts no
// goroutines: the owner feeds received MADs to [Engine.Receive], sends what
// [Engine.PollOutbound] returns, reads [Engine.PollEvent], and drives timers
// with [Engine.NextDeadline] and [Engine.Advance] against an injected clock.
// It implements the MAD transaction layer (transaction IDs, retransmission
// with the timeouts carried in the messages, Max CM Retries, MRA extending
// the wait), the active (REQ_SENT → REP_RCVD → ESTABLISHED) and passive
// (REQ_RCVD → REP_SENT → ESTABLISHED) state machines, DREQ/DREP with
// timewait, SIDR, and the QP attributes both sides must agree on
// ([Engine.QPAttr]). Where the IBTA leaves room it does what Linux cm.c does,
// because Linux is the peer it must interoperate with; in particular a
// Starting PSN is the PSN the receiver of the message sends from.
//
// Wire formats live in package cm/mad; package cm/rping is rping's test on
// top of this package.
//
// # Errors
//
//	ErrTimeout          no answer after the retries (a net.Error, Timeout true)
//	ErrState            a call the state does not allow: wrong state, an ID
//	                    the engine does not hold, a Request answered twice
//	ErrInvalid          bad parameters from the caller
//	ErrListening        a second listener on a service ID
//	ErrClosed           a closed Manager, Listener or Conn (net.ErrClosed)
//	ErrDisconnected     a connection ended by a DREQ (ours or the peer's)
//	ErrHalfOpenDropped  a half-open handshake displaced (MaxHalfOpen)
//
// A refusal by the peer matches mad.ErrRejected: a *mad.RejectError for a
// REJ (errors.Is also matches its mad.RejectReason), a mad.SIDRStatus for a
// SIDR_REP with a status other than success.
package cm
