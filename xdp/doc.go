// Package xdp provides AF_XDP sockets built directly on golang.org/x/sys/unix.
//
// An AF_XDP socket shares a memory area, the UMEM, with the kernel. The UMEM
// is cut into equal chunks (2048 or 4096 bytes). Four single-producer,
// single-consumer rings move chunk addresses between user space and the
// kernel:
//
//   - fill: user space hands empty chunks to the kernel for reception;
//   - RX: the kernel hands back chunks holding received frames;
//   - TX: user space hands chunks holding frames to transmit;
//   - completion: the kernel hands back chunks whose frames were sent.
//
// The ring words shared with the kernel are read and written with
// sync/atomic, which gives the acquire/release ordering the kernel's
// ring protocol requires; each side keeps cached copies of the indices so
// that most operations touch no shared word at all.
//
// A Socket is bound to one queue of one interface. Receive and Transmit work
// in batches and allocate nothing: Receive hands out descriptors whose bytes
// are read in place with Frame and later returned with Release; Transmit
// copies frames into free TX chunks, which come back through the completion
// ring; AllocTx, TxBuffer and SubmitTx let a caller build frames in the
// chunks instead, and AllocTxSpan and SubmitTxSpans in spans of adjacent
// chunks, one contiguous buffer per frame wherever it starts. With
// multi-buffer (XDP_USE_SG, Linux 6.6) a frame larger than a chunk is
// carried by several descriptors chained with XDP_PKT_CONTD.
//
// Kernel features that are missing produce errors matching ErrNotSupported
// that name the feature and the first kernel version that has it. The
// package needs Linux 5.4 (ring flags for need_wakeup); sharing a UMEM
// across queues needs 5.10, multi-buffer 6.6. Only aligned chunk mode is
// supported.
//
// A Socket is not safe for concurrent use, except that one goroutine may
// receive while another transmits.
package xdp
