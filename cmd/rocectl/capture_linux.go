package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/goroce/goroce/bpf"
	"github.com/goroce/goroce/cmd/rocectl/devstat"
	"github.com/goroce/goroce/ib"
	"github.com/goroce/goroce/internal/cliflag"
	"golang.org/x/sys/unix"
)

func init() {
	register("capture", command{
		summary: "capture RoCEv2 frames of an interface to a pcap file (tcpdump -w, udp dst port 4791)",
		run:     runCapture,
	})
}

const captureUsage = `usage: rocectl capture -d IFACE -w FILE [-c COUNT] [--duration D] [--port 4791]

Mirrors "tcpdump -i IFACE -w FILE udp dst port 4791": writes every RoCEv2
frame the interface sends or receives to a classic pcap file (nanosecond
timestamps, Ethernet link type) that tshark, Wireshark and "rocectl pcap"
read. FILE - writes to standard output. It stops after COUNT frames, after
D, or on SIGINT/SIGTERM, then reports the counts on standard error.

The capture uses an AF_PACKET socket with a classic BPF filter (IPv4 or
IPv6, UDP, destination port 4791, no IPv4 fragments), so it needs
CAP_NET_RAW but not the device: it works while another process runs one.
802.1Q tags the kernel has stripped are put back from PACKET_AUXDATA.
AF_PACKET sees the kernel's traffic, not frames that bypass the stack:
frames the XDP steering program redirects to an AF_XDP socket, and frames
an AF_XDP socket sends, are invisible here. To see those, capture at the
other end of the wire, or use the device's own capture tap
(roce.Options.Capture). Frames of a device on the kernel UDP link, of rxe,
and of a device with no steering program are all seen. As with tcpdump,
frames this host sends may carry a UDP checksum the kernel left to the NIC
to fill in; the ICRC does not cover it.

flags:`

// runCapture writes the interface's RoCEv2 frames to a pcap file.
// Equivalent to: `tcpdump -i $iface -w $file [-c $count] udp dst port 4791`.
func runCapture(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("capture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ifname := fs.String("d", "", "network `interface` (required)")
	file := fs.String("w", "", "pcap `file` to write, - for standard output (required)")
	count := fs.Int("c", 0, "stop after this many `frames` (0: no limit)")
	duration := fs.Duration("duration", 0, "stop after this `duration` (0: no limit)")
	port := fs.Uint("port", uint(ib.RoCEv2Port), "UDP destination `port`")
	snaplen := fs.Int("s", 65535, "snapshot length: `bytes` kept of each frame")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), captureUsage)
		fs.PrintDefaults()
	}
	if err := cliflag.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 || *ifname == "" || *file == "" || *count < 0 || *duration < 0 ||
		*port == 0 || *port > 65535 || *snaplen < 64 || *snaplen > 262144 {
		fs.Usage()
		return 2
	}
	ifi, err := net.InterfaceByName(*ifname)
	if err != nil {
		fmt.Fprintf(stderr, "rocectl capture: %v\n", err)
		return 1
	}
	c, err := openCapture(ifi.Index, uint16(*port))
	if err != nil {
		fmt.Fprintf(stderr, "rocectl capture: %s: %v\n", *ifname, err)
		return 1
	}
	defer c.Close()

	var out io.Writer = stdout
	var f *os.File
	if *file != "-" {
		if f, err = os.Create(*file); err != nil {
			fmt.Fprintf(stderr, "rocectl capture: %v\n", err)
			return 1
		}
		out = f
	}
	bw := bufio.NewWriterSize(out, 1<<16)
	pw := pcapgo.NewWriterNanos(bw)
	if err := pw.WriteFileHeader(uint32(*snaplen), layers.LinkTypeEthernet); err != nil {
		fmt.Fprintf(stderr, "rocectl capture: %v\n", err)
		return 1
	}
	// A pipe reader (tshark -r -) should see frames as they come.
	flushEach := f == nil

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	fmt.Fprintf(stderr, "rocectl capture: listening on %s, udp dst port %d, writing %s\n", *ifname, *port, *file)
	if info, err := bpf.Attached(ifi.Index); err == nil && info.Attached && info.Name == devstat.ProgramName {
		fmt.Fprintf(stderr, "rocectl capture: warning: %s runs goroce's steering program (id %d): frames it redirects to an AF_XDP socket, and frames sent from one, are not seen here\n", *ifname, info.ProgramID)
	}

	n, werr := c.Run(ctx, *count, func(frame []byte, origLen int, ts time.Time) error {
		if len(frame) > *snaplen {
			frame = frame[:*snaplen]
		}
		ci := gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: origLen}
		if err := pw.WritePacket(ci, frame); err != nil {
			return err
		}
		if flushEach {
			return bw.Flush()
		}
		return nil
	})
	if err := bw.Flush(); err != nil && werr == nil {
		werr = err
	}
	if f != nil {
		if err := f.Close(); err != nil && werr == nil {
			werr = err
		}
	}
	st, _ := c.Stats()
	fmt.Fprintf(stderr, "%d frames captured\n%d frames received by filter\n%d frames dropped by kernel\n", n, st.Packets, st.Drops)
	if werr != nil {
		fmt.Fprintf(stderr, "rocectl capture: %v\n", werr)
		return 1
	}
	return 0
}

// roceFilter is the classic BPF program "udp dst port PORT" over untagged
// Ethernet (the kernel strips 802.1Q tags before packet sockets see the
// frame): IPv4 without fragments (any header length) or IPv6 with UDP as
// the first next header.
func roceFilter(port uint16) []unix.SockFilter {
	const (
		ldh    = unix.BPF_LD | unix.BPF_H | unix.BPF_ABS
		ldb    = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
		ldhInd = unix.BPF_LD | unix.BPF_H | unix.BPF_IND
		ldxMSH = unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH
		jeq    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jset   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret    = unix.BPF_RET | unix.BPF_K
	)
	p := uint32(port)
	// Jump offsets count instructions after the jump; 14 accepts, 15 drops.
	return []unix.SockFilter{
		/* 0 */ {Code: ldh, K: 12}, // EtherType
		/* 1 */ {Code: jeq, K: unix.ETH_P_IP, Jt: 0, Jf: 7}, // IPv4, else 9
		/* 2 */ {Code: ldb, K: 14 + 9}, // IPv4 protocol
		/* 3 */ {Code: jeq, K: unix.IPPROTO_UDP, Jt: 0, Jf: 11},
		/* 4 */ {Code: ldh, K: 14 + 6}, // flags and fragment offset
		/* 5 */ {Code: jset, K: 0x1FFF, Jt: 9, Jf: 0}, // a later fragment has no UDP header
		/* 6 */ {Code: ldxMSH, K: 14}, // X = IHL*4
		/* 7 */ {Code: ldhInd, K: 14 + 2}, // UDP destination port
		/* 8 */ {Code: jeq, K: p, Jt: 5, Jf: 6},
		/* 9 */ {Code: jeq, K: unix.ETH_P_IPV6, Jt: 0, Jf: 5},
		/* 10 */ {Code: ldb, K: 14 + 6}, // IPv6 next header
		/* 11 */ {Code: jeq, K: unix.IPPROTO_UDP, Jt: 0, Jf: 3},
		/* 12 */ {Code: ldh, K: 14 + 40 + 2}, // UDP destination port
		/* 13 */ {Code: jeq, K: p, Jt: 0, Jf: 1},
		/* 14 */ {Code: ret, K: 262144},
		/* 15 */ {Code: ret, K: 0},
	}
}

// packetCapture is a filtered AF_PACKET socket bound to one interface.
type packetCapture struct {
	f  *os.File
	rc syscall.RawConn

	// recvmsg state, kept here so that a read allocates nothing.
	iov    unix.Iovec
	msg    unix.Msghdr
	oobCap int
	rn     int
	rerr   error
	recvFn func(fd uintptr) bool
}

func newPacketCapture(f *os.File) (*packetCapture, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &packetCapture{f: f, rc: rc}
	c.recvFn = c.recv
	return c, nil
}

// recv is one recvmsg(MSG_TRUNC) attempt; it returns false to wait for the
// socket to become readable.
func (c *packetCapture) recv(fd uintptr) bool {
	c.msg.SetControllen(c.oobCap)
	r, _, e := unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&c.msg)), unix.MSG_TRUNC)
	c.rn, c.rerr = int(r), nil
	if e != 0 {
		c.rerr = e
	}
	return e != unix.EAGAIN
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// openCapture opens the socket. It is created with protocol 0, which
// receives nothing, and bound to ETH_P_ALL only once the filter is in
// place, so no unfiltered frame slips in between.
func openCapture(ifindex int, port uint16) (*packetCapture, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("AF_PACKET socket: %w (needs CAP_NET_RAW)", err)
		}
		return nil, fmt.Errorf("AF_PACKET socket: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	filter := roceFilter(port)
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		return nil, fmt.Errorf("attach filter: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
		return nil, fmt.Errorf("PACKET_AUXDATA: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return nil, fmt.Errorf("SO_TIMESTAMPNS: %w", err)
	}
	// A large buffer rides out bursts while the writer is busy.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}); err != nil {
		return nil, fmt.Errorf("bind: %w", err)
	}
	f := os.NewFile(uintptr(fd), "packet")
	ok = true // f owns fd now
	c, err := newPacketCapture(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

func (c *packetCapture) Close() error { return c.f.Close() }

// Stats returns the kernel's counts since the last call (PACKET_STATISTICS
// resets them): frames that passed the filter, and those dropped for lack
// of buffer space.
func (c *packetCapture) Stats() (unix.TpacketStats, error) {
	var st *unix.TpacketStats
	var serr error
	if err := c.rc.Control(func(fd uintptr) {
		st, serr = unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS)
	}); err != nil {
		return unix.TpacketStats{}, err
	}
	if serr != nil {
		return unix.TpacketStats{}, serr
	}
	return *st, nil
}

// Run hands each captured frame to fn until ctx ends or count frames (0:
// no limit) were handed, and returns how many were. frame is valid only
// during fn; origLen is the frame's length on the wire.
func (c *packetCapture) Run(ctx context.Context, count int, fn func(frame []byte, origLen int, ts time.Time) error) (int, error) {
	// The deadline wakes a blocked read when ctx ends.
	stop := context.AfterFunc(ctx, func() { _ = c.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, 4+262144)
	oob := make([]byte, 256)
	n := 0
	for count == 0 || n < count {
		// The first 4 bytes are room to put back a stripped VLAN tag.
		frame, origLen, ts, err := c.read(buf, oob)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
				return n, nil
			}
			return n, err
		}
		if frame == nil {
			continue
		}
		if err := fn(frame, origLen, ts); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// read receives one frame into buf[4:] and returns it (VLAN tag restored)
// with its original length and kernel timestamp. It allocates nothing.
func (c *packetCapture) read(buf, oob []byte) ([]byte, int, time.Time, error) {
	c.iov = unix.Iovec{Base: &buf[4]}
	c.iov.SetLen(len(buf) - 4)
	c.msg = unix.Msghdr{Iov: &c.iov, Iovlen: 1, Control: &oob[0]}
	c.oobCap = len(oob)
	if err := c.rc.Read(c.recvFn); err != nil {
		return nil, 0, time.Time{}, err
	}
	if c.rerr != nil {
		return nil, 0, time.Time{}, c.rerr
	}
	n, oobn := c.rn, int(c.msg.Controllen)
	if oobn > len(oob) {
		oobn = len(oob)
	}
	frame, origLen, ts := decodeRecv(buf, n, oob[:oobn])
	if ts.IsZero() {
		ts = time.Now()
	}
	return frame, origLen, ts, nil
}

// Offsets in struct tpacket_auxdata.
const (
	auxStatus   = 0
	auxVLANTCI  = 16
	auxVLANTPID = 18
	auxSize     = 20
)

// decodeRecv turns what recvmsg(MSG_TRUNC) returned into a frame: n is the
// frame's length on the wire (it may exceed the buffer), which holds the
// frame from buf[4:]; oob holds the control messages. An 802.1Q tag the
// kernel moved into PACKET_AUXDATA is written back after the MAC
// addresses, using the 4 bytes of room before the frame. ts is zero when
// there is no SCM_TIMESTAMPNS.
func decodeRecv(buf []byte, n int, oob []byte) (frame []byte, origLen int, ts time.Time) {
	if len(buf) < 4 || n < 0 {
		return nil, 0, time.Time{}
	}
	origLen = n
	if n > len(buf)-4 {
		n = len(buf) - 4
	}
	var status uint32
	var tci, tpid uint16
	walkCmsgs(oob, func(level, typ int32, data []byte) {
		switch {
		case level == unix.SOL_SOCKET && typ == unix.SCM_TIMESTAMPNS && len(data) >= 16:
			sec := int64(binary.NativeEndian.Uint64(data))
			nsec := int64(binary.NativeEndian.Uint64(data[8:]))
			ts = time.Unix(sec, nsec)
		case level == unix.SOL_PACKET && typ == unix.PACKET_AUXDATA && len(data) >= auxSize:
			status = binary.NativeEndian.Uint32(data[auxStatus:])
			tci = binary.NativeEndian.Uint16(data[auxVLANTCI:])
			tpid = binary.NativeEndian.Uint16(data[auxVLANTPID:])
		}
	})
	frame = buf[4 : 4+n]
	if status&unix.TP_STATUS_VLAN_VALID != 0 && n >= 12 {
		if status&unix.TP_STATUS_VLAN_TPID_VALID == 0 || tpid == 0 {
			tpid = unix.ETH_P_8021Q
		}
		// Shift the MACs left by 4 and write the tag after them.
		copy(buf[0:12], buf[4:16])
		binary.BigEndian.PutUint16(buf[12:], tpid)
		binary.BigEndian.PutUint16(buf[14:], tci)
		frame = buf[:4+n]
		origLen += 4
	}
	return frame, origLen, ts
}

// cmsgHdrLen is sizeof(struct cmsghdr) on 64-bit Linux: a size_t length
// and two ints.
const cmsgHdrLen = 16

// walkCmsgs calls fn for each well-formed control message in oob, without
// allocating; a malformed length ends the walk.
func walkCmsgs(oob []byte, fn func(level, typ int32, data []byte)) {
	for len(oob) >= cmsgHdrLen {
		l := binary.NativeEndian.Uint64(oob)
		if l < cmsgHdrLen || l > uint64(len(oob)) {
			return
		}
		fn(int32(binary.NativeEndian.Uint32(oob[8:])), int32(binary.NativeEndian.Uint32(oob[12:])), oob[cmsgHdrLen:l])
		next := (l + 7) &^ 7 // CMSG_ALIGN
		if next >= uint64(len(oob)) {
			return
		}
		oob = oob[next:]
	}
}
