// Package wire is the rsocket (librdmacm rsocket.c) stream protocol as pure
// data: the connection private data, the 32-bit immediate messages, the
// buffer adverts and iomap entries, and the credit and buffer state machines
// of both directions. It performs no I/O; a transport posts the writes it
// returns and feeds it what arrives.
//
// # Connection data (REQ and REP private data)
//
// struct rs_conn_data, 40 bytes. The REQ carries it after the kernel's
// 36-byte cma_hdr; the REP at offset 0. Multi-byte fields are big-endian
// whatever the host (rs_format_conn_data uses htobe*, rs_save_conn_data
// be*toh):
//
//	off size field
//	0   1    version            1; anything else is rejected (REJ / ENOTSUP)
//	1   1    flags              bit0 NET: sender is big-endian; bit1 IOMAP: iomap table present (always set)
//	2   2    credits            sender's RQ size (default 384): the peer's first credit limit
//	4   3    reserved           0
//	7   1    target_iomap_size  scaled count: <=128 as is, else 0x80|(n>>8) meaning (b&0x7F)<<8
//	8   8    target_sgl.addr    sender's target buffer list (remote-writable)
//	16  4    target_sgl.key     its rkey (also covers the iomap table)
//	20  4    target_sgl.length  entries in the target SGL: RS_SGL_SIZE = 2
//	24  8    data_buf.addr      first half of the sender's receive ring
//	32  4    data_buf.key       its rkey
//	36  4    data_buf.length    half the ring (rbuf_size/2)
//
// An x86 librdmacm sends flags 0x02. The NET flag does not describe the
// fields above; it tells the peer in which byte order to write SGEs and
// iomap entries into the sender's target buffer list later (librdmacm's
// RS_OPT_SWAP_SGL): NET set = big-endian, clear = little-endian
// (ConnData.EntryOrder). Older design notes call bytes 4-7 one reserved
// 32-bit field; the code splits it as above.
//
// The target buffer list is RS_SGL_SIZE (2) SGEs of 16 bytes {u64 addr, u32
// key, u32 length} followed by target_iomap_size iomap entries of 24 bytes
// {u64 offset, u64 addr, u32 key, u32 length}: the iomap table starts at
// target_sgl.addr + 16*target_sgl.length.
//
// ParseConnData is stricter than librdmacm, which checks only the version:
// it also rejects reserved flag bits or bytes, a target SGL length other
// than 2, an empty receive buffer, wrapping addresses and a receive buffer
// overlapping the target list. A librdmacm peer never sends any of these.
//
// # Immediate data
//
// Every rsocket message is an RDMA WRITE WITH IMM whose 32-bit immediate
// (big-endian in ImmDt) is op<<29 | data:
//
//	op  name                  data (29 bits)                      write
//	0   RS_OP_DATA            bytes written                       the data, into the advertised ring
//	1   RS_OP_RSVD_DATA_MORE  reserved                            -
//	2   RS_OP_WRITE           (riowrite bookkeeping, not sent)    riowrite is a plain RDMA WRITE
//	3   RS_OP_RSVD_DRA_MORE   reserved                            -
//	4   RS_OP_SGL             new credit limit (low 16 bits used) one 16-byte SGE into a target SGL slot, or 0 bytes
//	5   RS_OP_RSVD            reserved                            -
//	6   RS_OP_IOMAP_SGL       iomap index (bits 28:16 reserved)   one 24-byte iomap entry
//	7   RS_OP_CTRL            0 DISCONNECT, 1 KEEPALIVE, 2 SHUTDOWN  0 bytes, RETH VA/R_Key arbitrary
//
// The source comment still describes bits 30/29 as "direct receive" and
// "more data" flags; the code only uses the 3-bit op. Keepalives are
// zero-length RDMA WRITEs without immediate (VA 0, R_Key 0); the KEEPALIVE
// value only tags the local work request. ParseImm rejects ops 1, 2, 3, 5,
// DATA of 0 bytes, unknown CTRL values and reserved iomap bits.
//
// # Data flow
//
// Receiver: a ring of rbuf_size bytes in two halves. Half 0 is advertised
// by the connection data; half 1 goes out with the first credit message, as
// an SGE into the peer's target SGL slot 1; later adverts alternate slot
// 0/1 and half 0/1, each sent once that half has been read (rs_give_credits:
// a credit message is due when a half is free or the peer used half its
// credits since the last grant — rseq_no - rseq_comp >= 0 in 16 bits — and
// one of the 4 control slots is free). Every credit message carries the new
// limit rseq_no + rq_size, where rseq_no counts data messages the
// application has fully read.
//
// Sender: target_sgl[0] starts as the peer's data_buf. A write may be
// posted when a send queue slot is free (sq_size - 4 for data), at least
// RS_SNDLOWAT (2048) bytes of send buffer are free, sseq_no != sseq_comp
// (16-bit credits) and the current target entry has room. rsend cuts a
// request into chunks of 2048 bytes doubling to RS_MAX_TRANSFER (65536),
// each cut to the free send buffer and to the rest of the current target
// entry, so no write crosses an advertised buffer and the receiver's ring
// fills strictly in order. DATA and IOMAP_SGL messages use a credit; SGL and
// CTRL messages do not (they are paced by control slots and RNR retry).
// librdmacm's receiver never counts an iomap update as read, so each one
// lowers the peer's credits for good; this package reproduces that.
//
// Receiver, Sender and Conn reproduce those rules and reject what a correct
// peer cannot send (ErrProtocol): data beyond the granted credits (reason
// "credit"), not at the fill position ("order"), past the advertised space
// ("past-buffer") or across two adverts ("crosses-sge"), and adverts into a
// slot still in use ("slot-busy"). Interop notes from runs against
// rstream/riostream/rcopy: an active side may write into the first half
// before sending its own first advert (accepted here); credit-only messages
// arrive at irregular intervals.
//
// # Defaults and limits
//
// SQ/RQ 384 each, clamped to [16, min(device, 0xFFFE)]; inline 64; receive
// and send buffers 128 KiB (SO_RCVBUF/SO_SNDBUF give twice the value, send at
// least 4096); iomap size 0; SOL_RDMA 0x10000 with RDMA_SQSIZE 0,
// RDMA_RQSIZE 1, RDMA_INLINE 2, RDMA_IOMAPSIZE 3, RDMA_ROUTE 4; polling
// time 10 µs; wake-up interval 500 ms; route resolution retried 6 times.
//
// Settled against rsocket.c and the real tools (see package rsocket): the
// REP carries the conn data at offset 0, with no CM header; an iomap update
// takes a credit that is never returned (rs_write_iomap increments sseq_no,
// rs_poll_cq never queues RS_OP_IOMAP_SGL).
//
// # Errors
//
// Every error is a fixed *Error value (returning one allocates nothing)
// whose Kind is one of four categories, matched with errors.Is; its Reason
// is a stable token for counters and tests (ReasonOf extracts it), its
// Detail the text:
//
//	ErrMalformed  the bytes break the format: short, version, reserved-flags,
//	              reserved-bytes, sgl-length, zero-length, wrap, overlap,
//	              reserved-op, ctrl, zero-data, iomap-reserved, length, header
//	ErrProtocol   the peer breaks the flow rules: credit, past-buffer, order,
//	              crosses-sge, slot-busy, slot; over-consume (Consume)
//	ErrBlocked    local flow control, retry later: send-queue, send-buffer,
//	              credits, target (the rs_can_send terms), ctrl-slot
//	ErrInvalid    a caller's bad argument: config, zero-data, slot, ctrl
//
// ErrClosed (data or a CTRL after the peer disconnected) is returned as is.
package wire
