// Package mrsp is the NAAICE wire protocol as pure data: the Memory Region
// Setup Protocol (MRSP) messages, the immediates of the RPC data phase, and
// the host and NAA state machines, as the public NAAICE C library
// (naa-communication-library, lib/naaice.c and lib/naaice_swnaa.c) does them.
// Where the API description and the library disagree, the wire follows the
// library; the differences are listed at the end.
//
// # Connection
//
// rdma_cm, RDMA_PS_TCP, server port 12345; no private data either way (a
// full software NAA rejects with "Server overlad\0"). RC QP with 1025 send
// and receive WRs, retry count 7, RNR retry 6, initiator depth and responder
// resources 1. The host's CQ is armed for solicited completions only, so every
// MRSP SEND and every final WRITE WITH IMM carries the solicited-event bit.
//
// # MRSP messages
//
// Each is one SEND into a 768-byte receive buffer (MR_SIZE_MRSP = 24 x
// MAX_MRS). All multi-byte fields are big-endian.
//
// AAR, host -> NAA, 4 + 24·N bytes:
//
//	0   1  type 0x01
//	1   1  N = parameter regions + internal regions
//	2   2  padding 0
//	then N entries, parameters first (in parameter order), internal regions last:
//	+0  1  flags: 0x01 INTERNAL, 0x02 SINGLESEND, 0x04 INPUT, 0x08 OUTPUT
//	+1  7  requested NAA address (56 bits)
//	+8  8  host address the NAA writes outputs to (0 for internal)
//	+16 4  rkey of that host buffer (0 for internal)
//	+20 4  size (registered length, or the requested size of an internal region)
//
// The C host builds bytes 0-7 of an entry as one 64-bit word, flags in the top
// byte, and byte-swaps it, which on its little-endian hosts puts flags first
// as above. Its requested NAA addresses are placeholders: sequential from 0,
// each region rounded up to 4096 bytes, internal regions numbered first
// (SequentialNAAAddrs); its software NAA ignores them and allocates its own.
// Flags seen from the example client: 0x06, 0x04, 0x0c.
//
// A, NAA -> host, 4 + 16·N bytes: type 0x02, N = number of non-internal
// AAR entries, padding 0, then per region in AAR order {u64 NAA address,
// u32 rkey, u32 size}.
//
// Type 0x03 (MSG_MR_R, with struct naaice_mr_request {u64 size}) is left
// from an older protocol version and never sent; Type refuses it.
//
// ERR, either direction, 4 bytes: type 0x00, code, padding 0. Codes: 0x01
// not enough memory (address + size beyond the memory), 0x02 invalid
// address, 0x03 too many regions. The C software NAA sends 0x01 for every
// failure; each *Error here carries the code an NAA should answer with.
//
// Limits: MAX_MRS is 32 and the count field 8 bits, but an AAR of 32 entries
// (772 bytes) does not fit the 768-byte receive buffer, so 31 is the real
// maximum. The protocol caps a region at 2 GiB. ParseAAR is stricter than the
// C NAA (which checks nothing): exact length, zero padding, known flags,
// internal regions without host buffer, single-send implying input,
// non-empty regions, page-aligned non-overlapping requested addresses inside
// the configured NAA memory (Limits). The C host satisfies all of these.
//
// # Data phase immediates
//
// The host RDMA-WRITEs each input region to its NAA address (the last one
// WRITE WITH IMM), then waits for the NAA's writes of every output region
// (the last one WRITE WITH IMM) into the host buffers from the AAR.
//
// Host immediate (host order, as ntohl reads it): bits 0-6 function code
// (1..127), bit 7 = 1 (START_RPC_MASK 0x80), bits 8-15, 16-23, 24-31 the
// three user bytes 0, 1, 2. On the wire: [user2, user1, user0, 0x80|fn]; for
// function code 1 and no user bytes 00 00 00 81. Immediate 0 (on a
// zero-length write) is the host's error signal.
//
// NAA immediate: 0 = success. The C host reads the return code as imm >> 8;
// the C software NAA sends error codes in the low byte (which that host reads
// as 0). NAAImm sends code << 8; ParseNAAImm treats any non-zero value as a
// failure. Codes: 0x01 socket unavailable, 0x02 kernel timeout, 0x03-0x0f
// reserved, 0x10-0x7f application errors. Where an FPGA NAA puts the code is
// not public (UNVERIFIED).
//
// # State machines
//
// States keep the C values: INIT 0, READY 1 (host), CONNECTED 2,
// DISCONNECTED 3, MRSP_SENDING 10, MRSP_RECEIVING 11, MRSP_DONE 12,
// DATA_SENDING 20, CALCULATING 21 (NAA), DATA_RECEIVING 22, FINISHED 30,
// ERROR 40. HostTransitions and NAATransitions are the tables; any other
// (state, event) pair is an out-of-order message or completion and gives a
// *TransitionError (errors.Is ErrProtocol). Like the C host, a host
// Machine refuses the A before the AAR's send completion and the NAA's final
// write before its own writes complete. CM errors move to ERROR from any
// state; a disconnect to DISCONNECTED (host) or FINISHED (NAA).
//
// # Where the API description and the library differ
//
//   - naaice_set_bytes_to_send: the description says 0 restores the full
//     size; the library restores on a negative value and sends 0 bytes for 0.
//   - mr_return_idx "set by naaice_set_metadata": the metadata region and that
//     function were removed in 2024; the index stays 0.
//   - Immediate: the description reserves "the lowest byte" for the function
//     code; the library also sets bit 7 of it on host -> NAA writes and the
//     NAA masks with 0x7F.
//   - The software NAA reads an incoming ERR code from byte 3, not byte 1.
//   - The count field is documented for up to 256 regions; the library's
//     buffers hold 31. The C host checks no count at all: 32 regions make a
//     772-byte SEND that the NAA's 768-byte receive cannot take (UNVERIFIED
//     by run; a receive too short for a SEND fails with a local length error).
//   - The C host copies as many A entries as the A's count says without
//     comparing it with its own regions; MatchA insists on one entry per
//     non-internal region, each at least as large.
//
// # Data phase plans
//
// HostWrites and NAAWrites list the writes of one RPC as the library posts
// them: host INPUT regions in order (single-send ones on the first RPC only,
// naaice_set_bytes_to_send lengths honoured), NAA OUTPUT regions in order at
// their whole length; the last write of each carries the immediate.
// HostAbort and NAAAbort are the zero-length error writes.
//
// # Errors
//
// Errors are fixed *Error values (no allocation) whose Kind is one of four
// categories, matched with errors.Is; Reason is a stable token (ReasonOf),
// Code the MRSP code an NAA answers an AAR failing that check with:
//
//	ErrMalformed  short, length, type, padding, no-regions, zero-code, flags,
//	              fn-code, no-start
//	ErrRefused    too-many, zero-size, region-size, total-size, memory,
//	              address, unaligned, overlap, wrap
//	ErrProtocol   count, too-small (an A that does not match the AAR), order
//	              (every *TransitionError)
//	ErrAborted    abort (the host's immediate 0)
//
// ErrNoWrites (a data phase with nothing to write) is returned as is.
package mrsp
