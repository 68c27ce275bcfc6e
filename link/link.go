package link

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/goroce/goroce/internal/errclosed"
	"github.com/goroce/goroce/internal/linkerr"
)

// Link moves whole Ethernet frames (Ethernet [+VLAN] + IP + UDP + IB packet
// + ICRC).
type Link interface {
	// ReadBatch blocks until at least one frame is available (or ctx is
	// done, or the link is closed: ErrClosed), then calls fn once with up
	// to a link-defined number of frames. The slices are only valid during
	// fn (zero-copy for AF_XDP UMEM and the memory link). It returns the
	// number of frames handed to fn.
	ReadBatch(ctx context.Context, fn func(frames [][]byte)) (int, error)
	// WriteBatch transmits frames; they are copied out (or queued for TX)
	// before it returns, so the caller may reuse the buffers. It returns
	// how many were accepted; on error, frames[n] is the one that failed
	// (see FrameError).
	WriteBatch(frames [][]byte) (int, error)
	// MTU returns the IP MTU of the interface.
	MTU() int
	// HardwareAddr returns the link's MAC address (all zeros when it has
	// none, as on loopback).
	HardwareAddr() net.HardwareAddr
	// Info describes the kind of link and how faithful its frames are.
	Info() Info
	// Close releases the link and unblocks pending ReadBatch calls.
	Close() error
}

// Poller is implemented by links that can be read without blocking. A
// device uses it to run to completion: the goroutine waiting for a
// completion reads the link itself, runs the transport and transmits,
// instead of sleeping until a receive goroutine wakes it; its receive
// goroutine waits with WaitReadable and reads with PollBatch, so it never
// holds the link while it sleeps.
type Poller interface {
	// PollBatch is ReadBatch without the wait: it calls fn once with the
	// frames already queued, up to the same link-defined number, and
	// returns how many; it returns 0 at once, without calling fn, when
	// nothing is queued or another goroutine is reading the link (a
	// ReadBatch blocked waiting for frames included). The frames are valid
	// only during fn. A closed link returns ErrClosed.
	PollBatch(fn func(frames [][]byte)) (int, error)
	// WaitReadable blocks until frames may be queued, ctx is done (its
	// error) or the link is closed (ErrClosed). It takes nothing and holds
	// nothing a reader needs, so PollBatch may run while it blocks; it may
	// return when another goroutine has taken the frames meanwhile.
	WaitReadable(ctx context.Context) error
}

// MultiQueue is implemented by links that receive on several queues at
// once (the kernel UDP link with several SO_REUSEPORT sockets). RxQueues
// returns one Link per queue, the link itself first, each reading only
// its own queue with ReadBatch (and PollBatch, WaitReadable, when it is a
// Poller); frames are sent through the link itself unless it is a
// TxQueues. The link steers every packet for a QP to the same queue, so
// that each queue, read by one goroutine, keeps a QP's packets in order. A
// device reads every queue from a goroutine of its own.
type MultiQueue interface {
	RxQueues() []Link
}

// TxQueues is implemented by links whose queues also send apart (the
// AF_XDP link: a socket per queue, each with its own TX ring, buffers and
// lock). TxQueues returns one Link per queue, whose WriteBatch (and
// TxLender methods, when the link lends) send on that queue alone, so that
// writes through different queues share no lock and may run at once;
// buffers a queue lent go back through that queue. A device sends each
// transmit shard's frames through one of them. The kernel UDP link is not
// one: its other queues only receive.
type TxQueues interface {
	TxQueues() []Link
}

// AddrServer is implemented by links that send from only some of an
// interface's addresses: the kernel UDP link sends from the one address its
// socket is bound to, or from any address of the socket's family when it is
// bound to the wildcard. A device lists in its GID table only the
// addresses its link serves (and, at index 0, the default GID, as every
// RoCE device does), so that no QP is given a source GID whose frames the
// link would refuse.
type AddrServer interface {
	// ServesAddr reports whether frames from addr can be sent and
	// received.
	ServesAddr(addr netip.Addr) bool
}

// AddrFilter is implemented by links that can take from the interface only
// the RoCEv2 frames addressed to some of its addresses (the AF_XDP link's
// steering program), leaving the rest to the kernel and whatever else runs
// RoCE on the interface. A device calls SetLocalAddrs with the addresses of
// its GID table whenever the table changes. Until the first call such a
// link takes every RoCEv2 frame.
type AddrFilter interface {
	SetLocalAddrs(addrs []netip.Addr) error
}

// TOSDefaulter is implemented by links whose kernel builds the IP header
// of sent frames (the kernel UDP link): a frame's TOS or traffic class
// reaches the wire through a control message per datagram unless it is the
// socket's own. A device whose packets mostly carry one TOS other than 0
// (ECT(0) with congestion control on) sets it once with SetDefaultTOS,
// before it sends; frames with another TOS still leave with theirs.
type TOSDefaulter interface {
	SetDefaultTOS(tos uint8) error
}

// TxLender is implemented by links that lend their transmit buffers (the
// UMEM of an AF_XDP socket): a frame built in a lent buffer is sent from
// where it was built, saving the copy WriteBatch makes. A device uses it
// when the link has it and falls back to WriteBatch when LendTx lends
// nothing. Lending and writing run under the caller's own serialization:
// one goroutine at a time, as WriteBatch.
type TxLender interface {
	// LendTx sets bufs[:n] to n ≤ len(bufs) transmit buffers of at least
	// size bytes each and returns n; 0 when the link cannot lend buffers
	// that large or has none free. Every lent buffer must come back
	// through WriteLent or ReturnTx.
	LendTx(bufs [][]byte, size int) int
	// WriteLent transmits frames[i], built inside the lent buffer bufs[i]
	// (anywhere in it), and takes back every one of bufs, sent or not. It
	// sends every frame it can, skipping those it refuses, and returns how
	// many it queued and the first error (a *FrameError for a refused
	// frame).
	WriteLent(bufs, frames [][]byte) (int, error)
	// ReturnTx takes back lent buffers that carry nothing to send.
	ReturnTx(bufs [][]byte)
}

// Kinds reported in Info.Kind.
const (
	KindAFXDP = "afxdp"
	KindUDP   = "udp"
	KindMem   = "mem"
)

// Info describes a link.
type Info struct {
	// Kind is KindAFXDP, KindUDP or KindMem.
	Kind string
	// Name is the interface name or local address.
	Name string
	// Synthetic is true when link-layer headers of received frames are
	// synthesized (kernel UDP link): the IPv4 ID and the MACs are not what
	// was on the wire, so the ICRC of a received frame cannot be checked
	// over the IP header.
	Synthetic bool
	// UncheckedICRC is true when the ICRC of received frames cannot be
	// checked: their headers are synthesized and lack a field the ICRC
	// covers (the kernel UDP link over IPv4 does not learn the IP ID).
	// Over IPv6 every covered field is known, and the ICRC is checked.
	UncheckedICRC bool
	// FixedSourcePort, if non-zero, is the UDP source port every sent
	// frame actually carries (kernel UDP link bound to 4791); the
	// transport must build frames, and their ICRC, with it.
	FixedSourcePort uint16
	// IPIDZero is true when sent IPv4 frames carry IP ID 0 (Linux: DF set
	// on an unconnected socket), so the ICRC must be computed with ID 0.
	IPIDZero bool
}

// ErrClosed is returned by a closed link. It matches net.ErrClosed and
// every other goroce ErrClosed (errors.Is).
var ErrClosed = errclosed.New("link: closed")

// Categories of a frame the link cannot carry, matched with errors.Is. A
// WriteBatch refusal wraps one in a FrameError naming the frame's index in
// the batch.
var (
	// ErrMalformed: not a well-formed Ethernet + IP + UDP frame (reasons
	// truncated, not-ip, not-udp, header).
	ErrMalformed = linkerr.ErrMalformed
	// ErrRefused: a well-formed frame the link's address family, address or
	// fixed source port does not allow (family, source-addr, source-port).
	ErrRefused = linkerr.ErrRefused
	// ErrTooLarge: a frame beyond the link MTU (returned as is or wrapped).
	ErrTooLarge = linkerr.ErrTooLarge
)

// Error is the detail of an ErrMalformed or ErrRefused: Kind is the
// category, Reason a stable token, Detail the text.
type Error = linkerr.Error

// ReasonOf returns the Reason of the *Error in err's chain, or "".
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// FrameError reports which frame of a batch was refused and why.
type FrameError struct {
	Index int   // position in the batch
	Err   error // an *Error, ErrTooLarge (perhaps wrapped), or a system error
}

func (e *FrameError) Error() string { return fmt.Sprintf("frame %d: %v", e.Index, e.Err) }

// Unwrap returns the cause.
func (e *FrameError) Unwrap() error { return e.Err }
