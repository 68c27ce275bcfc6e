package sys

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestMmsgPair(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])

	if _, err := Recvmmsg(fds[1], make([]unix.Mmsghdr, 4), 0); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("empty socket: %v", err)
	}
	payloads := [][]byte{[]byte("one"), []byte("two!"), []byte("three")}
	msgs := make([]unix.Mmsghdr, len(payloads))
	iovs := make([]unix.Iovec, len(payloads))
	for i, p := range payloads {
		iovs[i].Base = &p[0]
		iovs[i].SetLen(len(p))
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	if n, err := Sendmmsg(fds[0], msgs, 0); n != 3 || err != nil {
		t.Fatalf("Sendmmsg = %d, %v", n, err)
	}
	bufs := make([][]byte, 4)
	rmsgs := make([]unix.Mmsghdr, 4)
	riovs := make([]unix.Iovec, 4)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
		riovs[i].Base = &bufs[i][0]
		riovs[i].SetLen(64)
		rmsgs[i].Hdr.Iov = &riovs[i]
		rmsgs[i].Hdr.SetIovlen(1)
	}
	n, err := Recvmmsg(fds[1], rmsgs, 0)
	if n != 3 || err != nil {
		t.Fatalf("Recvmmsg = %d, %v", n, err)
	}
	for i := 0; i < n; i++ {
		if got := string(bufs[i][:rmsgs[i].Len]); got != string(payloads[i]) {
			t.Errorf("message %d = %q", i, got)
		}
	}
	if n, err := Sendmmsg(-1, msgs, 0); n != 0 || !errors.Is(err, unix.EBADF) {
		t.Fatalf("bad fd: %d, %v", n, err)
	}
}

func TestCmsgRoundTrip(t *testing.T) {
	b := make([]byte, 128)
	d, sp1 := PutCmsg(b, unix.IPPROTO_IP, unix.IP_PKTINFO, unix.SizeofInet4Pktinfo)
	copy(d, "abcdefghijkl")
	d, sp2 := PutCmsg(b[sp1:], unix.IPPROTO_IP, unix.IP_TOS, 1)
	d[0] = 0x03
	rest := b[:sp1+sp2]
	c, rest, ok := NextCmsg(rest)
	if !ok || c.Level != unix.IPPROTO_IP || c.Type != unix.IP_PKTINFO || string(c.Data) != "abcdefghijkl" {
		t.Fatalf("first: %+v %v", c, ok)
	}
	c, rest, ok = NextCmsg(rest)
	if !ok || c.Type != unix.IP_TOS || len(c.Data) != 1 || c.Data[0] != 3 {
		t.Fatalf("second: %+v %v", c, ok)
	}
	if _, _, ok := NextCmsg(rest); ok {
		t.Fatal("third message in empty buffer")
	}
	// The kernel's own parser must agree with our layout.
	msgs, err := unix.ParseSocketControlMessage(b[:sp1+sp2])
	if err != nil || len(msgs) != 2 || msgs[1].Data[0] != 3 {
		t.Fatalf("unix.ParseSocketControlMessage: %v %v", msgs, err)
	}
}

func FuzzNextCmsg(f *testing.F) {
	b := make([]byte, 64)
	_, sp := PutCmsg(b, 1, 2, 5)
	f.Add(b[:sp])
	f.Add([]byte{})
	f.Add(make([]byte, unix.SizeofCmsghdr))
	f.Fuzz(func(t *testing.T, b []byte) {
		// Copy into aligned memory, as the kernel's buffers are.
		buf := make([]uint64, (len(b)+7)/8)
		a := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)*8)[:len(b)]
		copy(a, b)
		for i := 0; i < 100; i++ {
			c, rest, ok := NextCmsg(a)
			if !ok {
				return
			}
			if len(rest) >= len(a) {
				t.Fatal("no progress")
			}
			_ = c
			a = rest
		}
	})
}
