package udplink

import (
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goroce/goroce/internal/sys"
	"github.com/goroce/goroce/link"
)

// ECN field values (RFC 3168) in the low two bits of the TOS.
const (
	ecnECT0 = 2
	ecnCE   = 3
)

// tosSocket opens a plain UDP socket on addr that reports the TOS or
// traffic class of what it receives.
func tosSocket(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), 0)))
	if err != nil {
		t.Skipf("no UDP socket on %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	rc, _ := c.SyscallConn()
	var serr error
	rc.Control(func(fd uintptr) {
		if netip.MustParseAddr(addr).Is4() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
		}
	})
	if serr != nil {
		t.Fatal(serr)
	}
	return c
}

// readTOS reads one datagram from c and returns its payload and TOS.
func readTOS(t *testing.T, c *net.UDPConn) ([]byte, uint8) {
	t.Helper()
	buf, oob := make([]byte, 9000), make([]byte, 128)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, oobn, _, _, err := c.ReadMsgUDP(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) >= 1:
			return buf[:n], m.Data[0]
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_TCLASS && len(m.Data) >= 4:
			return buf[:n], uint8(*(*int32)(unsafe.Pointer(&m.Data[0])))
		}
	}
	t.Fatal("no TOS control message")
	return nil, 0
}

// TestDefaultTOS: with the socket's TOS set to ECT(0), as a device with
// congestion control on sets it, frames carrying ECT(0) leave with it and
// without a control message of their own, and frames with another TOS (a
// CNP's 0, a DSCP) still leave with theirs, alone and in GSO runs.
func TestDefaultTOS(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			a := listen(t, addr)
			r := tosSocket(t, addr)
			dst := netip.MustParseAddrPort(r.LocalAddr().String())
			if err := a.SetDefaultTOS(ecnECT0); err != nil {
				t.Fatal(err)
			}
			send := func(tos uint8, sizes ...int) {
				t.Helper()
				var fs [][]byte
				for i, s := range sizes {
					fs = append(fs, mkframe(a.LocalAddr(), dst, tos, payload(i, s)))
				}
				if _, err := a.WriteBatch(fs); err != nil {
					t.Fatal(err)
				}
				for i, s := range sizes {
					p, got := readTOS(t, r)
					if len(p) != s || got != tos {
						t.Fatalf("datagram %d of TOS %#x: %d bytes, TOS %#x", i, tos, len(p), got)
					}
				}
			}
			send(ecnECT0, 100)
			if n := a.senders[0].wmsgs[0].Hdr.Controllen; n != 0 {
				t.Errorf("a frame with the socket's TOS went with %d bytes of control messages", n)
			}
			send(0, 100)
			send(26<<2|ecnECT0, 100)
			send(ecnECT0, 1000, 1000, 1000, 500) // one GSO run
			send(0, 1000, 1000, 1000)
			if a.off.gso.Load() && a.Stats().GSOSends < 2 {
				t.Errorf("stats %+v: the runs did not go as runs", a.Stats())
			}
		})
	}
}

// TestCEReceived: a datagram marked CE on the way (here by a plain socket
// sending with TOS CE) reaches the device's frame with CE in its
// synthesized IP header, as an AF_XDP frame carries it; the datagrams
// around it keep theirs.
func TestCEReceived(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		t.Run(addr, func(t *testing.T) {
			l := listen(t, addr)
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(addr), 0)))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			from := netip.MustParseAddrPort(c.LocalAddr().String())
			to := net.UDPAddrFromAddrPort(l.LocalAddr())
			tos := []uint8{ecnECT0, ecnCE, ecnECT0, 0, ecnCE}
			for i, v := range tos {
				level, typ := unix.IPPROTO_IP, unix.IP_TOS
				if !netip.MustParseAddr(addr).Is4() {
					level, typ = unix.IPPROTO_IPV6, unix.IPV6_TCLASS
				}
				oob := make([]byte, 64)
				d, n := sys.PutCmsg(oob, int32(level), int32(typ), 4)
				*(*int32)(unsafe.Pointer(&d[0])) = int32(v)
				oob = oob[:n]
				if _, _, err := c.WriteMsgUDP(payload(i, 200), oob, to); err != nil {
					t.Fatal(err)
				}
			}
			got := collect(t, l, from, len(tos), 10*time.Second)
			for i, f := range got {
				pf, _ := link.ParseFrame(f)
				if pf.TOS != tos[i] {
					t.Errorf("datagram %d: TOS %#x, want %#x", i, pf.TOS, tos[i])
				}
			}
		})
	}
}
