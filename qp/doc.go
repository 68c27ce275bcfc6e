// Package qp is the InfiniBand transport engine of goroce: protection domains,
// memory regions, completion queues, shared receive queues and queue pairs (RC,
// UC, UD) with the requester, responder and completer split of the Linux rxe
// driver.
//
// The engine does no I/O and starts no goroutines. A device feeds it parsed
// packets with [Engine.Receive], asks it for packets to send with
// [Engine.Transmit] (into buffers the device owns, leaving headroom for the
// Ethernet/IP/UDP headers; the engine writes BTH through pad and reserves the
// four ICRC bytes), and drives its timers with [Engine.Advance] and
// [Engine.NextDeadline]. Time comes from an injected [Clock], so a test can
// run the engine against a fake clock and a lossy in-memory network and get
// the same result every time.
//
// An Engine is not safe for concurrent use: the device serialises calls.
//
// Behaviour on the wire follows rxe where the IBTA leaves room (for example
// retry_cnt 7 means "retry forever", positive ACKs always carry syndrome
// 0x1F, and a READ request consumes one PSN per response packet), because
// rxe is the peer goroce must interoperate with first.
//
// Not implemented: memory windows, fast registration and local invalidate
// (SEND_WITH_INV invalidates an ordinary MR), FLUSH with persistence (global
// visibility is supported, as is ATOMIC_WRITE), alternate paths, multicast,
// end-to-end credits (received credits are ignored; ACKs carry 0x1F as rxe's
// do), XRC and RD. Atomics are atomic with respect to this engine only. A
// completion that does not fit its CQ is lost (CQ.Overflows) and moves its QP
// to the error state, as in rxe; size CQs for the queues they serve.
//
// Test helpers live in package qptest: two engines joined by deterministic
// internal/faultnet pipes under a fake clock.
package qp
