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
// The exceptions are [Engine.ReadyShards], the consumer's side of a CQ
// ([CQ.Poll], [CQ.Len], [CQ.Overflows]), [QP.PostRecvConcurrent] and
// [QP.PostSendConcurrent], which may run at any time: a CQ's ring and a
// QP's receive and send queues have locks of their own, which the engine
// takes too. A concurrent send post writes the slot after the last one
// posted and publishes its new tail in an atomic, and puts the QP in its
// shard's inbox; the transmit pass moves the inbox into the shard's queue
// and takes the new tail when it reaches the QP, and a state change takes
// it under the lock, so that every post is sent, flushed or dropped by a
// reset exactly once. Posts that need engine objects or state (UD, DC,
// memory windows, a QP not in RTS, a queue that looks full) are left to
// [QP.PostSend]. With
// [Config.Shards] the QPs with packets to send wait in one queue per shard
// (QPN mod Shards), so that a device can run a transmit pass per shard at
// once ([Engine.TransmitShard]) and each QP's packets stay in order.
//
// Its cost follows the QPs in use, not the QPs that exist. QPs with a timer
// running wait in a heap (timers.go), so a timer event costs O(log n) in
// them (BenchmarkTimerEvent). A QP's work request rings and responder
// resources are made on first use and dropped when it returns to RESET, so
// an idle connected RC QP holds about 1 KB whatever its queue sizes
// (TestMillionIdleQPs: a million on one engine).
//
// Behaviour on the wire follows rxe where the IBTA leaves room (for example
// retry_cnt 7 means "retry forever", positive ACKs always carry syndrome
// 0x1F, and a READ request consumes one PSN per response packet), because
// rxe is the peer goroce must interoperate with first.
//
// One departure, invisible to an rxe responder: an RC requester that meets
// loss narrows its window of unacknowledged PSNs below rxe's fixed 128 and
// resends the first unacknowledged PSN after a few round trips without
// progress instead of waiting for the local ACK timeout (cc.go), so that
// go-back-N does not resend a full window per lost packet. New PSNs still
// leave in order and every resend starts at the first unacknowledged one.
//
// Congestion control (Config.CC, off by default) is DCQCN as ConnectX runs
// it, which rxe does not (ccrate.go): with it on, packets leave ECT(0), a
// CE-marked packet makes its QP send the peer a CNP (at most one per
// min_time_between_cnps), and a CNP cuts the QP's rate by the DCQCN state
// machine of dcqcn.go, a pure struct driven by the engine's clock. A
// token bucket (pace.go) holds the QP's requests and READ responses to that
// rate; it composes with the loss window of cc.go, which bounds what is in
// flight. CNPs and ACKs are not paced; UD and DC QPs take no part.
//
// Memory windows of type 1 and 2 (mw.go) follow rxe_mw.c: binds by
// QP.BindMW or BIND_MW work requests, LOCAL_INV and SEND_WITH_INV for type
// 2 windows, and an R_Key that names a window grants only the window's
// range and rights. Zero-based windows are not supported.
//
// Not implemented: fast registration (LOCAL_INV and SEND_WITH_INV also
// invalidate an ordinary MR, for good), FLUSH with persistence (global
// visibility is supported, as is ATOMIC_WRITE), alternate paths, multicast,
// end-to-end credits (received credits are ignored; ACKs carry 0x1F as rxe's
// do), XRC and RD.
//
// DC (DCI and DCT queue pairs, the mlx5 dynamically connected transport)
// runs on the RC stages with goroce's own framing in the RD opcode space;
// see docs/dc.md for every field, what is public and what is goroce's
// choice. Interoperability with ConnectX is unverified; rxe has no DC. Atomics are atomic with respect to this engine only. A
// completion that does not fit its CQ is lost (CQ.Overflows) and moves its QP
// to the error state, as in rxe; size CQs for the queues they serve.
//
// # What the device checks on receive
//
// A received packet passes the same checks as in rxe (rxe_recv.c, then
// rxe_resp.c or rxe_comp.c) before it touches a QP; the first failure drops
// it and bumps one device counter (package roce):
//
//	check                                           rxe                  where          counter
//	Ethernet/IP/UDP and IB headers, pad, lengths    rxe_rcv              roce, ib       bad_frame
//	ICRC (not on the UDP link: no wire IP header)   rxe_icrc_check       roce           icrc_err
//	IP destination is one of the device's GIDs      rxe_chk_dgid         roce           bad_dgid
//	BTH TVer is 0                                   hdr_check            qp             rcvd_dropped
//	the QPN exists (never QPN 0 or multicast)       hdr_check            qp             unknown_qp
//	P_Key matches 0xFFFF (full or limited member)   check_keys           qp             bad_key
//	opcode transport is the QP's (GSI counts as UD) check_type_state     qp             rcvd_dropped
//	state: requests RTR..SQE, responses RTS or SQD  check_type_state     qp             rcvd_dropped
//	RC/UC: IP source is the AV's DGID and IP        check_addr           qp             bad_addr
//	  destination its SGID (IPv4 and IPv6)
//	UD: Q_Key is the QP's (QP1: 0x80010000)         check_keys           qp             bad_key
//
// The responder then checks, in rxe's order, the PSN (duplicate or
// sequence NAK), the opcode sequence, the opcode against the QP type and
// its access flags, resources (a receive WQE, else RNR NAK; responder
// resources for READ and atomics), the lengths against the path MTU, and
// the R_Key (an MR's or a memory window's), its PD, access and range
// (counted in Stats.RKeyViolations when refused), before it executes
// anything. The
// completer accepts only responses for PSNs already sent, of the kind the
// oldest WQE expects (READ response, atomic ACK, ACK), in position and of
// the right length. Unlike rxe, requests to a QP in the error state are
// dropped rather than flushed through the responder. [Engine.Receive]
// checks addresses only when given a [Source]: a device always passes one.
//
// Test helpers live in package qptest: two engines joined by deterministic
// link/faultnet pipes under a fake clock.
package qp
