// Package link defines how the RoCEv2 device moves packets: a Link carries
// whole Ethernet frames in batches.
//
// The frame contract: every frame handed to WriteBatch or received through
// ReadBatch is a complete Ethernet frame, Ethernet header (optionally with
// one 802.1Q tag) + IPv4 or IPv6 header + UDP header + IB packet (BTH ...
// payload, pad) + ICRC, without the Ethernet FCS. The transport always
// builds and parses the same frames whatever the link underneath:
//
//   - AF_XDP (xdplink) puts the frames on the wire unchanged.
//   - The kernel UDP link (udplink) sends only the UDP payload and lets the
//     kernel build the headers; on receive it synthesizes Ethernet, IP and
//     UDP headers from what recvmsg reports. Info.Synthetic says so,
//     Info.UncheckedICRC says whether the ICRC can still be checked, and
//     Info.FixedSourcePort and Info.IPIDZero say which header fields the
//     transport must use so that the ICRC it computes matches the wire.
//   - The memory link (memlink) passes frames through a faultnet pipe.
//
// The header walk (ParseFrame, Parser) and header synthesis (Header.Put)
// that the links and the device share are ib's (ib.ParseEncap,
// ib.EncapParser, ib.EncapHeader) under the link's names and errors: ib
// is the one place headers are encoded and decoded. They are deliberately
// minimal (no IP options, no IPv6 extension headers), since RoCEv2 uses
// neither.
//
// # Errors
//
//	ErrClosed     a closed link (matches net.ErrClosed)
//	ErrMalformed  not a well-formed frame: truncated, not-ip, not-udp, header
//	ErrRefused    a frame the link does not allow: family, source-addr,
//	              source-port
//	ErrTooLarge   beyond the link MTU
//
// ErrMalformed and ErrRefused come as a fixed *Error (no allocation) whose
// Reason is the token above (ReasonOf); a WriteBatch refusal wraps its error
// in a FrameError with the frame's index.
package link
