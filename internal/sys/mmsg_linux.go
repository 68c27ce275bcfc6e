package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sendmmsg sends the messages in msgs with one system call and returns
// how many were sent. Like sendmmsg(2), an error is only returned when the
// first message could not be sent; a later failure shows as a short count.
func Sendmmsg(fd int, msgs []unix.Mmsghdr, flags int) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd),
		uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Recvmmsg receives up to len(msgs) datagrams with one system call and
// returns how many; each message's Len holds its datagram size. With a
// non-blocking socket it returns unix.EAGAIN when nothing is queued.
func Recvmmsg(fd int, msgs []unix.Mmsghdr, flags int) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd),
		uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Cmsg is one control message found by NextCmsg.
type Cmsg struct {
	Level, Type int32
	Data        []byte
}

// NextCmsg returns the first control message in b and the rest of b after
// it; ok is false when b holds no complete message. Unlike
// unix.ParseSocketControlMessage it does not allocate.
func NextCmsg(b []byte) (c Cmsg, rest []byte, ok bool) {
	if len(b) < unix.SizeofCmsghdr {
		return c, nil, false
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	l := int(h.Len)
	if l < unix.SizeofCmsghdr || l > len(b) {
		return c, nil, false
	}
	c = Cmsg{Level: h.Level, Type: h.Type, Data: b[unix.CmsgLen(0):l]}
	next := unix.CmsgSpace(l - unix.CmsgLen(0))
	if next > len(b) {
		next = len(b)
	}
	return c, b[next:], true
}

// PutCmsg writes a control message with the given level, type and data
// size at the start of b and returns its data area and the space it takes
// (aligned). b must have room for unix.CmsgSpace(size) bytes.
func PutCmsg(b []byte, level, typ int32, size int) (data []byte, space int) {
	space = unix.CmsgSpace(size)
	_ = b[space-1]
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = level
	h.Type = typ
	h.SetLen(unix.CmsgLen(size))
	clear(b[unix.CmsgLen(0):space])
	return b[unix.CmsgLen(0) : unix.CmsgLen(0)+size], space
}
