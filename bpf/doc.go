// Package bpf is the XDP program that steers RoCEv2 frames to AF_XDP
// sockets, written with cilium/ebpf's assembler (no C compiler at build or
// run time) and loaded with cilium/ebpf.
//
// # Program
//
// For each received frame the program walks the headers, checking before
// every read that the header lies inside [data, data_end):
//
//  1. Ethernet (14 bytes). Up to two VLAN tags (TPID 0x8100 or 0x88a8, 4
//     bytes each) are skipped; a third tag is not, so such frames pass.
//  2. EtherType 0x0800: IPv4. The version must be 4, IHL at least 5, the
//     protocol UDP (17), and the frame must not be a fragment (MF clear,
//     offset 0: RoCEv2 sends with DF, and fragments are the kernel's to
//     reassemble). The UDP header starts IHL*4 bytes in, so options are
//     honoured.
//     EtherType 0x86DD: IPv6. The version must be 6 and the Next Header UDP;
//     extension headers are not walked (such frames pass).
//  3. UDP (8 bytes): the destination port must equal Options.Port (4791).
//  4. Once SetLocalAddrs has been called, the IP destination address must
//     be one of those it set (a hash map the device keeps in step with its
//     GID table); a frame to any other address is another stack's (rdma_rxe,
//     or a goroce device on the kernel UDP link bound to another address of
//     the same interface) and passes to the kernel, counted as OtherAddr.
//
// A frame that matches goes to bpf_redirect_map(xsks, ctx->rx_queue_index,
// XDP_PASS): to the AF_XDP socket registered for its RX queue, or, when
// that slot of the XSKMAP is empty or the queue is beyond Options.Queues,
// XDP_PASS to the kernel stack. Every
// other frame, including every truncated or malformed one, returns
// XDP_PASS, so ARP, ICMP, IPv6 neighbour discovery and TCP (for example the
// out-of-band QP exchange of the perftest tools) keep working while the
// program is attached.
//
// Only the first buffer of a multi-buffer frame is inspected. It always
// holds the headers, so loading with Options.Frags changes nothing in the
// logic; it only tells the kernel that the program copes with frames that
// span buffers, which driver-mode XDP requires where frames exceed a page
// (veth with a peer MTU above 3506, jumbo frames).
//
// A per-CPU array counts each decision (Stats): redirected, matched but no
// socket registered, passed, and passed for another address.
//
// # Attaching
//
// Program.Attach uses a bpf_link (Linux 5.9), so the program leaves the
// interface when the Attachment or Program is closed and when the process
// dies, even by SIGKILL. On older kernels it falls back to rtnetlink; such
// an attachment (Attachment.ViaLink false) outlives a process that dies
// without Close, and can be removed with "ip link set dev IF xdp off".
// AttachAuto tries driver mode, then generic mode.
//
// Loading needs CAP_BPF and CAP_NET_ADMIN (or CAP_SYS_ADMIN); attaching
// needs CAP_NET_ADMIN.
package bpf
