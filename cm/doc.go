// Package cm is the InfiniBand Communication Manager of goroce: it sets up
// and tears down RC/UC connections and resolves UD services (SIDR) with CM
// MADs exchanged between the GSI QPs (QP1) of two ports, interoperating with
// the Linux IB CM and rdma_cm.
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
// because Linux is the peer it must interoperate with.
//
// Wire formats live in package cm/mad.
package cm
